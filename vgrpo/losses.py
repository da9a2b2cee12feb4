"""Policy losses as pure functions of tensors: the PPO clip shared by V-GRPO and Flow-GRPO, the
V-GRPO objective over Monte Carlo surrogates, and DiffusionNFT's positive/negative loss.

Every function takes keyword-only tensors and scalars, computes ratios in float32 and returns
``(loss, metrics)``: a scalar with gradient and a flat dict of detached floats (style rule 4).
"""

from __future__ import annotations

import torch
from torch import Tensor

from vgrpo.surrogate import elbo_surrogate

__all__ = [
    "clipped_policy_loss",
    "flow_grpo_loss",
    "nft_loss",
    "ratio_metrics",
    "vgrpo_loss",
    "vgrpo_ratio",
    "vgrpo_surrogate_coefficients",
]


def _clip_active(ratio: Tensor, advantages: Tensor, clip_range: float | None) -> Tensor:
    """Where the unclipped PPO branch carries the gradient (False where the clip has taken over)."""
    if clip_range is None:
        return torch.ones_like(ratio, dtype=torch.bool)
    clipped_high = (ratio > 1 + clip_range) & (advantages > 0)
    clipped_low = (ratio < 1 - clip_range) & (advantages < 0)
    return ~(clipped_high | clipped_low)


def _add_kl(
    loss: Tensor, metrics: dict[str, float], kl: Tensor | None, kl_coef: float
) -> tuple[Tensor, dict[str, float]]:
    """``loss + kl_coef * mean(kl)``, recording ``kl`` and the total ``loss`` in ``metrics``."""
    kl_value = torch.zeros((), device=loss.device) if kl is None else kl.float().mean()
    if kl_coef:
        loss = loss + kl_coef * kl_value
    metrics.update({"kl": kl_value.item(), "loss": loss.item()})
    return loss, metrics


def ratio_metrics(ratio: Tensor, clip_range: float | None) -> dict[str, float]:
    """Ratio diagnostics: mean/min/max, the spread (population std, and ``ratio_dev_sq`` ``E[(r - 1)^2]``, which
    averages exactly over ranks, so the batch's std can be rebuilt from it and the mean when sharded:
    :func:`vgrpo.training.update_stats.step_summary`), k3 approximate KL ``E[(r - 1) - log r]``, clip fractions."""
    r = ratio.detach().float()
    metrics = {
        "ratio_mean": r.mean().item(),
        "ratio_std": r.std(correction=0).item(),
        "ratio_dev_sq": (r - 1).pow(2).mean().item(),
        "ratio_min": r.min().item(),
        "ratio_max": r.max().item(),
        "approx_kl": ((r - 1) - torch.log(r)).mean().item(),
    }
    eps = float("inf") if clip_range is None else clip_range
    metrics["clip_frac_low"] = (r < 1 - eps).float().mean().item()
    metrics["clip_frac_high"] = (r > 1 + eps).float().mean().item()
    metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    return metrics


