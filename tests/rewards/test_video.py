"""The per-frame video reward (vgrpo/rewards/video.py): an image reward run once on all N * T frames, each frame with
its video's prompt and metadata, averaged per video (scores and sub-scores), with numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from vgrpo.rewards.base import Reward, RewardOutput
from vgrpo.rewards.video import PerFrameMean


class _Brightness(Reward):
    """Mean pixel / 255, and a sub-score: the prompt's length times the frame's red channel's first pixel."""

    name = "brightness"
    needs_metadata = True

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[str], list[Any]]] = []

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Any) -> RewardOutput:
        self.calls.append((images.shape[0], list(prompts), list(metadata)))
        return RewardOutput(
            scores=images.reshape(images.shape[0], -1).mean(axis=1) / 255.0,
            sub_scores={"red": np.array([len(p) * float(im[0, 0, 0]) for p, im in zip(prompts, images, strict=True)])},
        )


def test_a_video_scores_the_mean_of_its_frames_scores() -> None:
    videos = np.zeros((2, 3, 2, 2, 3), np.uint8)
    videos[0, :, :, :, :] = np.array([0, 51, 255], np.uint8)[:, None, None, None]  # frame brightness 0, .2, 1
    videos[1, 1] = 102  # one frame at .4, two black
    reward = _Brightness()
    out = PerFrameMean(reward)(videos, ["ab", "abcd"], [{"k": 0}, {"k": 1}])
    np.testing.assert_allclose(out.scores, [(0 + 0.2 + 1.0) / 3, 0.4 / 3])
    np.testing.assert_allclose(out.sub_scores["red"], [2 * (0 + 51 + 255) / 3, 4 * 102 / 3])
    # One call on all six frames, each with its video's prompt and metadata row.
    assert reward.calls == [(6, ["ab"] * 3 + ["abcd"] * 3, [{"k": 0}] * 3 + [{"k": 1}] * 3)]
    assert PerFrameMean(reward).needs_metadata


def test_the_video_reward_refuses_images_and_mismatched_prompts() -> None:
    reward = PerFrameMean(_Brightness())
    with pytest.raises(ValueError, match=r"uint8 RGB videos of shape \(N, T, H, W, 3\)"):
        reward(np.zeros((2, 4, 4, 3), np.uint8), ["a", "b"])
    with pytest.raises(ValueError, match="2 videos but 1 prompts"):
        reward(np.zeros((2, 3, 4, 4, 3), np.uint8), ["a"])


def test_a_reward_set_scores_videos_per_frame_averaged_per_video() -> None:
    from vgrpo.rewards.multi import MultiReward, RewardTerm

    videos = np.zeros((2, 3, 2, 2, 3), np.uint8)
    videos[0] = np.array([0, 51, 255], np.uint8)[:, None, None, None]
    videos[1, 1] = 102
    rewards = MultiReward({"bright": RewardTerm(_Brightness(), offset=0.1, scale=2.0)})
    out = rewards(videos, ["ab", "abcd"], [{"k": 0}, {"k": 1}])
    np.testing.assert_allclose(out.raw["bright"], [1.2 / 3, 0.4 / 3])
    np.testing.assert_allclose(out.scores["bright"], (np.array([1.2 / 3, 0.4 / 3]) - 0.1) / 2.0)
    np.testing.assert_allclose(out.sub_scores["bright/red"], [2 * 306 / 3, 4 * 102 / 3])
