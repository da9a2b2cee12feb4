"""One training iteration, the same for every algorithm, usable without Prefect, in three phases:

rollout (:func:`rollout_batch`) -> rewards (:func:`gather_rewards`) -> advantages, prepare (pairs, old surrogates)
and K gradient steps (:func:`update_policy`); :func:`train_iteration` runs the three in one call, each phase's work
in ``region(phase)`` (:data:`PhaseRegion`: a profiler label, or :mod:`benchmarks.flops`'s FLOP count).

Sharded over ``W`` processes (the algorithm's :class:`vgrpo.parallel.distributed.Distributed`), every rank is given the
same global prompts and generator and works on its block of whole prompt groups: it keeps its block of the
global initial noise, rolls out and scores its samples, gathers the rewards to normalise each group on the
global batch, and averages gradients over ranks before each optimizer step. With one process every step is
the same as without sharding.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from vgrpo.advantages import compute_advantages, unscored_samples
from vgrpo.algorithms.base import Algorithm, Rollout
from vgrpo.algorithms.config import AdvantageConfig
from vgrpo.config import TrainConfig
from vgrpo.config_batch import check_batch
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import Conditioning, trainable_parameters
from vgrpo.training.guards import NonFiniteError, check_finite, check_prepared
from vgrpo.training.optim import OptimConfig, clip_gradients
from vgrpo.training.update_stats import step_summary, update_norms, weights_before

__all__ = [
    "IterationRecord",
    "PhaseRegion",
    "RewardFn",
    "RolloutBatch",
    "gather_rewards",
    "minibatch_schedule",
    "profiler_region",
    "rollout_batch",
    "train_iteration",
    "update_policy",
]

RewardFn = Callable[[Tensor, Sequence[str]], Mapping[str, Tensor]]
"""``(samples (N, *S), prompts (N,)) -> {reward name: (N,) scores}``; decoding is the reward's job."""


@dataclass(frozen=True)
class IterationRecord:
    """What one iteration did.

    Attributes:
        metrics: flat dict of floats: rewards, advantages, surrogate CV, ratio/clip/KL statistics
            (averaged over gradient steps; ``*_first`` / ``*_last`` keep the ends), grad norm, the norm of the
            weights' change (``update/*``), seconds per phase and NFE.
        rewards: name -> ``(N,)`` the iteration's raw rewards (the global batch's, gathered from every rank).
        samples: ``(N / W, *S)`` the rollout's final latents (this rank's samples).
    """

    metrics: dict[str, float]
    rewards: dict[str, Tensor]
    samples: Tensor


PHASE_LABEL = {phase: f"vgrpo/{phase}" for phase in ("rollout", "reward", "prepare", "update")}
"""The profiler's label of each phase's region (``torch.profiler.record_function``; free when no profiler runs):
what :mod:`benchmarks.profile` attributes each operator's time by."""
PhaseRegion = Callable[[str], AbstractContextManager[object]]
"""``region(phase)``: the context each phase's work (``rollout``, ``reward``, ``prepare``, ``update``) runs in."""


def profiler_region(phase: str) -> AbstractContextManager[object]:
    """The default region: the phase's profiler label (:data:`PHASE_LABEL`)."""
    return record_function(PHASE_LABEL[phase])


