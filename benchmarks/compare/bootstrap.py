"""The benchmark's statistics: bootstrap over prompts and seeds, paired across methods, and time-to-reward read
off interpolated curves.

Every evaluation point of every cell scores the same prompts with the same sampling seeds, so a per-prompt score
array ``(P,)`` lines up across cells. A replicate draws prompts with replacement within each tag (GenEval's
overall score is the mean of its per-tag means, Ghosh et al. 2023) -- the same draw for every method, which pairs
the comparison on prompts -- and, for each group of seeds, its seeds with replacement
(:class:`benchmarks.compare.analysis.Analysis`). Because the stratified mean is linear in the scores, a replicate of
prompts is a weight vector, and a seed's replicate curve is a weighted sum.
Intervals are percentile intervals (Efron & Tibshirani 1993).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "first_crossing",
    "interval",
    "point_weights",
    "prompt_weights",
]


def point_weights(tags: Sequence[str]) -> np.ndarray:
    """Weights ``(P,)`` with ``w @ x`` = the mean over tags of the per-tag mean of ``x``."""
    labels = np.asarray(tags)
    kinds = list(dict.fromkeys(labels.tolist()))
    w = np.zeros(labels.size)
    for k in kinds:
        mask = labels == k
        w[mask] = 1.0 / (mask.sum() * len(kinds))
    return w


def prompt_weights(tags: Sequence[str], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, P)`` weights, one resample of the prompts within each tag per row (rows sum to 1)."""
    labels = np.asarray(tags)
    kinds = list(dict.fromkeys(labels.tolist()))
    w = np.zeros((n_boot, labels.size))
    for k in kinds:
        idx = np.flatnonzero(labels == k)
        draws = rng.integers(0, idx.size, size=(n_boot, idx.size))  # positions within the tag
        flat = (np.arange(n_boot)[:, None] * idx.size + draws).ravel()
        counts = np.bincount(flat, minlength=n_boot * idx.size).reshape(n_boot, idx.size)
        # A prompt drawn c times carries c repeated additions of its share (cumsum adds in order), not c times it:
        # the same floating-point weights as adding the share once per draw, so the replicates do not move.
        share = np.concatenate([[0.0], np.cumsum(np.full(idx.size, 1.0 / (idx.size * len(kinds))))])
        w[:, idx] = share[counts]
    return w


def first_crossing(xs: np.ndarray, ys: np.ndarray, level: np.ndarray | float) -> np.ndarray:
    """Where the piecewise-linear curve through ``(xs, ys)`` first reaches ``level``; ``inf`` where it never does.

    Args:
        xs: ``(K,)`` increasing; ``ys``: ``(..., K)``; ``level``: broadcastable to ``ys[..., 0]``.
    """
    ys = np.asarray(ys, dtype=np.float64)
    level = np.broadcast_to(np.asarray(level, dtype=np.float64), ys.shape[:-1])
    out = np.full(ys.shape[:-1], np.inf)
    done = ys[..., 0] >= level
    out[done] = xs[0]
    for k in range(1, ys.shape[-1]):
        lo, hi = ys[..., k - 1], ys[..., k]
        hit = ~done & (hi >= level)
        frac = np.where(hit, (level - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
        out = np.where(hit, xs[k - 1] + np.clip(frac, 0.0, 1.0) * (xs[k] - xs[k - 1]), out)
        done |= hit
    return out


def interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of replicates that may hold ``inf`` (a target never reached): quantiles of the
    empirical distribution itself, so an interval end is ``inf`` when that share of replicates never reached it."""
    v = np.sort(np.asarray(values, dtype=np.float64).ravel())
    v = v[~np.isnan(v)]
    alpha = (1 - level) / 2
    low, high = np.quantile(v, [alpha, 1 - alpha], method="inverted_cdf")
    return float(low), float(high)
