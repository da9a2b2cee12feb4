"""The real-model recipes as the papers state them: what the SD3.5-M and FLUX params and the baselines' presets set,
and that each setting does what its comment says (on tiny models where it is behaviour, not a number)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.algorithms.helpers import make_config, make_policy
from vgrpo.advantages import compute_advantages, group_normalize
from vgrpo.algorithms import build_algorithm
from vgrpo.algorithms.config import FlowGRPOConfig, MixGRPOConfig, VGRPOConfig
from vgrpo.config import StageConfig, load_config, load_curriculum
from vgrpo.flow import resolution_shift_mu, shift_timesteps, timestep_grid
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning
from vgrpo.training.iteration import train_iteration
from vgrpo.training.optim import build_optimizer

ROOT = Path(__file__).parents[1]


def _curriculum(name: str) -> list[StageConfig]:
    return load_curriculum(ROOT / "params" / "curricula" / f"{name}.yaml", root=ROOT)[1]


def test_sd35_trains_and_evaluates_at_512_px() -> None:
    for stage in _curriculum("sd35"):
        assert stage.rollout.resolution == 512 and stage.evaluation.resolution == 512, stage.name
        assert stage.rollout.shift == 3.0 and stage.rollout.num_steps == 40 and stage.evaluation.num_steps == 40
        assert stage.advantage.std_ddof == 1


def test_flux_rollouts_at_720_px_static_shift_3_and_evaluation_at_1024_px_with_the_dynamic_shift() -> None:
    (stage,) = _curriculum("flux")
    rollout, evaluation = stage.rollout, stage.evaluation
    assert (rollout.resolution, rollout.num_steps, rollout.shift, rollout.dynamic_shift) == (720, 16, 3.0, False)
    assert rollout.schedule == "uniform"
    assert (evaluation.resolution, evaluation.num_steps, evaluation.p_mix, evaluation.shift) == (
        1024,
        50,
        0.8,
        "dynamic",
    )
    # FLUX.1's VAE downsamples 8x and packs 2 x 2 patches: 1024 px is 64 x 64 = 4096 tokens, mu 1.15, s = 3.158;
    # the 720 px rollouts would have had 2025 tokens and s = 2.224 under the dynamic shift.
    assert math.exp(resolution_shift_mu((1024 // 16) ** 2)) == pytest.approx(3.1582, abs=1e-4)
    assert math.exp(resolution_shift_mu((720 // 16) ** 2)) == pytest.approx(2.2243, abs=1e-4)
    assert stage.advantage.std_ddof == 1 and stage.advantage.soft_clip_eta == 2.0


def test_flux_multi_reward_advantage_is_the_mean_of_the_four_rewards_advantages() -> None:
    (stage,) = _curriculum("flux")
    weights = {r.resolved_key: r.weight for r in stage.rewards}
    assert weights == {"hpsv2": 0.25, "pickscore": 0.25, "imagereward": 0.25, "unifiedreward": 0.25}
    g = torch.Generator().manual_seed(0)
    rewards = {key: torch.randn(12, generator=g) * (i + 1) for i, key in enumerate(weights)}  # 1 prompt x group 12
    adv = compute_advantages(
        rewards,
        group_size=12,
        weights=weights,
        aggregation=stage.advantage.aggregation,
        std_ddof=stage.advantage.std_ddof,
    ).advantages
    per_reward = [group_normalize(r, 12, ddof=1) for r in rewards.values()]
    torch.testing.assert_close(adv, torch.stack(per_reward).mean(dim=0))
    # One z-score's scale: the std of the mean of 4 advantages is at most 1, where their sum's could reach 4.
    assert adv.std(correction=1).item() <= 1.0 + 1e-5


def test_embedded_preference_stages_sum_their_normalised_rewards() -> None:
    """docs/configuration.md: the embedded stages 1 and 3 normalise each reward and sum (MixGRPO's aggregation),
    where the paper's SD3.5 stage 1 averages the raw rewards before one normalisation; left as recorded."""
    stages = {s.name: s for s in _curriculum("embedded")}
    for name in ("s1-preference", "s3-preference"):
        stage = stages[name]
        assert stage.advantage.aggregation == "normalize_then_sum" and stage.advantage.std_ddof == 0
        assert [r.weight for r in stage.rewards] == [1.0, 1.0]
    paper = {s.name: s for s in _curriculum("sd35")}["s1-preference"]
    assert paper.advantage.aggregation == "sum_then_normalize"
    assert [r.weight for r in paper.rewards] == [0.3333] * 3


def _one_iteration(kl_coef: float, gradient_steps: int, minibatches: int) -> tuple[list[torch.Tensor], dict[str, Any]]:
    config = make_config(
        {"name": "vgrpo", "n_mc": 2, "kl_coef": kl_coef},
        optim={"gradient_steps": gradient_steps, "minibatches": minibatches, "lr": 1e-2},
    )
    policy = make_policy(config)
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
    record = train_iteration(
        policy=policy,
        algorithm=algorithm,
        optimizer=build_optimizer(policy, config.optim),
        reward_fn=lambda s, p: {"bright": s.mean(dim=(1, 2, 3))},
        prompts=["a", "b"],
        cond=tiny_conditioning(2),
        config=config,
        latent_shape=TINY_LATENT_SHAPE,
        generator=torch.Generator().manual_seed(0),
        iteration=0,
    )
    return [p.detach().clone() for p in policy.parameters() if p.requires_grad], record.metrics


def test_sd35_stage_5_kl_acts_with_two_half_batch_steps_and_never_with_one_full_batch_step() -> None:
    stage5 = _curriculum("sd35")[4]
    assert isinstance(stage5.algorithm, VGRPOConfig) and stage5.algorithm.kl_coef == 0.3
    steps, parts = stage5.optim.gradient_steps, stage5.optim.minibatches
    assert (steps, parts) == (2, 2)
    without, _ = _one_iteration(0.0, steps, parts)
    with_kl, metrics = _one_iteration(0.3, steps, parts)
    assert max((a - b).abs().max().item() for a, b in zip(without, with_kl, strict=True)) > 1e-6
    assert metrics["train/kl"] > 0  # the second step sees the first one's update
    # One full-batch step: theta = theta_old where the KL and its gradient are exactly 0, so the update is the same.
    without, _ = _one_iteration(0.0, 1, 1)
    with_kl, metrics = _one_iteration(0.3, 1, 1)
    assert all(torch.equal(a, b) for a, b in zip(without, with_kl, strict=True))
    assert metrics["train/kl"] == 0.0


def test_flow_grpo_preset_samples_on_the_sd3_pipelines_own_grid() -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    config = load_config([ROOT / "params/base.yaml", ROOT / "params/algorithms/flow_grpo.yaml"])
    assert isinstance(config.algorithm, FlowGRPOConfig) and config.algorithm.reference == "base"
    assert config.rollout.schedule == "diffusers" and config.advantage.std_ddof == 0
    algorithm = build_algorithm(config, policy=make_policy(config), latent_shape=TINY_LATENT_SHAPE)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)  # SD3.5-M's scheduler config
    scheduler.set_timesteps(config.rollout.num_steps)
    assert torch.equal(algorithm.sigmas, scheduler.sigmas)
    assert algorithm.sigmas[-2].item() == pytest.approx(0.0089, abs=5e-5)  # the uniform grid's is 0.25


