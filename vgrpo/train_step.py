"""One training iteration, the same for every algorithm, usable without Prefect:

rollout -> rewards -> advantages -> prepare (pairs, old surrogates) -> K gradient steps

Sharded over ``W`` processes (the algorithm's :class:`vgrpo.distributed.Distributed`), every rank is given the
same global prompts and generator and works on its block of whole prompt groups: it keeps its block of the
global initial noise, rolls out and scores its samples, gathers the rewards to normalise each group on the
global batch, and averages gradients over ranks before each optimizer step. With one process every step is
the same as without sharding.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vgrpo.advantages import compute_advantages
from vgrpo.algorithms.base import Algorithm
from vgrpo.config import OptimConfig, TrainConfig
from vgrpo.distributed import Distributed, samples_per_process
from vgrpo.guards import NonFiniteError, check_finite, nonfinite_summary
from vgrpo.policy import Conditioning, trainable_parameters

__all__ = ["IterationRecord", "RewardFn", "build_optimizer", "minibatch_schedule", "train_iteration"]

RewardFn = Callable[[Tensor, Sequence[str]], Mapping[str, Tensor]]
"""``(samples (N, *S), prompts (N,)) -> {reward name: (N,) scores}``; decoding is the reward's job."""


@dataclass(frozen=True)
class IterationRecord:
    """What one iteration did.

    Attributes:
        metrics: flat dict of floats: rewards, advantages, surrogate CV, ratio/clip/KL statistics
            (averaged over gradient steps; ``*_first`` / ``*_last`` keep the ends), grad norm,
            seconds per phase and NFE.
        rewards: name -> ``(N,)`` the iteration's raw rewards (the global batch's, gathered from every rank).
        samples: ``(N / W, *S)`` the rollout's final latents (this rank's samples).
    """

    metrics: dict[str, float]
    rewards: dict[str, Tensor]
    samples: Tensor


def _clock(device: torch.device) -> float:
    """Seconds for the phase split; waits for queued GPU work first, or a phase's kernels bill the next one."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _prompts_at(values: Tensor, prompts: Sequence[str], group_size: int) -> list[str]:
    """The prompts of the first non-finite samples of a global ``(B * G,)`` tensor, for the event log."""
    bad = torch.nonzero(~torch.isfinite(values)).flatten()[:4].tolist()
    return [prompts[i // group_size] for i in bad]


def _check_prepared(extras: Mapping[str, object], dist: Distributed) -> None:
    """Non-finite tensors among what ``prepare`` computed (old surrogates, log-probabilities, velocities).
    Each rank holds its own samples', so the verdict is reduced: every rank skips, or none does."""
    bad = {k: v for k, v in extras.items() if isinstance(v, Tensor) and v.is_floating_point()
           and not bool(torch.isfinite(v).all())}  # fmt: skip
    if dist.any(bool(bad)):
        name = next(iter(bad), "prepared batch")
        details = nonfinite_summary(bad[name]) if bad else {"on": "another rank"}
        raise NonFiniteError(name, {**details, "rank": dist.rank})


