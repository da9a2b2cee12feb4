"""The per-iteration diagnostics a cell record carries (one list per diagnostic, one value per iteration, ``None``
where an iteration did not log it) and the training metric each is read from: what a cell writes
(:mod:`benchmarks.compare.cell`) and what the diagnosis reads (:mod:`benchmarks.compare.diagnosis`)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DIAGNOSTICS", "NEW_SERIES", "Diagnostic"]


class Diagnostic(NamedTuple):
    """One per-iteration series: its key in a cell record, the training metric it copies, its label in tables."""

    record_key: str
    metric: str
    label: str


DIAGNOSTICS = (
    Diagnostic("train_reward", "reward/total_mean", "train reward (batch mean)"),
    Diagnostic("surrogate_cv_per_iteration", "surrogate/cv", "surrogate CV, overall"),
    Diagnostic("surrogate_cv_within_group_per_iteration", "surrogate/cv_within_group", "surrogate CV, within group"),
    Diagnostic("grad_norm_per_iteration", "train/grad_norm", "gradient norm (before clipping)"),
    Diagnostic("ratio_std_per_iteration", "train/ratio_std", "ratio std, mean over steps"),
    Diagnostic("ratio_std_last_per_iteration", "train/ratio_std_last", "ratio std, last step"),
    Diagnostic("clip_frac_per_iteration", "train/clip_frac", "ratio clip fraction"),
    Diagnostic("advantage_abs_mean_per_iteration", "advantage/abs_mean", "mean |A| (after clipping)"),
    Diagnostic("advantage_std_per_iteration", "advantage/std", "advantage std"),
    Diagnostic(
        "advantage_soft_clip_saturated_frac_per_iteration",
        "advantage/soft_clip_saturated_frac",
        "share of |A| >= soft-clip eta",
    ),
    Diagnostic("advantage_clamped_frac_per_iteration", "advantage/clamped_frac", "share of |A| past the clamp"),
    Diagnostic(
        "nft_reward_weight_saturated_frac_per_iteration",
        "nft/reward_weight_saturated_frac",
        "share of NFT weights r at 0 or 1",
    ),
    Diagnostic("zero_variance_frac_per_iteration", "advantage/zero_variance_frac", "share of zero-variance groups"),
    Diagnostic("update_norm_per_iteration", "update/norm", "LoRA-update norm"),
    Diagnostic("update_norm_rel_per_iteration", "update/norm_rel", "LoRA-update norm / LoRA norm"),
)
"""In the diagnosis's order; the first four are the series benchmark v3 recorded."""

NEW_SERIES = DIAGNOSTICS[4:]
"""The series a cell record carries since the plateau diagnosis (issue 63); a v3 record has none of them."""