def test_mixgrpo_preset_samples_25_steps_at_shift_3_on_its_uniform_grid() -> None:
    config = load_config([ROOT / "params/base.yaml", ROOT / "params/algorithms/mixgrpo.yaml"])
    assert isinstance(config.algorithm, MixGRPOConfig)
    rollout = config.rollout
    assert (rollout.num_steps, rollout.shift, rollout.dynamic_shift, rollout.schedule) == (25, 3.0, False, "uniform")
    assert config.advantage.std_ddof == 1
    algorithm = build_algorithm(config, policy=make_policy(config), latent_shape=TINY_LATENT_SHAPE)
    expected = shift_timesteps(torch.linspace(1, 0, 26, dtype=torch.float64), 3.0).float()  # its sd3_time_shift
    torch.testing.assert_close(algorithm.sigmas, expected, rtol=0, atol=1e-7)
    assert algorithm.sigmas[-2].item() == pytest.approx(3 * 0.04 / (1 + 2 * 0.04))
    # Over the FLUX stage (whose rollout is static too), the preset still validates.
    files = ["base.yaml", "models/flux.yaml", "stages/flux/multireward.yaml", "algorithms/mixgrpo.yaml"]
    flux = load_config([ROOT / "params" / f for f in files], schema=StageConfig)
    assert (flux.rollout.num_steps, flux.rollout.shift, flux.rollout.resolution) == (25, 3.0, 720)


def test_diffusers_schedule_refuses_the_dynamic_shift() -> None:
    from vgrpo.algorithms.config import RolloutConfig

    with pytest.raises(ValueError, match="FluxPipeline passes its own sigmas"):
        RolloutConfig(shift=None, dynamic_shift=True, schedule="diffusers")
    assert torch.equal(timestep_grid(4, shift=3.0, schedule="uniform"), timestep_grid(4, shift=3.0))
