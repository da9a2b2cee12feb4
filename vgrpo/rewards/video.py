"""The simplest video reward: an image reward run on every frame of every video, averaged per video.

Rewards score uint8 images ``(N, H, W, 3)`` (:mod:`vgrpo.rewards.base`). A video family's samples
(:mod:`vgrpo.models.wan`) are ``N`` videos of ``T`` frames, ``uint8 (N, T, H, W, 3)``
(:func:`vgrpo.models.wan.video_frames`); :class:`PerFrameMean` scores them once, in one call of the image reward on
all ``N * T`` frames (each frame with its video's prompt and metadata row), and returns each video's mean over its
frames: its score and every sub-score.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vgrpo.rewards.base import Metadata, RewardOutput

__all__ = ["PerFrameMean", "check_videos"]

ImageReward = Callable[[np.ndarray, Sequence[str], Sequence[Metadata] | None], RewardOutput]
"""An image reward's call: ``(uint8 (N, H, W, 3), N prompts, N metadata rows or None) -> RewardOutput``."""


def check_videos(videos: Any) -> np.ndarray:
    """``videos`` as a ``uint8 (N, T, H, W, 3)`` array, or a ``ValueError`` saying what was received."""
    arr = np.asarray(videos)
    if arr.dtype != np.uint8 or arr.ndim != 5 or arr.shape[-1] != 3:
        raise ValueError(f"video rewards take uint8 RGB videos of shape (N, T, H, W, 3), got {arr.dtype} {arr.shape}")
    return arr


class PerFrameMean:
    """A video reward from an image reward (a :class:`vgrpo.rewards.base.Reward`, or any callable of its
    signature): a video's score is the mean of its frames' scores (module docstring).

    Args:
        reward: the image reward.
    """

    def __init__(self, reward: ImageReward):
        self.reward = reward

    @property
    def needs_metadata(self) -> bool:
        return bool(getattr(self.reward, "needs_metadata", False))

    def __call__(self, videos: Any, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        """Per-video mean scores of ``videos`` (``uint8 (N, T, H, W, 3)``) against ``prompts`` (``N``)."""
        arr = check_videos(videos)
        n, frames = arr.shape[:2]
        if len(prompts) != n or (metadata is not None and len(metadata) != n):
            raise ValueError(
                f"{n} videos but {len(prompts)} prompts and {'no' if metadata is None else len(metadata)} metadata rows"
            )
        flat_prompts = [p for p in prompts for _ in range(frames)]
        flat_meta = None if metadata is None else [m for m in metadata for _ in range(frames)]
        out = self.reward(arr.reshape(n * frames, *arr.shape[2:]), flat_prompts, flat_meta)

        def mean(values: Any) -> np.ndarray:
            return np.asarray(values, dtype=np.float64).reshape(n, frames).mean(axis=1)

        return RewardOutput(scores=mean(out.scores), sub_scores={k: mean(v) for k, v in out.sub_scores.items()})
