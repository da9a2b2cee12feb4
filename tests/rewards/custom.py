"""Rewards a user writes in their own module, named in params as ``tests.rewards.custom:Brightness``,
``tests.rewards.custom:redness``, ``tests.rewards.custom:Exposure`` or ``tests.rewards.custom:TaggedBrightness``:
nothing in vgrpo is changed or registered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.rewards.base import HeadlineColumn, Metadata, Reward, RewardOutput

DEFAULT_GAIN = 1.0
"""A module attribute that is not a reward."""


class Brightness(Reward):
    """Mean pixel value in [0, 1], times ``gain``."""

    name = "brightness"

    def __init__(self, gain: float = DEFAULT_GAIN):
        self.gain = gain

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        return RewardOutput(scores=self.gain * images.reshape(len(images), -1).mean(axis=1) / 255.0)


class TaggedBrightness(Brightness):
    """:class:`Brightness` on the prompts whose row's ``tag`` is one of ``tags`` only: one task's reward in a stage
    whose batches mix tasks."""

    name = "tagged_brightness"
    needs_metadata = True

    def __init__(self, tags: Sequence[str], gain: float = DEFAULT_GAIN):
        super().__init__(gain)
        self.tags = set(tags)

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        return metadata is not None and metadata.get("tag") in self.tags


def redness(images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None, channel: int = 0):
    """Share of one colour channel in each image (a plain function, as trl's ``reward_funcs``)."""
    totals = images.reshape(len(images), -1, 3).sum(axis=1).astype(np.float64) + 1e-9
    return totals[:, channel] / totals.sum(axis=1)


def _is_target(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1


class Exposure(Reward):
    """A verifiable reward of the user's own: how close an image's mean brightness comes to its prompt row's
    ``target`` (in [0, 1]); ``hit`` when within ``tolerance``. Its class checks the prompt rows before any compute
    and names its headline numbers."""

    name = "exposure"
    needs_metadata = True
    credit_sub_scores = ("hit",)

    def __init__(self, tolerance: float = 0.1):
        self.tolerance = tolerance

    @classmethod
    def check_prompts(cls, rows: Sequence[Metadata], path: str | Path, options: Mapping[str, Any]) -> list[str]:
        bad = [i for i, row in enumerate(rows, 1) if not _is_target(row.get("target"))]
        return [f"{path}: rows {bad[:5]} have no 'target' brightness in [0, 1] (exposure)"] if bad else []

    @classmethod
    def headline_columns(cls, key: str, options: Mapping[str, Any]) -> tuple[HeadlineColumn, ...]:
        return (
            HeadlineColumn("exposure", f"eval/{key}"),
            HeadlineColumn("exposure_hits", f"eval/{key}_hit"),
            HeadlineColumn("exposure_gain", f"eval/{key}_gain", gain=True),
        )

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        assert metadata is not None  # needs_metadata: Reward.__call__ checked it
        brightness = images.reshape(len(images), -1).mean(axis=1) / 255.0
        error = np.abs(brightness - np.array([float(md["target"]) for md in metadata]))
        return RewardOutput(scores=1 - error, sub_scores={"hit": (error <= self.tolerance).astype(np.float64)})


class NotAReward:
    """A class that does not implement the Reward interface."""


def trl_redness(completions: list[np.ndarray], prompts: list[str], **kwargs: Any) -> list[float]:
    """trl's ``reward_funcs`` signature: the images as ``completions``, a list of scores back."""
    assert len(completions) == len(prompts) and "metadata" in kwargs
    return [float(redness(image[None], prompts[:1], None)[0]) for image in completions]


def flow_grpo_redness(images: np.ndarray, prompts: Sequence[str], metadata: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """flow_grpo's reward signature: ``(scores, metadata)``."""
    return redness(images, prompts, metadata), {}


def one_image_reward(image: np.ndarray) -> float:
    """A function no reward caller can call: one argument, neither ``completions`` nor three positionals."""
    return float(image.mean())


class HalfReward(Reward):
    """A Reward subclass that forgot ``score``: abstract, cannot be built."""

    name = "half"


def trl_prompts_first(prompts: list[str], completions: list[np.ndarray], **kwargs: Any) -> list[float]:
    """trl's ``reward_funcs`` signature with the prompts first, reading a prompt-row column (``tag``) as trl passes
    a dataset column: a list over the samples, by keyword."""
    assert len(completions) == len(prompts) == len(kwargs["tag"])
    return [float(redness(image[None], prompts[:1], None)[0]) for image in completions]