def _clock(device: torch.device) -> float:
    """Seconds for the phase split; waits for queued GPU work first, or a phase's kernels bill the next one."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _prompts_at(values: Tensor, prompts: Sequence[str], group_size: int) -> list[str]:
    """The prompts of the first non-finite samples of a global ``(B * G,)`` tensor, for the event log."""
    bad = torch.nonzero(~torch.isfinite(values)).flatten()[:4].tolist()
    return [prompts[i // group_size] for i in bad]


def minibatch_schedule(num_samples: int, minibatches: int, steps: int, generator: torch.Generator) -> list[Tensor]:
    """Sample indices for each of ``steps`` gradient steps: the whole batch when ``minibatches == 1``,
    else consecutive parts of a permutation redrawn at the start of each pass over the batch.

    Sharded, ``num_samples`` is a rank's count and every rank draws the same permutation of its own samples
    (Flow-GRPO permutes per rank too), so a global minibatch is the union of the ranks' same-position parts:
    as large as in one process, with an equal share from each rank, but not the same samples.
    """
    if minibatches == 1:
        return [torch.arange(num_samples)] * steps
    size = num_samples // minibatches
    schedule: list[Tensor] = []
    while len(schedule) < steps:
        perm = torch.randperm(num_samples, generator=generator)
        schedule.extend(perm[k * size : (k + 1) * size].sort().values for k in range(minibatches))
    return schedule[:steps]


@dataclass
class RolloutBatch:
    """What the rollout phase hands to scoring and to the update (in memory: tensors are not persisted).

    Attributes:
        rollout: this rank's samples ``(N / W, *S)`` and what the algorithm stored while sampling.
        prompts: the iteration's ``B`` global prompts; ``sample_prompts``: this rank's ``N / W``, prompt-major.
        sample_cond: this rank's conditioning, one row per sample.
        generator: the iteration's generator, advanced past the rollout (the update draws from it next).
        seconds: wall time of the rollout.
        replay_groups: the last ``R`` of ``prompts`` are replay, KL-only groups (:mod:`vgrpo.training.replay`).
        ref_kl_weights: the global batch's per-sample weights of the reference KL, or None (the algorithm's own).
    """

    rollout: Rollout
    prompts: list[str]
    sample_prompts: list[str]
    sample_cond: Conditioning
    group_size: int
    generator: torch.Generator
    iteration: int
    seconds: float
    replay_groups: int = 0
    ref_kl_weights: Tensor | None = None


def rollout_batch(
    *,
    policy: nn.Module,
    algorithm: Algorithm,
    prompts: Sequence[str],
    cond: Conditioning,
    minibatches: int,
    latent_shape: tuple[int, ...],
    generator: torch.Generator,
    iteration: int,
    group_noise: str = "independent",
    region: PhaseRegion = profiler_region,
    replay_groups: int = 0,
    ref_kl_weights: Tensor | None = None,
) -> RolloutBatch:
    """Phase 1 of an iteration: ``G`` samples for each of ``B`` prompts (``cond`` has ``B`` rows) under the
    behaviour policy. Sharded, every rank passes the same global ``prompts``, ``cond`` and ``generator`` state and
    samples its block of whole prompt groups from its block of the global initial noise (``group_noise``:
    ``rollout.group_noise``)."""
    dist = algorithm.dist
    group_size = algorithm.group_size
    if len(prompts) != len(cond):
        raise ValueError(f"{len(prompts)} prompts but conditioning has {len(cond)} rows")
    check_batch(len(prompts), group_size, minibatches, dist.world_size)
    shard = dist.shard(len(prompts))  # whole prompt groups per rank
    device = next(policy.parameters()).device
    sample_prompts = [p for p in prompts[shard] for _ in range(group_size)]
    sample_cond = cond.index(torch.arange(shard.start, shard.stop)).repeat_interleave(group_size).to(device)
    samples = slice(shard.start * group_size, shard.stop * group_size)  # this rank's block of the global batch
    t0 = _clock(device)
    if group_noise == "shared":  # one initial noise per prompt (MixGRPO's init_same_noise)
        noise = torch.randn(len(prompts), *latent_shape, generator=generator).repeat_interleave(group_size, dim=0)
    else:
        noise = torch.randn(len(prompts) * group_size, *latent_shape, generator=generator)
    noise = noise[samples].to(device)
    with region("rollout"):
        rollout = algorithm.rollout(policy, sample_cond, noise, generator, iteration)
    return RolloutBatch(
        rollout=rollout,
        prompts=list(prompts),
        sample_prompts=sample_prompts,
        sample_cond=sample_cond,
        group_size=group_size,
        generator=generator,
        iteration=iteration,
        seconds=_clock(device) - t0,
        replay_groups=replay_groups,
        ref_kl_weights=ref_kl_weights,
    )


def gather_rewards(batch: RolloutBatch, local: Mapping[str, Tensor], dist: Distributed) -> dict[str, Tensor]:
    """Phase 2's end: this rank's scores ``{name: (N / W,)}`` gathered into the global batch's on every rank,
    checked finite there (NaN marks the prompts a reward does not score), so every rank takes the same decision
    (:class:`vgrpo.training.guards.NonFiniteError`)."""
    num_samples = len(batch.sample_prompts)
    rewards = {name: r.detach().float().cpu() for name, r in local.items()}
    for name, r in rewards.items():
        if r.shape != (num_samples,):
            raise ValueError(f"reward {name!r} returned shape {tuple(r.shape)}, expected ({num_samples},)")
    rewards = {name: dist.gather(r) for name, r in rewards.items()}
    for name, r in rewards.items():
        # NaN for a whole group marks a prompt the reward does not score; anywhere else it is a non-finite score
        scored = torch.where(unscored_samples(r, batch.group_size), 0.0, r)
        check_finite(f"reward/{name}", scored, prompts=_prompts_at(scored, batch.prompts, batch.group_size))
    return rewards


def update_policy(
    *,
    policy: nn.Module,
    algorithm: Algorithm,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    rewards: Mapping[str, Tensor],
    advantage: AdvantageConfig,
    optim: OptimConfig,
    reward_weights: Mapping[str, float] | None = None,
    reward_seconds: float = 0.0,
    region: PhaseRegion = profiler_region,
) -> IterationRecord:
    """Phase 3 of an iteration: advantages from the global batch's ``rewards`` (weighted by ``reward_weights``; a
    replay group's 0, its rewards unread), the algorithm's precomputation, then ``optim.gradient_steps`` optimizer
    steps, drawing minibatches from the iteration's generator."""
    dist = algorithm.dist
    group_size = batch.group_size
    num_samples = len(batch.sample_prompts)
    device = next(policy.parameters()).device
    shard = dist.shard(len(batch.prompts))
    samples = slice(shard.start * group_size, shard.stop * group_size)
    t2 = _clock(device)
    own = slice(0, (len(batch.prompts) - batch.replay_groups) * group_size)  # replay groups come last
    adv = compute_advantages(
        {name: r[own] for name, r in rewards.items()},
        group_size=group_size,
        weights=dict(reward_weights) if reward_weights else None,
        aggregation=advantage.aggregation,
        std_scope=advantage.std_scope,
        delta=advantage.delta,
        std_ddof=advantage.std_ddof,
        soft_clip_eta=advantage.soft_clip_eta,
        clamp=advantage.clamp,
    )
    advantages = torch.nn.functional.pad(adv.advantages, (0, batch.replay_groups * group_size))
    check_finite("advantages", advantages)
    weights = None if batch.ref_kl_weights is None else batch.ref_kl_weights[samples]
    with region("prepare"):
        prepared = algorithm.prepare(
            policy, batch.rollout, batch.sample_cond, advantages[samples], batch.generator, ref_kl_weights=weights
        )
    check_prepared(prepared.payload, dist)
    params = trainable_parameters(policy)
    before = weights_before(params)
    t3 = _clock(device)

    per_step: dict[str, list[float]] = {}
    schedule = minibatch_schedule(num_samples, optim.minibatches, optim.gradient_steps, batch.generator)
    with region("update"):  # the region time/update_s measures
        for step, idx in enumerate(schedule):
            optimizer.zero_grad(set_to_none=True)
            step_metrics = dist.reduce_metrics(algorithm.accumulate_gradients(policy, prepared, idx, step))
            dist.average_gradients(params)  # before clipping, so every rank clips and steps the same gradient
            grad_norm = clip_gradients(params, optim)
            if not torch.isfinite(grad_norm):  # no step: this iteration is skipped (vgrpo.training.guards)
                optimizer.zero_grad(set_to_none=True)
                bad = {k: v for k, v in step_metrics.items() if not math.isfinite(v)}
                details = {"step": step, "grad_norm": grad_norm.item(), **bad}
                raise NonFiniteError("loss" if bad else "gradients", details)
            optimizer.step()
            for key, value in {**step_metrics, "grad_norm": grad_norm.item()}.items():
                per_step.setdefault(key, []).append(value)
        end_metrics = algorithm.end_iteration(policy, batch.iteration)
    t4 = _clock(device)

    metrics: dict[str, float] = {"iteration": float(batch.iteration), **adv.metrics, **prepared.metrics, **end_metrics}
    metrics.update({**step_summary(per_step), **update_norms(before, params)})
    metrics.update(
        {
            "time/rollout_s": batch.seconds,
            "time/reward_s": reward_seconds,
            "time/prepare_s": t3 - t2,
            "time/update_s": t4 - t3,
            "time/total_s": batch.seconds + reward_seconds + (t4 - t2),
            "nfe/rollout_per_sample": float(batch.rollout.nfe),
            "gradient_steps": float(optim.gradient_steps),
        }
    )
    return IterationRecord(metrics=metrics, rewards=dict(rewards), samples=batch.rollout.samples)


