"""An editing reward: how close a sample stays to its condition (source) image.

Editing families (FLUX.1-Kontext, :mod:`vgrpo.models.flux_kontext`) sample an edit of the source image a prompt row
names under :data:`vgrpo.prompts.CONDITION_IMAGE_KEY`; the rewards receive the same rows, so a reward can compare.
:class:`SourceSimilarityReward` is the simplest such comparison, Flow-GRPO's ``image_similarity`` idea (its Kontext
counting-edit recipe weighs one against GenEval) in its plainest form: the negative mean absolute pixel difference.
Paired with a reward for the edit itself it keeps the rest of the image; alone, its maximum is the unedited source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from vgrpo.prompts import CONDITION_IMAGE_KEY
from vgrpo.rewards.base import Metadata, Reward, RewardOutput

__all__ = ["SourceSimilarityReward", "source_pixels"]


@lru_cache(maxsize=256)
def source_pixels(path: str, height: int, width: int) -> np.ndarray:
    """The RGB image at ``path`` resized (bicubic, PIL's default) to ``height x width``: ``uint8 (H, W, 3)``."""
    from PIL import Image

    with Image.open(path) as image:
        resized = image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(resized, dtype=np.uint8)


class SourceSimilarityReward(Reward):
    """``-mean |x - s|`` over pixels and channels, in [0, 1] units: ``x`` the sample, ``s`` its row's source image
    resized to the sample's size. 0 for the source itself, -1 at most; it applies to rows that name a source image
    (a prompt file for it must name one in every row)."""

    name: ClassVar[str] = "source_similarity"
    needs_metadata: ClassVar[bool] = True

    @classmethod
    def check_prompts(cls, rows: Sequence[Metadata], path: str | Path, options: Mapping[str, Any]) -> list[str]:
        missing = [i for i, r in enumerate(rows, 1) if CONDITION_IMAGE_KEY not in r]
        if not missing:
            return []
        return [
            f"{path}: {len(missing)} rows name no source image ({CONDITION_IMAGE_KEY!r}), the first row {missing[0]}"
        ]

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        return metadata is not None and CONDITION_IMAGE_KEY in metadata

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        assert metadata is not None  # checked by Reward.__call__
        _, h, w, _ = images.shape
        sources = np.stack([source_pixels(str(md[CONDITION_IMAGE_KEY]), h, w) for md in metadata])
        diff = np.abs(images.astype(np.float64) - sources.astype(np.float64)) / 255.0
        return RewardOutput(scores=-diff.mean(axis=(1, 2, 3)))