def build_optimizer(policy: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over the policy's trainable parameters (LoRA adapters, or everything)."""
    params = trainable_parameters(policy)
    if not params:
        raise ValueError("the policy has no trainable parameters")
    return torch.optim.AdamW(
        params, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas, eps=config.adam_eps
    )


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


def _accumulate(into: dict[str, list[float]], metrics: Mapping[str, float]) -> None:
    for key, value in metrics.items():
        into.setdefault(key, []).append(value)


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
) -> IterationRecord:
    """Run one iteration on ``B`` prompts (``cond`` has ``B`` rows), ``G`` samples each.

    Randomness (initial noise, SDE noise, pairs, minibatches) comes from ``generator`` only, so the
    same seed gives the same iteration. Sharded, every rank passes the same global ``prompts``, ``cond`` and
    ``generator`` state; ``reward_fn`` sees the rank's samples only.
    """
    dist = algorithm.dist
    group_size = config.rollout.group_size
    if len(prompts) != len(cond):
        raise ValueError(f"{len(prompts)} prompts but conditioning has {len(cond)} rows")
    num_samples = samples_per_process(len(prompts), group_size, config.optim.minibatches, dist.world_size)
    shard = dist.shard(len(prompts))  # whole prompt groups per rank
    device = next(policy.parameters()).device
    sample_prompts = [p for p in prompts[shard] for _ in range(group_size)]
    sample_cond = cond.index(torch.arange(shard.start, shard.stop)).repeat_interleave(group_size).to(device)
    samples = slice(shard.start * group_size, shard.stop * group_size)  # this rank's block of the global batch

    t0 = _clock(device)
    noise = torch.randn(len(prompts) * group_size, *latent_shape, generator=generator)[samples].to(device)
    rollout = algorithm.rollout(policy, sample_cond, noise, generator, iteration)
    t1 = _clock(device)
    rewards = {name: r.detach().float().cpu() for name, r in reward_fn(rollout.samples, sample_prompts).items()}
    for name, r in rewards.items():
        if r.shape != (num_samples,):
            raise ValueError(f"reward {name!r} returned shape {tuple(r.shape)}, expected ({num_samples},)")
    rewards = {name: dist.gather(r) for name, r in rewards.items()}  # every rank: the global batch
    for name, r in rewards.items():  # gathered, so every rank takes the same decision
        check_finite(f"reward/{name}", r, prompts=_prompts_at(r, prompts, group_size))
    t2 = _clock(device)
    adv = compute_advantages(
        rewards,
        group_size=group_size,
        weights=config.advantage.weights or None,
        aggregation=config.advantage.aggregation,
        std_scope=config.advantage.std_scope,
        delta=config.advantage.delta,
        soft_clip_eta=config.advantage.soft_clip_eta,
        clamp=config.advantage.clamp,
    )
    check_finite("advantages", adv.advantages)
    batch = algorithm.prepare(policy, rollout, sample_cond, adv.advantages[samples], generator)
    _check_prepared(batch.extras, dist)
    t3 = _clock(device)

    params = trainable_parameters(policy)
    max_norm = config.optim.max_grad_norm if config.optim.max_grad_norm is not None else float("inf")
    per_step: dict[str, list[float]] = {}
    schedule = minibatch_schedule(num_samples, config.optim.minibatches, config.optim.gradient_steps, generator)
    for step, idx in enumerate(schedule):
        optimizer.zero_grad(set_to_none=True)
        step_metrics = dist.reduce_metrics(algorithm.accumulate_gradients(policy, batch, idx, step))
        dist.average_gradients(params)  # before clipping, so every rank clips and steps the same gradient
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if not torch.isfinite(grad_norm):  # no step: this iteration is skipped (vgrpo.guards)
            optimizer.zero_grad(set_to_none=True)
            bad = {k: v for k, v in step_metrics.items() if not math.isfinite(v)}
            raise NonFiniteError("loss" if bad else "gradients", {"step": step, "grad_norm": grad_norm.item(), **bad})
        optimizer.step()
        _accumulate(per_step, {**step_metrics, "grad_norm": grad_norm.item()})
    end_metrics = algorithm.end_iteration(policy, iteration)
    t4 = _clock(device)

    metrics: dict[str, float] = {"iteration": float(iteration), **adv.metrics, **batch.metrics, **end_metrics}
    for key, values in per_step.items():
        metrics[f"train/{key}"] = sum(values) / len(values)
    for key in ("ratio_mean", "ratio_max", "ratio_min", "clip_frac"):
        if key in per_step:
            metrics[f"train/{key}_first"] = per_step[key][0]
            metrics[f"train/{key}_last"] = per_step[key][-1]
    metrics.update(
        {
            "time/rollout_s": t1 - t0,
            "time/reward_s": t2 - t1,
            "time/prepare_s": t3 - t2,
            "time/update_s": t4 - t3,
            "time/total_s": t4 - t0,
            "nfe/rollout_per_sample": float(rollout.nfe),
            "gradient_steps": float(config.optim.gradient_steps),
        }
    )
    return IterationRecord(metrics=metrics, rewards=rewards, samples=rollout.samples)
