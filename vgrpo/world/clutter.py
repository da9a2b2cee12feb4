"""Clutter: images with more objects than their prompt names, found by the world's own detector.

GenEval's verdict (like the official one) checks that the named objects are there, not that nothing else is, so a
policy can answer "a photo of a square" with a square and other shapes and lose nothing (docs/embedded.md: stage 2
and the OCR stage did). On the prompts that name one object (``single_object``, ``colors``), this counts the images
in which the detector (:func:`vgrpo.world.detect.detect`) finds more objects, of any shape and colour, than the
prompt's include clauses name (:func:`vgrpo.rewards.clauses.extra_objects`, the count that GenEval's
``extra_object_penalty`` trains against). :class:`ClutterReward` is that count as an evaluation column (1.0:
cluttered), so an evaluation's mean is the share of cluttered images; it measures, it is not meant to be trained on.

    evaluation: {rewards: [{name: "vgrpo.world.clutter:ClutterReward", key: clutter}]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from vgrpo.rewards.base import Metadata, Reward, RewardOutput
from vgrpo.rewards.clauses import extra_objects, named_objects
from vgrpo.world.detect import detect

__all__ = ["CLUTTER_TAGS", "ClutterReward", "is_cluttered", "named_objects"]

CLUTTER_TAGS: tuple[str, ...] = ("single_object", "colors")
"""The tags whose prompts name one object: any second object the detector finds is clutter."""


def is_cluttered(image: np.ndarray, metadata: Mapping[str, Any]) -> bool:
    """Whether the detector finds more objects in ``image`` (uint8 ``(H, W, 3)``) than ``metadata`` names."""
    return extra_objects(metadata, detect(image)) > 0


class ClutterReward(Reward):
    """1.0 for an image of a :data:`CLUTTER_TAGS` prompt with more objects than the prompt names, else 0.0; its
    evaluation mean is the share of cluttered images (lower is better)."""

    name: ClassVar[str] = "clutter"
    needs_metadata: ClassVar[bool] = True

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        return metadata is not None and metadata.get("tag") in CLUTTER_TAGS

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        assert metadata is not None  # checked by Reward.__call__
        found = [detect(image) for image in images]
        extra = np.array([extra_objects(md, objects) for md, objects in zip(metadata, found, strict=True)])
        objects = np.array([float(len(objects)) for objects in found])
        return RewardOutput(scores=(extra > 0).astype(np.float64), sub_scores={"objects": objects})
