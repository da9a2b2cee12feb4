"""Reward sets: weights, affine normalisation, sub-scores under their reward's key, rewards scoring only the
images they apply to, background scoring equal to direct scoring, and the registry's errors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from vgrpo.advantages import compute_advantages
from vgrpo.rewards import Reward, RewardError, RewardOutput, build_reward, get_reward_class
from vgrpo.rewards.base import Metadata
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput, RewardTerm


class Brightness(Reward):
    name = "brightness"

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        mean = images.reshape(len(images), -1).mean(1) / 255.0
        return RewardOutput(scores=mean, sub_scores={"red": images[..., 0].mean((1, 2)) / 255.0})


class QuotedOnly(Reward):
    name = "quoted"

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        return '"' in prompt

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        assert all('"' in p for p in prompts)
        return RewardOutput(scores=np.array([float(len(p)) for p in prompts]))


class Broken(Reward):
    name = "broken"

    def __init__(self, out: RewardOutput):
        self.out = out

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        return self.out


IMAGES = np.stack([np.full((4, 4, 3), v, np.uint8) for v in (0, 51, 102, 153, 204, 255)])
PROMPTS = ["a", "b", 'say "hi"', "c", 'say "yes"', "d"]


def test_weights_normalisation_and_sub_scores() -> None:
    rewards = MultiReward({"light": RewardTerm(Brightness(), weight=0.5, offset=0.5, scale=0.25)})
    out = rewards(IMAGES, PROMPTS)
    raw = np.array([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_allclose(out.raw["light"], raw)
    np.testing.assert_allclose(out.scores["light"], (raw - 0.5) / 0.25)
    np.testing.assert_allclose(out.sub_scores["light/red"], raw)
    assert rewards.weights == {"light": 0.5}
    metrics = out.metrics()
    assert metrics["reward/light_raw_mean"] == pytest.approx(0.5) and metrics["reward/light_mean"] == pytest.approx(0)
    assert metrics["reward/light/red_mean"] == pytest.approx(0.5) and "time/reward_light_s" in metrics
    adv = compute_advantages(out.score_tensors(), group_size=3, weights=rewards.weights)
    assert adv.advantages.shape == (6,)


def test_rewards_score_only_what_they_apply_to() -> None:
    out = MultiReward({"q": RewardTerm(QuotedOnly()), "light": RewardTerm(Brightness())})(IMAGES, PROMPTS)
    q = out.raw["q"]
    assert np.isnan(q[[0, 1, 3, 5]]).all() and q[2] == len('say "hi"') and q[4] == len('say "yes"')
    assert out.metrics()["reward/q_raw_mean"] == pytest.approx((8 + 9) / 2)
    with pytest.raises(ValueError, match="reward 'q' has non-finite scores"):
        compute_advantages(out.score_tensors(), group_size=3)


def test_submit_equals_call_and_chunks_concatenate() -> None:
    with MultiReward({"light": RewardTerm(Brightness()), "q": RewardTerm(QuotedOnly())}) as rewards:
        direct = rewards(IMAGES, PROMPTS)
        parts = [rewards.submit(IMAGES[i : i + 2], PROMPTS[i : i + 2]) for i in range(0, 6, 2)]
        joined = MultiRewardOutput.concatenate([p.result() for p in parts])
    for key in direct.raw:
        np.testing.assert_array_equal(joined.raw[key], direct.raw[key])
    np.testing.assert_array_equal(joined.sub_scores["light/red"], direct.sub_scores["light/red"])


def test_from_configs_builds_registered_rewards() -> None:
    rewards = MultiReward.from_configs(
        [
            RewardConfig(name="geneval", weight=2.0),
            RewardConfig(name="geneval", key="geneval_strict", options={"reward": "strict"}),
        ]
    )
    assert rewards.weights == {"geneval": 2.0, "geneval_strict": 1.0} and rewards.needs_metadata
    assert rewards.sources == {"geneval": "geneval", "geneval_strict": "geneval"}
    with pytest.raises(ValueError, match="used twice"):
        MultiReward.from_configs([RewardConfig(name="geneval"), RewardConfig(name="geneval")])


def test_registry_errors_name_the_reward() -> None:
    with pytest.raises(KeyError, match=r"unknown reward 'hps'; valid names: \['aesthetic', 'clipscore'"):
        get_reward_class("hps")
    with pytest.raises(TypeError, match="reward 'geneval': bad options"):
        build_reward("geneval", {"no_such_option": 1})


def test_reward_outputs_are_checked_by_name() -> None:
    with pytest.raises(RewardError, match=r"reward 'broken' returned scores of shape \(2,\), expected \(6,\)"):
        Broken(RewardOutput(scores=np.zeros(2)))(IMAGES, PROMPTS)
    with pytest.raises(RewardError, match=r"reward 'broken' returned non-finite scores at images \[1\]"):
        Broken(RewardOutput(scores=np.array([0, np.inf, 0, 0, 0, 0])))(IMAGES, PROMPTS)
    with pytest.raises(RewardError, match=r"sub_scores\['x'\] of shape \(1,\)"):
        Broken(RewardOutput(scores=np.zeros(6), sub_scores={"x": np.zeros(1)}))(IMAGES, PROMPTS)
    with pytest.raises(ValueError, match="uint8 RGB images"):
        Brightness()(IMAGES.astype(np.float32), PROMPTS)
    with pytest.raises(ValueError, match="6 images but 2 prompts"):
        Brightness()(IMAGES, PROMPTS[:2])
