"""Collapse and spikes: whether a cell collapsed (diverged, or fell too far below the base at some evaluation point)
and how many of its iterations spiked, and Fisher's exact test on two methods' collapse counts with its power."""

from __future__ import annotations

from functools import cache
from math import comb
from typing import Any

import numpy as np
from scipy.stats import fisher_exact

COLLAPSE_DROP = {"geneval": 0.10, "preference": 1.0}
"""A cell collapsed when it diverged or, at any evaluation point, scored more than this below the base on the
same prompts: GenEval strict credit, or world PickScore (about twice what the curriculum's preference stage
gains)."""
SPIKE_FACTOR = 10.0
"""A gradient-norm or surrogate spike: an iteration's value more than this many times the median of the cell's
first ten iterations (in absolute value)."""


def collapsed(run: dict[str, Any], base: dict[str, Any], margin: float) -> bool:
    """Diverged, or at some evaluation point more than ``margin`` below the base's score."""
    b = float(base["curve"][0]["score"])
    return bool(run.get("diverged")) or not run["curve"] or min(p["score"] for p in run["curve"]) < b - margin


def spikes(run: dict[str, Any]) -> dict[str, int]:
    """Iterations whose gradient norm or surrogate magnitude exceeds :data:`SPIKE_FACTOR` times the median of the
    cell's first ten (non-finite values count as spikes)."""
    out = {}
    for key, label in (("grad_norm_per_iteration", "grad_norm"), ("surrogate_mean_per_iteration", "surrogate")):
        values = [v for v in run.get(key, []) if v is not None]
        if len(values) < 11:
            out[label] = 0
            continue
        arr = np.abs(np.asarray(values, dtype=np.float64))
        ref = float(np.median(arr[:10][np.isfinite(arr[:10])])) if np.isfinite(arr[:10]).any() else 0.0
        out[label] = int(np.sum(~np.isfinite(arr[10:]) | (arr[10:] > SPIKE_FACTOR * max(ref, 1e-12))))
    return out


def fisher_p(a_hits: int, a_n: int, b_hits: int, b_n: int) -> float:
    """Fisher's exact test's two-sided p-value for ``a_hits`` of ``a_n`` against ``b_hits`` of ``b_n``."""
    return float(fisher_exact([[a_hits, a_n - a_hits], [b_hits, b_n - b_hits]])[1])


def fisher_power(n: int, p_a: float, p_b: float, alpha: float = 0.05) -> float:
    """Power of Fisher's two-sided exact test at level ``alpha`` with ``n`` seeds per arm when the true
    collapse rates are ``p_a`` and ``p_b`` (exact: every outcome enumerated)."""
    power = 0.0
    for i in range(n + 1):
        pi = comb(n, i) * p_a**i * (1 - p_a) ** (n - i)
        for j in range(n + 1):
            pj = comb(n, j) * p_b**j * (1 - p_b) ** (n - j)
            if pi * pj > 0 and fisher_p(i, n, j, n) < alpha:
                power += pi * pj
    return power


@cache
def seeds_for_power(p_a: float, p_b: float, target: float = 0.8, most: int = 60) -> int | None:
    """The fewest seeds per arm at which Fisher's test reaches ``target`` power (None beyond ``most``)."""
    return next((n for n in range(2, most + 1) if fisher_power(n, p_a, p_b) >= target), None)
