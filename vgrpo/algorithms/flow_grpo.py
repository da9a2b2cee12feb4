"""Flow-GRPO (Liu et al. 2025) and MixGRPO (Li et al. 2025): GRPO over the SDE sampler's MDP.

The rollout follows Flow-GRPO's Sec. 4.1 ODE-to-SDE sampler and stores the whole trajectory and the per-step
Gaussian log-probabilities; each gradient step re-scores stored transitions under the current weights and
applies the PPO clip per (sample, step), plus a KL to the frozen reference (the base model, also in a stage
that starts from an earlier stage's adapter: ``FlowGRPOConfig.reference``). The loss is a mean
over (sample, step) terms, so backwarding one step and one micro-batch at a time is exact.

MixGRPO is the same algorithm with SDE steps (and training) confined to a sliding window.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.algorithms.base import (
    Algorithm,
    Payload,
    PreparedBatch,
    Rollout,
    ScoredRollout,
    micro_batches,
    zero_lora_deltas,
)
from vgrpo.algorithms.config import FlowGRPOConfig, MixGRPOConfig
from vgrpo.losses import flow_grpo_loss, ratio_metrics
from vgrpo.policy import Conditioning, ParameterSnapshot
from vgrpo.samplers import SDETrajectory, mixgrpo_window_start, sde_sample, sde_step, window_mask

__all__ = ["FlowGRPO", "FlowGRPOBatch", "FlowGRPOPayload", "MixGRPO", "zero_lora_deltas"]


@dataclass(frozen=True)
class FlowGRPOPayload(Payload):
    """What Flow-GRPO's gradient steps re-score, for this rank's ``N`` samples.

    Attributes:
        trajectory: the rollout's stored states and behaviour log-probabilities.
        train_steps: ``(N, K)`` the steps each sample trains on, drawn from the stochastic ones.
    """

    trajectory: SDETrajectory
    train_steps: Tensor


FlowGRPOBatch = PreparedBatch[FlowGRPOPayload]


class FlowGRPO(Algorithm[FlowGRPOPayload]):
    """Flow-GRPO: SDE on every step, train on ``timestep_fraction`` of them per sample."""

    name = "flow_grpo"

    def __init__(self, config: FlowGRPOConfig, *, policy: nn.Module, **kwargs: Any):
        super().__init__(config, **kwargs)
        self.reference: ParameterSnapshot | None = None
        if config.kl_coef > 0:  # the frozen reference: the weights at construction, with `base` the LoRA zeroed
            self.reference = self.keep_snapshot("reference", policy)
            if config.reference == "base":
                zero_lora_deltas(self.reference, policy)

    def sde_steps(self, iteration: int) -> Tensor:
        """``(T,)`` bool: the stochastic (and trainable) steps at this iteration."""
        return torch.ones(self.num_steps, dtype=torch.bool)

    def rollout(
        self, policy: nn.Module, cond: Conditioning, noise: Tensor, generator: torch.Generator, iteration: int
    ) -> Rollout:
        mask = self.sde_steps(iteration)
        # SDE noise of the local samples only, from a per-rank stream when sharded (drawing the global batch's
        # (N, T, *S) noise on every rank would cost W times the memory); one process: ``generator`` itself.
        local = self.dist.local_generator(generator)
        step_noise = torch.randn(noise.shape[0], self.num_steps, *noise.shape[1:], generator=local)
        parts = [
            sde_sample(
                policy,
                noise[pos],
                cond.index(mb),
                self.sigmas,
                noise_level=self.config.noise_level,
                sde_steps=mask,
                step_noise=step_noise[pos].to(device=noise.device, dtype=noise.dtype),
            )
            for mb, pos in micro_batches(torch.arange(noise.shape[0]), self.rollout_micro_batch)
        ]
        trajectory = SDETrajectory(
            latents=torch.cat([p.latents for p in parts]),
            log_probs=torch.cat([p.log_probs for p in parts]),
            sde_steps=mask,
            sigmas=self.sigmas,
        )
        return Rollout(samples=trajectory.samples, nfe=self.num_steps, trajectory=trajectory)

    def precompute(
        self, policy: nn.Module, scored: ScoredRollout, generator: torch.Generator
    ) -> tuple[FlowGRPOPayload, dict[str, float]]:
        trajectory = scored.rollout.trajectory
        assert trajectory is not None
        trainable = torch.nonzero(trajectory.sde_steps).flatten()
        per_sample = max(1, int(self.config.timestep_fraction * trainable.shape[0]))
        n = scored.rollout.samples.shape[0]
        if self.config.timestep_order == "first":  # the same first steps, in order, for every sample
            train_steps = trainable[:per_sample].expand(n, per_sample)
        else:  # each sample trains on its own random subset of the stochastic steps (Flow-GRPO's shuffle)
            local = self.dist.local_generator(generator)  # per rank when sharded, like the SDE noise
            order = torch.stack([torch.randperm(trainable.shape[0], generator=local) for _ in range(n)])
            train_steps = trainable[order[:, :per_sample]]
        return FlowGRPOPayload(trajectory=trajectory, train_steps=train_steps), {}

    def accumulate_gradients(self, policy: nn.Module, batch: FlowGRPOBatch, idx: Tensor, step: int) -> dict[str, float]:
        traj, train_steps = batch.payload.trajectory, batch.payload.train_steps
        num_terms = idx.shape[0] * train_steps.shape[1]
        t_cap, noise_level = float(self.sigmas[1]), self.config.noise_level
        ratios, kls, loss_sum = [], [], 0.0
        for col in range(train_steps.shape[1]):
            for mb, _ in micro_batches(idx, self.train_micro_batch):
                k = train_steps[mb, col]
                rows, k_at = mb.to(traj.latents.device), k.to(traj.latents.device)
                x_t, x_next = traj.latents[rows, k_at], traj.latents[rows, k_at + 1]
                t, t_next = self.sigmas[k].to(x_t.device), self.sigmas[k + 1].to(x_t.device)
                cond = batch.cond.index(mb)
                # The same SDE step scores the recorded transition under the policy and under the reference.
                step_to_x_next = partial(
                    sde_step, x_t=x_t, t=t, t_next=t_next, noise_level=noise_level, t_cap=t_cap, x_next=x_next
                )
                current = step_to_x_next(v=policy(x_t, t, cond))
                kl = None
                if self.reference is not None:
                    with torch.no_grad(), self.reference.swapped_in():
                        ref_mean = step_to_x_next(v=policy(x_t, t, cond)).mean
                    # KL between Gaussians of equal std: ||mu_theta - mu_ref||^2 / (2 std^2), per dim.
                    sq = ((current.mean - ref_mean) ** 2).mean(dim=tuple(range(1, x_t.ndim)))
                    kl = sq / (2 * current.std**2)
                loss, _ = flow_grpo_loss(
                    log_probs=current.log_prob,
                    old_log_probs=traj.log_probs[rows, k_at],
                    advantages=batch.advantages[mb].to(x_t.device),
                    clip_range=self.config.clip_range,
                    kl=kl,
                    kl_coef=self.config.kl_coef,
                )
                share = mb.shape[0] / num_terms
                (loss * share).backward()
                loss_sum += loss.item() * share
                ratios.append(torch.exp(current.log_prob.detach() - traj.log_probs[rows, k_at]))
                if kl is not None:
                    kls.append(kl.detach())
        metrics = ratio_metrics(torch.cat(ratios), self.config.clip_range)
        kl_mean = torch.cat(kls).mean().item() if kls else 0.0
        metrics.update({"loss": loss_sum, "kl": kl_mean, "policy_loss": loss_sum - self.config.kl_coef * kl_mean})
        return metrics


class MixGRPO(FlowGRPO):
    """MixGRPO: SDE and training inside a window of ``window_size`` steps that slides every
    ``shift_interval`` iterations and rolls back at the end; Euler ODE outside the window."""

    name = "mixgrpo"
    config: MixGRPOConfig

    def sde_steps(self, iteration: int) -> Tensor:
        start = mixgrpo_window_start(
            iteration,
            num_steps=self.num_steps,
            window_size=self.config.window_size,
            shift_interval=self.config.shift_interval,
        )
        return window_mask(self.num_steps, start, self.config.window_size)
