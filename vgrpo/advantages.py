"""GRPO advantages: group-relative normalisation, multi-reward aggregation and clipping.

Samples are laid out prompt-major: sample ``i`` belongs to prompt ``i // G`` (``G`` = group size),
so a ``(B * G,)`` vector reshapes to ``(B, G)``. Shared by V-GRPO and every baseline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "AdvantageResult",
    "clamp_advantages",
    "clipping_metrics",
    "compute_advantages",
    "group_normalize",
    "scored_samples",
    "soft_clip_advantages",
    "unscored_samples",
    "zero_variance_groups",
]

StdScope = Literal["group", "global"]
Aggregation = Literal["normalize_then_sum", "sum_then_normalize"]


def _grouped(values: Tensor, group_size: int) -> Tensor:
    if values.ndim != 1:
        raise ValueError(f"expected a (B * G,) vector, got shape {tuple(values.shape)}")
    if group_size < 2 or values.shape[0] % group_size:
        raise ValueError(f"{values.shape[0]} samples do not split into groups of {group_size} (need G >= 2)")
    return values.reshape(-1, group_size)


def zero_variance_groups(rewards: Tensor, group_size: int, *, atol: float = 1e-8) -> Tensor:
    """``(B,)`` bool: groups whose rewards are all equal (they carry no learning signal)."""
    grouped = _grouped(rewards.float(), group_size)
    return (grouped.max(dim=1).values - grouped.min(dim=1).values) <= atol


def group_normalize(
    rewards: Tensor, group_size: int, *, std_scope: StdScope = "group", delta: float = 1e-4, ddof: int = 0
) -> Tensor:
    """GRPO advantage (Shao et al. 2024; V-GRPO Sec. 3): ``A_i = (r_i - mean_g r) / (std r + delta)``.

    Args:
        rewards: ``(B * G,)``.
        std_scope: ``"group"`` (per-prompt std, GRPO) or ``"global"`` (one std over the whole batch,
            Flow-GRPO's default).
        delta: keeps near-constant groups finite.
        ddof: the std's delta degrees of freedom: 0 = population std (Flow-GRPO's ``np.std``), 1 = unbiased
            (``torch.std``, as the FastVideo-based GRPO code of DanceGRPO and MixGRPO divides).

    Returns:
        ``(B * G,)`` float32 advantages; exactly 0 for zero-variance groups (never NaN).
    """
    grouped = _grouped(rewards.float(), group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if std_scope == "group":
        std = grouped.std(dim=1, correction=ddof, keepdim=True)
    elif std_scope == "global":
        std = grouped.std(correction=ddof).expand_as(grouped[:, :1])
    else:
        raise ValueError(f"std_scope must be 'group' or 'global', got {std_scope!r}")
    advantages = centred / (std + delta)
    flat = zero_variance_groups(rewards, group_size)
    advantages = torch.where(flat[:, None], torch.zeros_like(advantages), advantages)
    return advantages.reshape(-1)


def soft_clip_advantages(advantages: Tensor, eta: float) -> Tensor:
    """V-GRPO Eq. (17): ``A <- eta * tanh(A / eta)``; bounded by ``eta``, the identity near 0."""
    if eta <= 0:
        raise ValueError(f"soft-clip eta must be > 0, got {eta}")
    return eta * torch.tanh(advantages / eta)


def clamp_advantages(advantages: Tensor, max_abs: float) -> Tensor:
    """Hard clamp to ``[-max_abs, max_abs]`` (Flow-GRPO's ``adv_clip_max = 5``)."""
    if max_abs <= 0:
        raise ValueError(f"advantage clamp must be > 0, got {max_abs}")
    return advantages.clamp(-max_abs, max_abs)


def unscored_samples(rewards: Tensor, group_size: int) -> Tensor:
    """``(B * G,)`` bool: the samples of the groups ``rewards`` leaves all NaN (prompts the reward does not score:
    :meth:`vgrpo.rewards.base.Reward.applies_to`)."""
    return torch.isnan(_grouped(rewards.float(), group_size)).all(dim=1).repeat_interleave(group_size)


def scored_samples(rewards: Tensor, group_size: int, name: str = "reward") -> Tensor:
    """``(B * G,)`` bool: the samples ``rewards`` scores, whole groups (the complement of :func:`unscored_samples`).

    Raises:
        ValueError: an infinite score, or NaN for part of a group (a reward scores every image of a prompt or none).
    """
    unscored = unscored_samples(rewards, group_size)
    if not bool(torch.isfinite(torch.where(unscored, 0.0, rewards.float())).all()):
        raise ValueError(
            f"reward {name!r} has non-finite scores (infinite, or NaN for part of a prompt's group: a reward scores "
            "every image of a prompt or none)"
        )
    return ~unscored


def clipping_metrics(
    raw: Tensor, before_clamp: Tensor, clipped: Tensor, *, soft_clip_eta: float | None, clamp: float | None
) -> dict[str, float]:
    """How much of the advantages' size the clipping takes: mean ``|A|`` before (``raw``) and after (``clipped``),
    and the share of samples past each clip's knee: soft-clip, ``|A| >= eta`` before it (where ``tanh`` has shrunk
    ``A`` by at least 24%); clamp, ``|A| > max_abs`` on what reaches it (``before_clamp``). A clip that is off
    has no share."""
    metrics = {
        "advantage/abs_mean_before_clip": raw.detach().abs().mean().item(),
        "advantage/abs_mean": clipped.detach().abs().mean().item(),
    }
    if soft_clip_eta is not None:
        metrics["advantage/soft_clip_saturated_frac"] = (raw.detach().abs() >= soft_clip_eta).float().mean().item()
    if clamp is not None:
        metrics["advantage/clamped_frac"] = (before_clamp.detach().abs() > clamp).float().mean().item()
    return metrics


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages and what they were made from.

    Attributes:
        advantages: ``(B * G,)`` float32, after aggregation and clipping.
        total_reward: ``(B * G,)`` the weighted sum of raw rewards (what evaluation reports).
        zero_variance: ``(B,)`` bool, groups whose total reward is constant.
        metrics: flat dict of detached scalars (per-reward mean/std, advantage stats).
    """

    advantages: Tensor
    total_reward: Tensor
    zero_variance: Tensor
    metrics: dict[str, float]


def _scored_total(
    rewards: Mapping[str, Tensor], weights: Mapping[str, float], group_size: int
) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor, dict[str, float]]:
    """Each reward's fp32 scores and the samples it scores, the weighted total over the rewards that score each
    sample, and each reward's mean, std and scored fraction; raises ValueError on weights that do not match the
    rewards or on a sample no reward scores."""
    if not rewards:
        raise ValueError("no rewards given")
    unknown = sorted(set(weights) - set(rewards))
    missing = sorted(set(rewards) - set(weights))
    if unknown or missing:
        raise ValueError(f"reward weights do not match rewards: unknown {unknown}, missing {missing}")
    metrics: dict[str, float] = {}
    total = torch.zeros_like(next(iter(rewards.values())), dtype=torch.float32)
    scores = {name: r.detach().float() for name, r in rewards.items()}
    scored: dict[str, Tensor] = {}
    for name, r32 in scores.items():
        scored[name] = applies = scored_samples(r32, group_size, name)
        total = total + weights[name] * torch.where(applies, r32, 0.0)
        if bool(applies.any()):
            metrics[f"reward/{name}_mean"] = r32[applies].mean().item()
            metrics[f"reward/{name}_std"] = r32[applies].std(unbiased=False).item()
        if not bool(applies.all()):
            metrics[f"reward/{name}_scored_frac"] = applies.float().mean().item()
    unscored = ~torch.stack(list(scored.values())).any(dim=0)
    if bool(unscored.any()):
        first = int(torch.nonzero(unscored)[0]) // group_size
        raise ValueError(f"prompt {first} of the batch is scored by no reward (each reward gave its samples NaN)")
    return scores, scored, total, metrics


def compute_advantages(
    rewards: Mapping[str, Tensor],
    *,
    group_size: int,
    weights: Mapping[str, float] | None = None,
    aggregation: Aggregation = "normalize_then_sum",
    std_scope: StdScope = "group",
    delta: float = 1e-4,
    std_ddof: int = 0,
    soft_clip_eta: float | None = None,
    clamp: float | None = None,
) -> AdvantageResult:
    """Multi-reward GRPO advantages (MixGRPO's per-reward sum; Flow-GRPO's weighted sum normalised once).

    ``normalize_then_sum``: ``A_i = sum_m w_m A_i^m`` (MixGRPO's ``advantage_aggr``);
    ``sum_then_normalize``: normalise ``sum_m w_m r_i^m`` once (Flow-GRPO's ``multi_score``).
    Then optional soft-clipping (V-GRPO Eq. 17) and/or a hard clamp (the baselines).

    A reward that does not apply to a prompt (NaN for its whole group: :meth:`vgrpo.rewards.base.Reward.applies_to`)
    adds nothing to that group's advantage or total; every group must be scored by at least one reward. So one
    batch may mix prompts of several tasks, each scored by its own rewards (a stage that rehearses earlier stages'
    prompts).

    Args:
        rewards: name -> ``(B * G,)`` scores; NaN for every sample of a group the reward does not score.
        weights: name -> weight; default 1 for every reward. A weight for an absent reward is an error.
        std_ddof: the std's delta degrees of freedom (:func:`group_normalize`'s ``ddof``).
    """
    weights = dict(weights) if weights is not None else {name: 1.0 for name in rewards}
    scores, scored, total, metrics = _scored_total(rewards, weights, group_size)

    def normalize(r: Tensor) -> Tensor:
        return group_normalize(r, group_size, std_scope=std_scope, delta=delta, ddof=std_ddof)

    def normalize_scored(name: str) -> Tensor:
        """The reward's advantages on the groups it scores; 0 on the others (it says nothing about them)."""
        out, applies = torch.zeros_like(total), scored[name]
        if bool(applies.any()):
            out[applies] = normalize(scores[name][applies])
        return out

    if aggregation == "normalize_then_sum":
        adv = sum((weights[name] * normalize_scored(name) for name in rewards), start=torch.zeros_like(total))
    elif aggregation == "sum_then_normalize":
        adv = normalize(total)
    else:
        raise ValueError(f"aggregation must be 'normalize_then_sum' or 'sum_then_normalize', got {aggregation!r}")
    raw = adv
    if soft_clip_eta is not None:
        adv = soft_clip_advantages(adv, soft_clip_eta)
    before_clamp = adv
    if clamp is not None:
        adv = clamp_advantages(adv, clamp)
    flat = zero_variance_groups(total, group_size)
    metrics.update(
        {
            "reward/total_mean": total.mean().item(),
            "reward/total_std": total.std(unbiased=False).item(),
            "advantage/mean": adv.mean().item(),
            "advantage/std": adv.std(unbiased=False).item(),
            "advantage/abs_max_before_clip": raw.abs().max().item(),
            "advantage/abs_max": adv.abs().max().item(),
            "advantage/zero_variance_frac": flat.float().mean().item(),
            **clipping_metrics(raw, before_clamp, adv, soft_clip_eta=soft_clip_eta, clamp=clamp),
        }
    )
    return AdvantageResult(advantages=adv, total_reward=total, zero_variance=flat, metrics=metrics)