def train_iteration(
    *,
    policy: nn.Module,
    algorithm: Algorithm,
    optimizer: torch.optim.Optimizer,
    reward_fn: RewardFn,
    prompts: Sequence[str],
    cond: Conditioning,
    config: TrainConfig,
    latent_shape: tuple[int, ...],
    generator: torch.Generator,
    iteration: int,
    reward_weights: Mapping[str, float] | None = None,
    region: PhaseRegion = profiler_region,
) -> IterationRecord:
    """One iteration on ``B`` prompts (``cond`` has ``B`` rows), ``G`` samples each: the three phases
    :func:`rollout_batch` -> ``reward_fn`` + :func:`gather_rewards` -> :func:`update_policy` in one call.

    Randomness (initial noise, SDE noise, pairs, minibatches) comes from ``generator`` only, so the
    same seed gives the same iteration. Sharded, every rank passes the same global ``prompts``, ``cond`` and
    ``generator`` state; ``reward_fn`` sees the rank's samples only. ``reward_weights`` (default
    ``config.advantage.weights``) weight the rewards' advantages; each phase runs in ``region(phase)``.
    """
    if config.rollout.group_size != algorithm.group_size:
        raise ValueError(f"rollout.group_size {config.rollout.group_size} != the algorithm's {algorithm.group_size}")
    batch = rollout_batch(
        policy=policy,
        algorithm=algorithm,
        prompts=prompts,
        cond=cond,
        minibatches=config.optim.minibatches,
        latent_shape=latent_shape,
        generator=generator,
        iteration=iteration,
        group_noise=config.rollout.group_noise,
        region=region,
    )
    t1 = time.perf_counter()
    with region("reward"):
        scores = reward_fn(batch.rollout.samples, batch.sample_prompts)
    rewards = gather_rewards(batch, scores, algorithm.dist)
    weights = reward_weights if reward_weights is not None else config.advantage.weights
    return update_policy(
        policy=policy,
        algorithm=algorithm,
        optimizer=optimizer,
        batch=batch,
        rewards=rewards,
        advantage=config.advantage,
        optim=config.optim,
        reward_weights=weights,
        reward_seconds=time.perf_counter() - t1,
        region=region,
    )
