"""Replay (vgrpo.training.replay): earlier stages' prompts rolled out as KL-only groups. The reference KL weighted
per sample is linear in the weights and the same in V-GRPO's two update paths; replay groups are never scored and
leave the own groups' advantages as they are alone; the config refuses what cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.algorithms.helpers import GROUP, PROMPTS, grads, make_config, make_policy, prepared
from tests.tiny_world import Recorder, run_tiny_stage, write_tiny_world
from tests.tiny_world import tiny_stage_config as _config
from vgrpo.algorithms.vgrpo import VGRPO
from vgrpo.rewards.base import Metadata
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput
from vgrpo.training.prompt_rows import sample_prompt_rows
from vgrpo.training.replay import (
    ReplayConfig,
    ref_kl_weights,
    replay_rows,
    sample_replay_rows,
    unscored_replay,
)
from vgrpo.training.stage import StageOptions

N = PROMPTS * GROUP
REPLAY = {"prompts_per_iteration": 2, "tags": {"counting": 2.0, "colors": 1.0}}
KL_ON = {"name": "vgrpo", "n_mc": 2, "ref_kl_coef": 1.0}


def _moved_batch(algo: dict[str, Any], weights: torch.Tensor | None):
    """A prepared batch (zero advantages: the reference KL is the whole objective) under weights moved off the
    reference, so the KL and its gradient are not zero."""
    config = make_config(algo)
    policy = make_policy(config)
    algorithm, batch = prepared(config, policy, torch.zeros(N))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    rollout = algorithm.rollout(policy, batch.cond, batch.samples, g, 1)
    batch = algorithm.prepare(policy, rollout, batch.cond, torch.zeros(N), g, ref_kl_weights=weights)
    return algorithm, policy, batch


def _kl_gradient(algo: dict[str, Any], weights: torch.Tensor | None) -> tuple[dict[str, float], list[torch.Tensor]]:
    algorithm, policy, batch = _moved_batch(algo, weights)
    policy.zero_grad(set_to_none=True)
    metrics = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=1)
    return metrics, grads(policy)


@pytest.mark.parametrize("memory_bounded", [True, False])
def test_weighted_reference_kl_is_linear_in_the_weights(memory_bounded: bool) -> None:
    algo = {**KL_ON, "memory_bounded": memory_bounded}
    first = torch.tensor([1.0] * GROUP + [0.0] * GROUP)
    plain, g_plain = _kl_gradient(algo, None)
    ones, g_ones = _kl_gradient(algo, torch.ones(N))
    a, g_a = _kl_gradient(algo, first)
    b, g_b = _kl_gradient(algo, 3.0 * (1 - first))
    assert plain["kl_ref"] > 0 and ones["kl_ref"] == pytest.approx(plain["kl_ref"], rel=1e-6)
    for x, y in zip(g_ones, g_plain, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-9)
    # KL(w_a + w_b / 3) = KL(ones): the groups' terms add, each scaled by its weight
    assert a["kl_ref"] + b["kl_ref"] / 3 == pytest.approx(plain["kl_ref"], rel=1e-5)
    for x, y, z in zip(g_a, g_b, g_plain, strict=True):
        torch.testing.assert_close(x + y / 3, z, rtol=1e-4, atol=1e-7)
    _, g_zero = _kl_gradient(algo, torch.zeros(N))
    assert all(g.abs().max() == 0 for g in g_zero)


def test_both_update_paths_weight_the_kl_alike() -> None:
    weights = torch.tensor([0.0] * GROUP + [2.5] * GROUP)
    bounded, g_bounded = _kl_gradient({**KL_ON, "memory_bounded": True}, weights)
    full, g_full = _kl_gradient({**KL_ON, "memory_bounded": False}, weights)
    assert bounded["kl_ref"] == pytest.approx(full["kl_ref"], rel=1e-5)
    scale = max(g.abs().max().item() for g in g_full)
    for x, y in zip(g_bounded, g_full, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6 * max(scale, 1.0))


def test_weights_need_a_reference_kl_and_an_algorithm_that_weighs_one() -> None:
    with pytest.raises(ValueError, match="ref_kl_coef > 0"):
        _moved_batch({"name": "vgrpo", "n_mc": 2}, torch.ones(N))
    config = make_config({"name": "flow_grpo"})
    policy = make_policy(config)
    algorithm, batch = prepared(config, policy)
    assert not algorithm.weighs_ref_kl and VGRPO.weighs_ref_kl
    g = torch.Generator().manual_seed(0)
    rollout = algorithm.rollout(policy, batch.cond, torch.randn(batch.samples.shape, generator=g), g, 0)
    with pytest.raises(ValueError, match="flow_grpo has no reference KL"):
        algorithm.prepare(policy, rollout, batch.cond, torch.zeros(N), g, ref_kl_weights=torch.ones(N))


def test_stage_config_refuses_replay_it_cannot_run() -> None:
    with pytest.raises(ValueError, match=r"set algorithm\.ref_kl_coef > 0"):
        _config(replay=REPLAY)
    with pytest.raises(ValueError, match=r"algorithm\.name=flow_grpo has none"):
        _config(replay=REPLAY, algorithm={"name": "flow_grpo"})
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        ReplayConfig.model_validate({"prompts_per_iteration": 1, "tags": {"counting": -1.0}})
    with pytest.raises(ValueError, match="extra"):
        ReplayConfig.model_validate({"prompts_per_iteration": 1, "tags": {"counting": 1.0}, "kl": 1})
    with pytest.raises(ValueError, match="divisible by the 2 processes"):  # 2 own + 1 replay prompts over 2
        _config(replay={**REPLAY, "prompts_per_iteration": 1}, algorithm=KL_ON, launch={"processes": 2})
    config = _config(replay=REPLAY, algorithm=KL_ON)
    assert config.batch_prompts == 4 and _config().batch_prompts == 2


def test_replay_draw_and_weights(tmp_path: Path) -> None:
    rows = [{"prompt": f"c{i}", "tag": "counting"} for i in range(6)] + [{"prompt": "x", "tag": "colors"}]
    replay = ReplayConfig.model_validate(REPLAY)
    drawn = sample_replay_rows(rows, 3, 0, 5)
    assert drawn == sample_replay_rows(rows, 3, 0, 5) != sample_replay_rows(rows, 3, 0, 6)
    assert drawn != sample_prompt_rows(rows, 3, 0, 5)  # a stream of its own, apart from the stage's draw
    weights = ref_kl_weights(replay, ["colors", "counting"], own_prompts=2, group_size=2)
    assert weights.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    padded = unscored_replay({"a": torch.ones(2)}, ["a", "b"], 4)
    assert padded["a"][:2].tolist() == [1.0, 1.0] and bool(padded["a"][2:].isnan().all())
    assert bool(padded["b"].isnan().all())
    (tmp_path / "p.jsonl").write_text('{"prompt": "a", "tag": "counting"}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl: replay\.tags \['colors'\] name no prompt's tag"):
        replay_rows(replay, tmp_path / "p.jsonl")


class _Seen(MultiReward):
    """The training rewards, recording the prompt rows they score."""

    rows: list[Metadata]

    def __call__(self, images: np.ndarray, prompts: Any, metadata: Any = None) -> MultiRewardOutput:  # type: ignore[override]
        self.rows.extend(metadata or [])
        return super().__call__(images, prompts, metadata)


def test_stage_with_replay_scores_only_its_own_prompts_and_holds_replay_by_the_kl(tmp_path: Path) -> None:
    world = write_tiny_world(tmp_path)
    config = _config(
        replay=REPLAY,
        algorithm=KL_ON,
        prompt_tags=["single_object", "two_object"],
        iterations=2,
    )
    rewards = _Seen.from_configs(config.rewards)
    rewards.rows = []
    recorder = Recorder()
    options = StageOptions(rewards=rewards, final_evaluation=False)
    run_tiny_stage(config, world, "run", "lora", callbacks=recorder, options=options)
    assert len(rewards.rows) == 2 * 2 * 4  # iterations x own prompts x group size: no replay sample scored
    assert {r["tag"] for r in rewards.rows} <= {"single_object", "two_object"}
    first, second = (metrics for _, metrics in recorder.logged)
    assert first["train/kl_ref"] == 0.0 < second["train/kl_ref"]  # the replay groups' KL, once the weights moved
    # The advantages are the own groups' alone: a replay group reaching compute_advantages, scored by no reward,
    # would have stopped the stage; the rewards' statistics are the own samples'.
    assert "reward/pickscore_mean" in second and "reward/pickscore_scored_frac" not in second
    assert recorder.skips == []