def clipped_policy_loss(
    *, ratio: Tensor, advantages: Tensor, clip_range: float | None
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped objective in GRPO's form (V-GRPO Sec. 4.5, ratio clipping):
    ``mean max(-A r, -A clip(r, 1 - eps_c, 1 + eps_c))``; ``clip_range=None`` is plain ``mean(-A r)``.

    Args:
        ratio: any shape, broadcastable with ``advantages`` (``(M,)`` for V-GRPO, ``(M,)`` per step
            for Flow-GRPO).
        advantages: same shape as ``ratio`` (detached).
    """
    if clip_range is not None and clip_range <= 0:
        raise ValueError(f"clip_range must be > 0 or None, got {clip_range}")
    ratio32, adv = ratio.float(), advantages.detach().float()
    unclipped = -adv * ratio32
    if clip_range is None:
        loss = unclipped.mean()
    else:
        clipped = -adv * ratio32.clamp(1 - clip_range, 1 + clip_range)
        loss = torch.maximum(unclipped, clipped).mean()
    return loss, {"policy_loss": loss.item(), **ratio_metrics(ratio32, clip_range)}


def vgrpo_ratio(*, surrogates: Tensor, old_surrogates: Tensor) -> Tensor:
    """V-GRPO importance ratio (V-GRPO Sec. 4): ``rho_i = exp(mean_j s_ij - mean_j s_ij_old)``.

    The Monte Carlo mean sits *inside* the exponential. Shapes ``(M, N_MC) -> (M,)``, float32.
    """
    if surrogates.shape != old_surrogates.shape:
        raise ValueError(f"surrogates {tuple(surrogates.shape)} vs old {tuple(old_surrogates.shape)}")
    return torch.exp(surrogates.float().mean(dim=1) - old_surrogates.detach().float().mean(dim=1))


def vgrpo_loss(
    *,
    surrogates: Tensor,
    old_surrogates: Tensor,
    advantages: Tensor,
    clip_range: float | None,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """V-GRPO objective with the KL of Eq. 16 (V-GRPO Sec. 4.5), in the naive full-graph form (see
    :mod:`vgrpo.algorithms.vgrpo` for the memory-bounded update that gives the same gradient)::

        L = mean_i max(-A_i rho_i, -A_i clip(rho_i, 1 - eps_c, 1 + eps_c)) + beta KL
        KL = mean_i mean_j mean_d (x0_hat_theta(z_ij) - x0_hat_old(z_ij))^2      (Eq. 16)

    Args:
        surrogates: ``(M, N_MC)`` ``s_ij(theta)`` with gradient.
        old_surrogates: ``(M, N_MC)`` ``s_ij(theta_old)``.
        advantages: ``(M,)``.
        kl: ``(M, N_MC)`` per-pair ``mean_d (x0_hat_theta - x0_hat_old)^2`` with gradient, or None.
        kl_coef: ``beta``.
    """
    ratio = vgrpo_ratio(surrogates=surrogates, old_surrogates=old_surrogates)
    loss, metrics = clipped_policy_loss(ratio=ratio, advantages=advantages, clip_range=clip_range)
    return _add_kl(loss, metrics, kl, kl_coef)


def vgrpo_surrogate_coefficients(
    *, ratio: Tensor, advantages: Tensor, clip_range: float | None, n_mc: int, num_samples: int
) -> Tensor:
    """``dL / ds_ij`` of :func:`vgrpo_loss`'s policy term, the same for every pair j: ``(M,)``.

    ``dL/ds_ij = (1 / M) * (-A_i) * 1[unclipped branch active] * rho_i / N_MC``, so one backward of
    ``sum_i c_i s_ij`` per pair reproduces the full-graph gradient (memory-bounded update).
    """
    r, adv = ratio.detach().float(), advantages.detach().float()
    active = _clip_active(r, adv, clip_range).float()
    return -adv * active * r / (n_mc * num_samples)


def flow_grpo_loss(
    *,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    clip_range: float | None,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Flow-GRPO per-step objective (Flow-GRPO, Liu et al. 2025): ``r = exp(log p_theta - log p_old)`` per
    (sample, step), PPO clip, plus ``beta * ||mu_theta - mu_ref||^2 / (2 std^2)`` to the reference.

    Args:
        log_probs: ``(M,)`` log-probabilities of stored transitions under theta (with gradient).
        old_log_probs: ``(M,)`` the same under the rollout policy.
        advantages: ``(M,)`` (already clamped).
        kl: ``(M,)`` per-transition KL to the reference, or None.
    """
    ratio = torch.exp(log_probs.float() - old_log_probs.detach().float())
    loss, metrics = clipped_policy_loss(ratio=ratio, advantages=advantages, clip_range=clip_range)
    return _add_kl(loss, metrics, kl, kl_coef)


def nft_loss(
    *,
    v_theta: Tensor,
    v_old: Tensor,
    x0: Tensor,
    eps: Tensor,
    t: Tensor,
    reward_weight: Tensor,
    beta: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """DiffusionNFT objective (Zheng et al. 2025), at one timestep-noise pair per sample.

    ``v+ = b v_theta + (1 - b) sg(v_old)``, ``v- = (1 + b) sg(v_old) - b v_theta``, each trained with
    the self-normalised x-loss and weighted ``r`` and ``1 - r``; ``r = clip(A / A_max / 2 + 0.5, 0, 1)``.

    Args:
        v_theta: ``(M, *S)`` with gradient; v_old: ``(M, *S)`` the old policy's velocity.
        reward_weight: ``(M,)`` ``r`` in [0, 1].
    """
    v_old = v_old.detach()
    v_pos = beta * v_theta + (1 - beta) * v_old
    v_neg = (1 + beta) * v_old - beta * v_theta
    # The self-normalised x-loss is the negated V-GRPO surrogate: one implementation of it.
    loss_pos = -elbo_surrogate(v_pred=v_pos, x0=x0, eps=eps, t=t).surrogate
    loss_neg = -elbo_surrogate(v_pred=v_neg, x0=x0, eps=eps, t=t).surrogate
    r = reward_weight.detach().float()
    loss = (r * loss_pos + (1 - r) * loss_neg).mean()
    return loss, {
        "loss": loss.item(),
        "policy_loss": loss.item(),
        "nft_loss_pos": loss_pos.detach().mean().item(),
        "nft_loss_neg": loss_neg.detach().mean().item(),
    }
