"""Rewards a user writes in their own module, named in params as ``tests.rewards.custom:Brightness`` or
``tests.rewards.custom:redness``: nothing in vgrpo is changed or registered."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vgrpo.rewards.base import Metadata, Reward, RewardOutput

DEFAULT_GAIN = 1.0
"""A module attribute that is not a reward."""


class Brightness(Reward):
    """Mean pixel value in [0, 1], times ``gain``."""

    name = "brightness"

    def __init__(self, gain: float = DEFAULT_GAIN):
        self.gain = gain

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        return RewardOutput(scores=self.gain * images.reshape(len(images), -1).mean(axis=1) / 255.0)


def redness(images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None, channel: int = 0):
    """Share of one colour channel in each image (a plain function, as trl's ``reward_funcs``)."""
    totals = images.reshape(len(images), -1, 3).sum(axis=1).astype(np.float64) + 1e-9
    return totals[:, channel] / totals.sum(axis=1)


class NotAReward:
    """A class that does not implement the Reward interface."""
