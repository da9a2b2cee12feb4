"""V-GRPO (Tang et al. 2026, arXiv 2604.23380): GRPO on final samples with a variance-reduced ELBO surrogate.

The approach of the paper's Sec. 4, with the variance reduction of Sec. 4.4 and the gradient-step control of
Sec. 4.5. Per iteration:

1. rollout: Euler ODE from noise; only the final latents ``o_i`` are kept (the whole generation is
   one action, so any sampler works);
2. prepare: draw the N_MC shared timestep-noise pairs and compute, without gradient, the old
   surrogates ``s_ij(theta_old)`` (and ``x0_hat_old`` when the KL is on, ``x0_hat_ref`` under the
   stage's starting weights when the reference KL is on): the :class:`VGRPOPayload`;
3. gradient steps on the clipped objective with ``rho_i = exp(mean_j s_ij - mean_j s_ij_old)``,
   plus ``beta KL(theta, theta_old) + beta_ref KL(theta, theta_ref)``, both in Eq. (16)'s x-space form.

Memory-bounded update (``memory_bounded=True``): the objective is a function of the per-sample
means ``mean_j s_ij`` only, so its gradient is ``sum_ij c_i grad s_ij`` with
``c_i = dL/ds_ij`` (:func:`vgrpo.losses.vgrpo_surrogate_coefficients`). Pass 1 computes
``s_ij(theta)`` without a graph to get ``rho_i`` and ``c_i``; pass 2 backwards
``sum_i c_i s_ij (+ beta KL_ij)`` one pair and one micro-batch at a time, so at most one
micro-batch graph is alive. At step 0 the weights equal theta_old, so pass 1 is skipped and the
old surrogates are used (``rho = 1`` exactly). ``tests/algorithms/test_vgrpo.py`` pins that this
equals the full-graph gradient. ``memory_bounded: auto`` takes the full graph where its measured size fits a memory
budget (:mod:`vgrpo.algorithms.update_memory`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
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
from vgrpo.algorithms.config import NaiveELBOConfig, VGRPOConfig
from vgrpo.algorithms.update_memory import (
    MB,
    UpdateMemoryChoice,
    available_memory_bytes,
    choose_update,
    saved_tensor_bytes,
)
from vgrpo.losses import clipped_policy_loss, vgrpo_loss, vgrpo_ratio, vgrpo_surrogate_coefficients
from vgrpo.pairs import SharedPairs, draw_pairs
from vgrpo.policy import Conditioning
from vgrpo.surrogate import SurrogateTerms, elbo_surrogate

__all__ = ["VGRPO", "VGRPOBatch", "VGRPOPayload", "surrogate_cv"]


def surrogate_cv(surrogates: Tensor, group_size: int) -> dict[str, float]:
    """V-GRPO Sec. 4 variance statistics of the per-sample surrogate magnitude ``|mean_j s_ij|``.

    Returns the overall coefficient of variation (paper, FLUX: naive 0.230 -> V-GRPO 0.128) and the
    mean within-group CV (0.170 -> 0.038). ``surrogates``: ``(N, N_MC)``.
    """
    mag = surrogates.detach().float().mean(dim=1).abs()
    overall = mag.std(unbiased=False) / mag.mean().clamp(min=1e-12)
    grouped = mag.reshape(-1, group_size)
    within = grouped.std(dim=1, unbiased=False) / grouped.mean(dim=1).clamp(min=1e-12)
    return {
        "surrogate/mean": surrogates.mean().item(),
        "surrogate/cv": overall.item(),
        "surrogate/cv_within_group": within.mean().item(),
    }


@dataclass(frozen=True)
class VGRPOPayload(Payload):
    """What V-GRPO's gradient steps compare against, for this rank's ``N`` samples.

    Attributes:
        pairs: the iteration's timestep-noise pairs (this rank's rows).
        old_surrogates: ``(N, N_MC)`` ``s_ij(theta_old)``.
        old_x0_hat: ``(N, N_MC, *S)`` the behaviour policy's x-prediction when the KL is on, else None.
        ref_x0_hat: ``(N, N_MC, *S)`` the reference's x-prediction when the reference KL is on, else None.
        ref_kl_weights: ``(N,)`` the reference KL's weight of each sample (a stage's replay), else None (1 each).
    """

    pairs: SharedPairs
    old_surrogates: Tensor
    old_x0_hat: Tensor | None
    ref_x0_hat: Tensor | None
    ref_kl_weights: Tensor | None = None


VGRPOBatch = PreparedBatch[VGRPOPayload]


class VGRPO(Algorithm[VGRPOPayload]):
    """V-GRPO and, with its techniques switched off, the naive ELBO-GRPO baseline."""

    name = "vgrpo"
    weighs_ref_kl = True
    config: VGRPOConfig | NaiveELBOConfig

    def __init__(self, config: VGRPOConfig | NaiveELBOConfig, *, policy: nn.Module, **kwargs: Any):
        super().__init__(config, **kwargs)
        # The reference is the weights at construction: the stage's starting adapter (for the first stage of a
        # LoRA run, the base model). The paper's V-GRPO has no reference term; it is an option against drift.
        self.reference = self.keep_snapshot("reference", policy) if config.ref_kl_coef > 0 else None
        if self.reference is not None and config.ref_kl_reference == "base":
            zero_lora_deltas(self.reference, policy)
        # memory_bounded: auto measures the update's graph at the first gradient step and keeps the choice.
        self.update_choice: UpdateMemoryChoice | None = None

    # 1. rollout ------------------------------------------------------------------------------
    def rollout(
        self, policy: nn.Module, cond: Conditioning, noise: Tensor, generator: torch.Generator, iteration: int
    ) -> Rollout:
        return self.ode_rollout(policy, cond, noise)

    # 2. pairs and old surrogates -------------------------------------------------------------
    def pair_terms(
        self, policy: nn.Module, samples: Tensor, cond: Conditioning, pairs: SharedPairs, j: int, idx: Tensor
    ) -> SurrogateTerms:
        """``s_ij`` for samples ``idx`` at pair ``j`` (with gradient if enabled)."""
        x0, t, eps, z = pairs.noised(j, idx, samples)
        v = policy(z, t, cond.index(idx))
        return elbo_surrogate(
            v_pred=v,
            x0=x0,
            eps=eps,
            t=t,
            prediction=self.config.prediction,
            self_normalize=self.config.self_normalize,
        )

    @torch.no_grad()
    def current_surrogates(
        self,
        policy: nn.Module,
        samples: Tensor,
        cond: Conditioning,
        pairs: SharedPairs,
        idx: Tensor,
        *,
        keep_x0_hat: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``(len(idx), N_MC)`` surrogates without graph, and ``x0_hat`` ``(len(idx), N_MC, *S)`` if asked."""
        n_mc = pairs.n_mc
        s = torch.empty(idx.shape[0], n_mc)
        x0_hat = torch.empty(idx.shape[0], n_mc, *samples.shape[1:]) if keep_x0_hat else None
        for j in range(n_mc):
            for mb, pos in micro_batches(idx, self.train_micro_batch):
                terms = self.pair_terms(policy, samples, cond, pairs, j, mb)
                s[pos, j] = terms.surrogate.cpu()
                if x0_hat is not None:
                    x0_hat[pos, j] = terms.x0_hat.cpu()
        return s, x0_hat

    def precompute(
        self, policy: nn.Module, scored: ScoredRollout, generator: torch.Generator
    ) -> tuple[VGRPOPayload, dict[str, float]]:
        samples, cond = scored.rollout.samples, scored.cond
        num_samples = samples.shape[0]
        # The pairs of the global batch (the same draw on every rank keeps the shared generator aligned), then
        # this rank's rows; the surrogate CV is a statistic of the global batch, so it sees every rank's values.
        global_samples = num_samples * self.dist.world_size
        pairs = draw_pairs(
            num_prompts=global_samples // self.group_size,
            group_size=self.group_size,
            n_mc=self.config.n_mc,
            latent_shape=self.latent_shape,
            share=self.config.share,
            timestep_sampling=self.config.timestep_sampling,
            sigmas=self.sigmas,
            generator=generator,
            logit_normal_mean=self.config.logit_normal_mean,
            logit_normal_std=self.config.logit_normal_std,
        )
        pairs = self.local_pairs(pairs, num_samples)
        every = torch.arange(num_samples)
        old_s, old_x0_hat = self.current_surrogates(
            policy, samples, cond, pairs, every, keep_x0_hat=self.config.kl_coef > 0
        )
        ref_x0_hat = None
        if self.reference is not None:
            with self.reference.swapped_in():
                ref_x0_hat = self.current_surrogates(policy, samples, cond, pairs, every, keep_x0_hat=True)[1]
        if scored.ref_kl_weights is not None and self.reference is None:
            raise ValueError("ref_kl_weights weight the reference KL: set algorithm.ref_kl_coef > 0")
        payload = VGRPOPayload(
            pairs=pairs,
            old_surrogates=old_s,
            old_x0_hat=old_x0_hat,
            ref_x0_hat=ref_x0_hat,
            ref_kl_weights=scored.ref_kl_weights,
        )
        return payload, surrogate_cv(self.dist.gather(old_s), self.group_size)

    # 3. gradient steps -----------------------------------------------------------------------
    def accumulate_gradients(self, policy: nn.Module, batch: VGRPOBatch, idx: Tensor, step: int) -> dict[str, float]:
        if self.config.memory_bounded != "auto":
            if self.config.memory_bounded:
                return self._two_pass(policy, batch, idx, step)
            return self._full_graph(policy, batch, idx)
        if self.update_choice is None:
            self.update_choice = self._measure_update(policy, batch, idx)
        if self.update_choice.full_graph:
            metrics = self._full_graph(policy, batch, idx)
        else:
            metrics = self._two_pass(policy, batch, idx, step)
        return {**metrics, **self.update_choice.metrics()}

    def _measure_update(self, policy: nn.Module, batch: VGRPOBatch, idx: Tensor) -> UpdateMemoryChoice:
        """``memory_bounded: auto``: one (pair, micro-batch) graph's saved tensors, measured once (the shapes are
        the run's), against ``update_memory_mb``; the full graph only where it fits on every rank."""
        mb = idx[: self.train_micro_batch]
        pairs = batch.payload.pairs
        _, graph_bytes = saved_tensor_bytes(
            lambda: self.pair_terms(policy, batch.samples, batch.cond, pairs, 0, mb).surrogate,
            exclude=policy.parameters(),
        )
        budget_mb = self.config.update_memory_mb
        if budget_mb is None:
            budget_mb = available_memory_bytes(batch.samples.device) / 2 / MB
        choice = choose_update(
            graph_bytes=graph_bytes,
            n_mc=pairs.n_mc,
            num_samples=idx.shape[0],
            micro_batch=self.train_micro_batch,
            budget_mb=budget_mb,
        )
        full_graph = not self.dist.any(not choice.full_graph)
        return dataclasses.replace(choice, full_graph=full_graph)

    @staticmethod
    def _kl(terms: SurrogateTerms, other_x0_hat: Tensor | None, pos: slice, j: int) -> Tensor | None:
        """Eq. (16) per sample: ``mean_d (x0_hat_theta - x0_hat_other)^2`` at pair j, ``(b,)``; ``other`` is the
        behaviour policy's (``x0_hat_old``) or the reference's (``x0_hat_ref``) prediction."""
        if other_x0_hat is None:
            return None
        diff = terms.x0_hat - other_x0_hat[pos, j].to(terms.x0_hat.device)
        return (diff**2).mean(dim=tuple(range(1, diff.ndim)))

    def _full_graph(self, policy: nn.Module, batch: VGRPOBatch, idx: Tensor) -> dict[str, float]:
        """Reference path: every pair's graph alive at once (micro-batched forwards, one backward),
        loss by :func:`vgrpo.losses.vgrpo_loss`."""
        pairs = batch.payload.pairs
        old_x0_hat, ref_x0_hat = self._targets(batch, idx)
        ref_weights = None if batch.payload.ref_kl_weights is None else batch.payload.ref_kl_weights[idx]
        s_cols, kl_cols, ref_cols = [], [], []
        for j in range(pairs.n_mc):
            s_parts, kl_parts, ref_parts = [], [], []
            for mb, pos in micro_batches(idx, self.train_micro_batch):
                terms = self.pair_terms(policy, batch.samples, batch.cond, pairs, j, mb)
                s_parts.append(terms.surrogate)
                kl = self._kl(terms, old_x0_hat, pos, j)
                if kl is not None:
                    kl_parts.append(kl)
                kl_ref = self._kl(terms, ref_x0_hat, pos, j)
                if kl_ref is not None:
                    ref_parts.append(kl_ref)
            s_cols.append(torch.cat(s_parts))
            if kl_parts:
                kl_cols.append(torch.cat(kl_parts))
            if ref_parts:
                ref_cols.append(torch.cat(ref_parts))
        s = torch.stack(s_cols, dim=1)
        loss, metrics = vgrpo_loss(
            surrogates=s,
            old_surrogates=batch.payload.old_surrogates[idx].to(s.device),
            advantages=batch.advantages[idx].to(s.device),
            clip_range=self.config.clip_range,
            kl=torch.stack(kl_cols, dim=1) if kl_cols else None,
            kl_coef=self.config.kl_coef,
        )
        if ref_cols:
            kl_ref = torch.stack(ref_cols, dim=1)
            if ref_weights is not None:  # a stage's replay: the KL where it weighs (vgrpo.training.replay)
                kl_ref = kl_ref * ref_weights.to(kl_ref.device)[:, None]
            kl_ref_mean = kl_ref.mean()
            loss = loss + self.config.ref_kl_coef * kl_ref_mean
            metrics.update({"kl_ref": kl_ref_mean.item(), "loss": loss.item()})
        loss.backward()
        return metrics

    @staticmethod
    def _targets(batch: VGRPOBatch, idx: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """``x0_hat_old`` and ``x0_hat_ref`` of the minibatch ``idx`` (None where that KL is off)."""
        old, ref = batch.payload.old_x0_hat, batch.payload.ref_x0_hat
        return (None if old is None else old[idx]), (None if ref is None else ref[idx])

    def _two_pass(self, policy: nn.Module, batch: VGRPOBatch, idx: Tensor, step: int) -> dict[str, float]:
        pairs = batch.payload.pairs
        old_s = batch.payload.old_surrogates[idx]
        old_x0_hat, ref_x0_hat = self._targets(batch, idx)
        ref_weights = None if batch.payload.ref_kl_weights is None else batch.payload.ref_kl_weights[idx]
        advantages = batch.advantages[idx].float().cpu()
        # Pass 1: rho and dL/ds without a graph (theta == theta_old at step 0, so rho = 1 exactly).
        s_now = old_s if step == 0 else self.current_surrogates(policy, batch.samples, batch.cond, pairs, idx)[0]
        ratio = vgrpo_ratio(surrogates=s_now, old_surrogates=old_s)
        _, metrics = clipped_policy_loss(ratio=ratio, advantages=advantages, clip_range=self.config.clip_range)
        coef = vgrpo_surrogate_coefficients(
            ratio=ratio,
            advantages=advantages,
            clip_range=self.config.clip_range,
            n_mc=pairs.n_mc,
            num_samples=idx.shape[0],
        )
        # Pass 2: one graph per (pair, micro-batch), gradients accumulate in .grad.
        kl_sum = ref_sum = 0.0
        terms_count = pairs.n_mc * idx.shape[0]
        for j in range(pairs.n_mc):
            for mb, pos in micro_batches(idx, self.train_micro_batch):
                terms = self.pair_terms(policy, batch.samples, batch.cond, pairs, j, mb)
                objective = (coef[pos].to(terms.surrogate.device) * terms.surrogate).sum()
                kl = self._kl(terms, old_x0_hat, pos, j)
                if kl is not None:
                    objective = objective + self.config.kl_coef / terms_count * kl.sum()
                    kl_sum += kl.detach().sum().item()
                kl_ref = self._kl(terms, ref_x0_hat, pos, j)
                if kl_ref is not None:
                    if ref_weights is not None:  # a stage's replay (vgrpo.training.replay)
                        kl_ref = kl_ref * ref_weights[pos].to(kl_ref.device)
                    objective = objective + self.config.ref_kl_coef / terms_count * kl_ref.sum()
                    ref_sum += kl_ref.detach().sum().item()
                objective.backward()
        kl_mean, ref_mean = kl_sum / terms_count, ref_sum / terms_count
        loss = metrics["policy_loss"] + self.config.kl_coef * kl_mean + self.config.ref_kl_coef * ref_mean
        metrics.update({"kl": kl_mean, "loss": loss})
        if ref_x0_hat is not None:
            metrics["kl_ref"] = ref_mean
        return metrics
