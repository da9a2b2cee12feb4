"""DiffusionNFT (Zheng et al. 2025): likelihood-free RL on the forward process.

An "old" copy of the trainable weights samples with the Euler ODE; the reward-derived weight
``r = clip(A / A_max / 2 + 0.5, 0, 1)`` mixes a positive and a negative implicit policy
(:func:`vgrpo.losses.nft_loss`) trained with the self-normalised x-loss on noised samples; after each
iteration the old weights follow the trained ones by EMA. Timestep-noise pairs reuse V-GRPO's
:func:`vgrpo.pairs.draw_pairs`, drawn independently per sample (no sharing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.algorithms.base import Algorithm, Payload, PreparedBatch, Rollout, ScoredRollout, micro_batches
from vgrpo.algorithms.config import DiffusionNFTConfig
from vgrpo.losses import nft_loss
from vgrpo.pairs import SharedPairs, draw_pairs
from vgrpo.policy import Conditioning

__all__ = ["DiffusionNFT", "DiffusionNFTBatch", "DiffusionNFTPayload", "nft_reward_weight"]


@dataclass(frozen=True)
class DiffusionNFTPayload(Payload):
    """What DiffusionNFT's gradient steps train against, for this rank's ``N`` samples.

    Attributes:
        pairs: the iteration's timestep-noise pairs, one row per sample (this rank's rows).
        v_old: ``(N, N_MC, *S)`` the old policy's velocity at each pair.
        reward_weight: ``(N,)`` the optimality probability ``r`` (:func:`nft_reward_weight`).
    """

    pairs: SharedPairs
    v_old: Tensor
    reward_weight: Tensor


DiffusionNFTBatch = PreparedBatch[DiffusionNFTPayload]


def nft_reward_weight(advantages: Tensor, adv_max: float) -> Tensor:
    """DiffusionNFT's optimality probability ``r = clip(A / A_max / 2 + 0.5, 0, 1)``, ``(N,)``."""
    return (advantages.float() / adv_max / 2 + 0.5).clamp(0.0, 1.0)


class DiffusionNFT(Algorithm[DiffusionNFTPayload]):
    name = "diffusion_nft"

    def __init__(self, config: DiffusionNFTConfig, *, policy: nn.Module, **kwargs: Any):
        super().__init__(config, **kwargs)
        self.old = self.keep_snapshot("old", policy)

    def rollout(
        self, policy: nn.Module, cond: Conditioning, noise: Tensor, generator: torch.Generator, iteration: int
    ) -> Rollout:
        with self.old.swapped_in():
            return self.ode_rollout(policy, cond, noise)

    def precompute(
        self, policy: nn.Module, scored: ScoredRollout, generator: torch.Generator
    ) -> tuple[DiffusionNFTPayload, dict[str, float]]:
        samples, cond = scored.rollout.samples, scored.cond
        n = samples.shape[0]
        pairs = draw_pairs(  # the global batch's pairs, then this rank's rows (see Algorithm.local_pairs)
            num_prompts=n * self.dist.world_size // self.group_size,
            group_size=self.group_size,
            n_mc=self.config.n_mc,
            latent_shape=self.latent_shape,
            share="none",
            timestep_sampling=self.config.timestep_sampling,
            sigmas=self.sigmas,
            generator=generator,
        )
        pairs = self.local_pairs(pairs, n)
        v_old = torch.empty(n, pairs.n_mc, *samples.shape[1:])
        with torch.no_grad(), self.old.swapped_in():
            for j in range(pairs.n_mc):
                for mb, pos in micro_batches(torch.arange(n), self.train_micro_batch):
                    _, t, _, z = pairs.noised(j, mb, samples)
                    v_old[pos, j] = policy(z, t, cond.index(mb)).float().cpu()
        r = nft_reward_weight(scored.advantages, self.config.adv_max)
        payload = DiffusionNFTPayload(pairs=pairs, v_old=v_old, reward_weight=r)
        weights = self.dist.gather(r)
        # r at 0 or 1 is A at or past +-adv_max: those samples' advantages are cut, like a clamp's
        saturated = ((weights == 0) | (weights == 1)).float().mean().item()
        return payload, {"nft/reward_weight_mean": weights.mean().item(), "nft/reward_weight_saturated_frac": saturated}

    def accumulate_gradients(
        self, policy: nn.Module, batch: DiffusionNFTBatch, idx: Tensor, step: int
    ) -> dict[str, float]:
        pairs, v_old, r = batch.payload.pairs, batch.payload.v_old, batch.payload.reward_weight
        totals: dict[str, float] = {}
        scale = 1.0 / (pairs.n_mc * idx.shape[0])
        for j in range(pairs.n_mc):
            for mb, _ in micro_batches(idx, self.train_micro_batch):
                x0, t, eps, z = pairs.noised(j, mb, batch.samples)
                v = policy(z, t, batch.cond.index(mb))
                loss, metrics = nft_loss(
                    v_theta=v,
                    v_old=v_old[mb, j].to(v.device),
                    x0=x0,
                    eps=eps,
                    t=t,
                    reward_weight=r[mb].to(v.device),
                    beta=self.config.beta,
                )
                (loss * mb.shape[0] * scale).backward()
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value * mb.shape[0] * scale
        return totals

    def end_iteration(self, policy: nn.Module, iteration: int) -> dict[str, float]:
        ramp = max(0.0, iteration - self.config.ema_decay_flat)  # DiffusionNFT's decay types: a flat start, a ramp
        decay = min(self.config.ema_decay_max, self.config.ema_decay_rate * ramp)
        self.old.ema_update(decay)
        return {"nft/ema_decay": decay}
