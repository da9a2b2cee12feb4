"""A claim row's t-based test over seeds beside the bootstrap, and the seeds a row needs for 80% power.

A row's statistic is a signed sum of group means of per-seed values, each a prompt-weighted sum over the same
test prompts: ``D = sum_g sum_p w_p mean_s Y[g][s, p]`` (the sign of each group is folded into its ``Y``). Under
the two-way model ``Y[g][s, p] = mu_g + a_g[p] + b_g[s] + e_g[s, p]`` (prompts a, seeds b, the image drawn for a
seed at a prompt e) its variance has three parts:

- the seeds' part, ``sum_g var_s(w . Y[g][s]) / S_g`` with the unbiased (n - 1) variance: seeds and images,
  both of which shrink as seeds are added (every new seed brings its own images);
- the prompt-interaction part, ``var_p(sum_g a_g[p])`` summed over the stratified weights: how much the
  difference itself varies from prompt to prompt. The prompts are shared by every group and every seed, so this
  part does not shrink with seeds; it is estimated as the stratified variance of the per-prompt difference of seed
  means less what the images put into it (the two-way residual variance over ``S_g``), never below 0.

Welch's t (Welch 1947) over the seeds' part with Satterthwaite's degrees of freedom, the interaction part added
with its own ``P - tags`` degrees of freedom, gives a p-value that no random stream moves and an interval with
the t quantile: at 3-9 seeds a percentile bootstrap of the seeds understates the spread (its variance is the
biased ``(n - 1) / n`` one, read with normal tails).

Statistics that are not linear in the scores (a seed's worst drop below the base) are linearised at the point
estimate: each seed's drop is read at the evaluation point where it is largest (:meth:`Group.drop_values`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

__all__ = ["POWER", "TTest", "ratio_t_test", "seeds_for_power", "t_test"]

POWER = 0.8


@dataclass(frozen=True)
class TTest:
    """The t-based reading of one row: estimate, the variance parts, degrees of freedom, p and interval."""

    estimate: float
    seed_var: float  # the seeds' part of the estimate's variance at the seeds run (unbiased)
    seed_units: float  # seed_var x seeds per group: what seed_var would be at one seed per group
    interaction_var: float  # the prompts' part that more seeds do not lower
    df: float
    p: float
    low: float
    high: float


def _stratified_var(values: np.ndarray, tags: np.ndarray) -> float:
    """Variance of the stratified mean (the mean over tags of per-tag means) of ``values`` ``(P,)`` when the
    prompts of each tag are drawn afresh: ``sum_k var_k / (K^2 n_k)`` with each tag's unbiased variance."""
    kinds = list(dict.fromkeys(tags.tolist()))
    out = 0.0
    for k in kinds:
        v = values[tags == k]
        if v.size > 1:
            out += float(np.var(v, ddof=1)) / (len(kinds) ** 2 * v.size)
    return out


def _residual_var(y: np.ndarray) -> float:
    """The two-way (seeds x prompts) residual variance of ``y`` ``(S, P)``: the images' noise at a prompt."""
    s, p = y.shape
    if s < 2 or p < 2:
        return 0.0
    e = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    return float(np.sum(e**2) / ((s - 1) * (p - 1)))


def t_test(
    values: list[np.ndarray], weights: np.ndarray, tags: list[str] | np.ndarray, threshold: float, level: float = 0.95
) -> TTest | None:
    """The row's t-based test of ``D = threshold`` from each group's signed per-seed per-prompt values ``(S_g, P)``
    (see the module docstring). None when a group has fewer than 2 seeds (no seed variance to estimate)."""
    if not values or any(y.shape[0] < 2 for y in values):
        return None
    tags = np.asarray(tags)
    per_seed = [y @ weights for y in values]
    estimate = float(sum(x.mean() for x in per_seed))
    parts = [float(np.var(x, ddof=1)) / x.size for x in per_seed]
    seed_var = float(sum(parts))
    seed_units = float(sum(v * x.size for v, x in zip(parts, per_seed, strict=True)))
    diff = sum(y.mean(axis=0) for y in values)
    images = sum(_residual_var(y) / y.shape[0] for y in values)
    kinds = len(set(tags.tolist()))
    images_in_strata = sum(images / (kinds**2 * int((tags == k).sum())) for k in set(tags.tolist()))
    interaction = max(0.0, _stratified_var(np.asarray(diff), tags) - images_in_strata)
    total = seed_var + interaction
    if total <= 0:
        return None
    denom = sum(v**2 / (x.size - 1) for v, x in zip(parts, per_seed, strict=True))
    denom += interaction**2 / max(tags.size - kinds, 1)
    df = total**2 / denom if denom > 0 else float("inf")
    se = float(np.sqrt(total))
    t = (estimate - threshold) / se
    p = float(min(1.0, 2 * student_t.sf(abs(t), df)))
    q = float(student_t.ppf(0.5 + level / 2, df))
    return TTest(estimate, seed_var, seed_units, interaction, df, p, estimate - q * se, estimate + q * se)


def ratio_t_test(a: list[float], b: list[float], threshold: float, level: float = 0.95) -> TTest | None:
    """The t-based test of ``mean(b) / mean(a) = threshold`` from per-seed values (the delta method on the
    ratio, Welch's degrees of freedom); there are no prompts, so no interaction part."""
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if xa.size < 2 or xb.size < 2 or xa.mean() == 0:
        return None
    ma, mb = float(xa.mean()), float(xb.mean())
    r = mb / ma
    parts = [r**2 * float(np.var(xb, ddof=1)) / (xb.size * mb**2), r**2 * float(np.var(xa, ddof=1)) / (xa.size * ma**2)]
    total = sum(parts)
    if total <= 0:
        return None
    df = total**2 / (parts[0] ** 2 / (xb.size - 1) + parts[1] ** 2 / (xa.size - 1))
    se = float(np.sqrt(total))
    p = float(min(1.0, 2 * student_t.sf(abs(r - threshold) / se, df)))
    q = float(student_t.ppf(0.5 + level / 2, df))
    units = parts[0] * xb.size + parts[1] * xa.size
    return TTest(r, total, units, 0.0, df, p, r - q * se, r + q * se)


def seeds_for_power(
    effect: float, seed_units: float, interaction_var: float, alpha: float = 0.05, power: float = POWER
) -> float | None:
    """Seeds per group at which a two-sided level-``alpha`` test has ``power`` against a true difference from the
    threshold of ``effect`` (normal approximation): the smallest ``n`` with ``|effect| / se(n) >= z_(1 - alpha/2)
    + z_power``, where ``se(n)^2 = seed_units / n + interaction_var`` (``seed_units``: the seeds' part of the
    variance at one seed per group, from the unbiased variance; ``interaction_var``: the prompts' part, which
    seeds do not lower). None when the interaction part alone is too wide (more prompts would be needed)."""
    z = float(norm.ppf(1 - alpha / 2) + norm.ppf(power))
    room = (effect / z) ** 2 - interaction_var
    if room <= 0 or seed_units <= 0:
        return None
    return seed_units / room
