"""Diagnostics of an iteration's gradient steps: the per-step metrics summarised over the steps, and how far the
steps moved the trainable weights. Read-only: they copy and measure, never touch the weights, the gradients or
a random generator, so logging them changes no number of the run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

__all__ = ["ENDS", "step_summary", "update_norms", "weights_before"]

ENDS = ("ratio_mean", "ratio_max", "ratio_min", "ratio_std", "clip_frac")
"""Per-step metrics also kept at the first and the last gradient step (``train/<key>_first``, ``_last``): at the
first step the weights still equal the rollout's (a ratio of exactly 1 for the ratio-based methods), so the
last step shows how far the policy has moved off it within the iteration."""


def step_summary(per_step: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """``train/<key>``: each per-step metric's mean over the iteration's gradient steps; ``train/<key>_first`` and
    ``_last`` for the keys of :data:`ENDS` a method reports (one without a ratio, DiffusionNFT, has none).

    Each step's ratio std is rebuilt from the step's ratio mean and ``ratio_dev_sq`` (``E[(r - 1)^2]``), which the
    ranks' means reduce exactly where their stds do not: ``std^2 = E[(r - 1)^2] - (E[r] - 1)^2``."""
    per_step = dict(per_step)
    if "ratio_dev_sq" in per_step and "ratio_mean" in per_step:
        pairs = zip(per_step.pop("ratio_dev_sq"), per_step["ratio_mean"], strict=True)
        per_step["ratio_std"] = [math.sqrt(max(0.0, dev_sq - (mean - 1) ** 2)) for dev_sq, mean in pairs]
    metrics = {f"train/{key}": sum(values) / len(values) for key, values in per_step.items()}
    for key in ENDS:
        if key in per_step:
            metrics[f"train/{key}_first"] = per_step[key][0]
            metrics[f"train/{key}_last"] = per_step[key][-1]
    return metrics


@torch.no_grad()
def weights_before(params: Sequence[nn.Parameter]) -> list[Tensor]:
    """Detached copies of the trainable weights before the iteration's optimizer steps (LoRA adapters are a
    small share of the model; a full fine-tune copies the whole transformer once per iteration)."""
    return [p.detach().clone() for p in params]


@torch.no_grad()
def update_norms(before: Sequence[Tensor], params: Sequence[nn.Parameter]) -> dict[str, float]:
    """How far the iteration's optimizer steps moved the trainable weights, in float32 over all of them as one
    vector: ``update/norm`` ``||theta_after - theta_before||_2``, ``update/param_norm`` ``||theta_before||_2`` and
    ``update/norm_rel``, their ratio (0 when the weights are all zero)."""
    if not params:
        return {"update/norm": 0.0, "update/param_norm": 0.0, "update/norm_rel": 0.0}
    delta_sq, param_sq = [], []
    for old, p in zip(before, params, strict=True):
        old32 = old.float()
        delta_sq.append((p.detach().float() - old32).pow(2).sum())
        param_sq.append(old32.pow(2).sum())
    # one sum per quantity on the weights' device, so one synchronisation, not one per tensor
    norm, param_norm = torch.stack(delta_sq).sum().sqrt().item(), torch.stack(param_sq).sum().sqrt().item()
    return {
        "update/norm": norm,
        "update/param_norm": param_norm,
        "update/norm_rel": norm / param_norm if param_norm > 0 else 0.0,
    }
