"""Bootstrap confidence intervals for evaluation means and for gains between two evaluations.

An evaluation scores ``group_size`` images per prompt with fixed seeds; the unit that is resampled is the
prompt (its images share the prompt's difficulty), so every interval here is a bootstrap over prompts
(Efron & Tibshirani 1993, the percentile interval). GenEval's overall score is the mean of per-tag accuracies
(Ghosh et al. 2023): its bootstrap resamples prompts within each tag (stratified), so every replicate keeps the
tag counts of the evaluation. A gain between two evaluations of the same prompts and seeds is a paired
difference: the per-prompt differences are resampled, which removes the prompts' shared difficulty from the
interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["bootstrap_ci", "stratified_mean"]


def stratified_mean(values: np.ndarray, strata: Sequence[str] | np.ndarray | None = None) -> float:
    """Mean of ``values`` ``(P,)``; with ``strata`` (one label per value) the mean of the per-stratum means."""
    values = np.asarray(values, dtype=np.float64)
    if strata is None:
        return float(values.mean())
    labels = np.asarray(strata)
    return float(np.mean([values[labels == s].mean() for s in dict.fromkeys(labels.tolist())]))


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    strata: Sequence[str] | np.ndarray | None = None,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`stratified_mean` over ``values`` ``(P,)``, one value per prompt.

    Args:
        values: per-prompt scores (for a gain: the per-prompt differences of two evaluations of the same prompts).
        strata: a label per prompt; prompts are resampled within their stratum, and the statistic is the mean
            of the stratum means (GenEval's overall score over tags). ``None``: the plain mean.
        level: coverage of the interval.
        n_boot: bootstrap replicates.
        seed: the resampling seed, so that a table is reproducible.

    Returns:
        ``(low, high)``; both equal the mean when there is a single prompt per stratum or no spread.

    Raises:
        ValueError: on no values, a ``strata`` of another length or a ``level`` outside (0, 1).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D array of per-prompt values, got shape {x.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if strata is None:
        labels = np.zeros(x.size, dtype=np.int64)
    else:
        labels = np.unique(np.asarray(strata), return_inverse=True)[1]
    if labels.size != x.size:
        raise ValueError(f"strata has {labels.size} labels for {x.size} values")
    rng = np.random.default_rng(seed)
    stats = np.zeros(n_boot)
    groups = [x[labels == k] for k in range(int(labels.max()) + 1)]
    for g in groups:
        draws = rng.integers(0, g.size, size=(n_boot, g.size))
        stats += g[draws].mean(axis=1)
    stats /= len(groups)
    alpha = (1 - level) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return float(low), float(high)
