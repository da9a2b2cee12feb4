"""A claim row and its verdict: the row's estimate and 95% interval from its statistic's bootstrap replicates and its
t-based test, the two p-values against its threshold, Holm's correction over the confirmatory family, the seeds
for 80% power, and the row as the report prints it.

A rule names a statistic, a threshold and a side: the claim is *reproduced* when the statistic is on the claim's
side of the threshold, *refuted* when it is on the other side, *unresolved* when the data cannot tell. Each row's
two-sided bootstrap p-value against its threshold (:func:`test`) decides: for the *confirmatory* rows (the paper's
main claims, fixed in the grid's :class:`~benchmarks.compare.rules.ClaimSet` before the grid ran) after Holm's
correction over all of them, for the *exploratory* rows at 0.05 on their own. A percentile interval excludes the
threshold exactly when the unadjusted p-value is below 0.05, so a confirmatory row whose interval excludes its
threshold but whose Holm-adjusted p does not pass reads *unresolved (Holm)*.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.compare.analysis import Analysis
from benchmarks.compare.bootstrap import interval
from benchmarks.compare.studentized import TTest
from benchmarks.compare.studentized import seeds_for_power as seeds_for_t_power

ALPHA = 0.05
NEAR = 2.0
"""A row is *near its threshold* when its bootstrap p, its t-based p or its decision p (Holm-adjusted for a
confirmatory row) lies within a factor NEAR of ALPHA: its bootstrap is redrawn with REFINED replicates."""
REFINED = 200_000
"""Replicates for a row near its threshold: the Monte Carlo standard error of a two-sided p of 0.005 is then
2 sqrt(0.0025 / REFINED) = 0.0002 (at 4,000 replicates it was 0.0016, enough to move a Holm verdict)."""


@dataclass
class Row:
    """One claim: the paper's words and number, the rule, and what the records say."""

    id: str
    claim: str
    paper: str
    rule: str
    threshold: float = 0.0
    side: str = "above"  # reproduced when the statistic is above (or below) the threshold
    estimate: float | None = None
    low: float = float("nan")
    high: float = float("nan")
    p: float | None = None  # the decision p: the larger of the bootstrap's and the t-based one
    p_holm: float | None = None
    p_boot: float | None = None
    n_boot: int = 0
    boot_low: float = float("nan")
    boot_high: float = float("nan")
    t: TTest | None = None
    verdict: str = "not run"
    note: str = ""
    digits: int = 3
    signed: bool = True
    confirmatory: bool = False  # in the family Holm's correction covers
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return "confirmatory" if self.confirmatory else "exploratory"

    @property
    def decision_p(self) -> float | None:
        """The p the verdict reads: Holm-adjusted for a confirmatory row, the row's own p otherwise."""
        return self.p_holm if self.p_holm is not None else self.p


def test(reps: np.ndarray, threshold: float) -> tuple[float, str]:
    """Two-sided bootstrap p-value of "the statistic equals ``threshold``" and the side the replicates lean to.

    Scores are discrete (a strict credit is a multiple of 1/4), so some replicates equal the threshold exactly in
    exact arithmetic; a replicate within 1e-9 of it counts on both sides, whatever the order of the floating-point
    sums that computed it put it at."""
    r = reps[~np.isnan(reps)]
    n = r.size
    tie = 1e-9 * max(1.0, abs(threshold))
    p_above = (1 + np.sum(r <= threshold + tie)) / (n + 1)  # small when the statistic is above the threshold
    p_below = (1 + np.sum(r >= threshold - tie)) / (n + 1)
    return float(min(1.0, 2 * min(p_above, p_below))), "above" if p_above < p_below else "below"


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (Holm 1979)."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[k]))
        out[k] = running
    return out


def fill(row: Row, est: float, reps: np.ndarray, t: TTest | None = None) -> Row:
    """The row's estimate, intervals and unadjusted p-values from a statistic's replicates and its t-based test.

    The decision p is the larger of the two p-values and the interval the hull of the two intervals, so that the
    interval excludes the threshold exactly when both tests reject at 0.05: with 3-9 seeds the percentile
    bootstrap is anti-conservative (the t interval is the wider), and where the replicates are skewed the
    bootstrap's interval may be the wider."""
    if np.isnan(est) or np.isnan(reps).mean() > 0.5:
        row.verdict, row.note = "not measurable", row.note or "the budget lies beyond the curve"
        return row
    row.estimate = est
    row.boot_low, row.boot_high = interval(reps)
    row.p_boot, row.extra["lean"] = test(reps, row.threshold)
    row.n_boot = int(np.sum(~np.isnan(reps)))
    row.t = t
    row.low, row.high = row.boot_low, row.boot_high
    row.p = row.p_boot
    if t is not None:
        row.low, row.high = min(row.low, t.low), max(row.high, t.high)
        row.p = max(row.p_boot, t.p)
    return row


def near_threshold(row: Row) -> bool:
    """Whether any of the row's p-values lies within a factor :data:`NEAR` of :data:`ALPHA`."""
    ps = [row.p_boot, row.t.p if row.t else None, row.decision_p]
    return any(p is not None and ALPHA / NEAR <= p <= ALPHA * NEAR for p in ps)


def decide(rows: list[Row], family: Sequence[str]) -> None:
    """Holm over the whole confirmatory ``family`` (the row ids), then every row's verdict.

    The family is fixed before the grid ran, so a confirmatory row without a p-value (not
    run, not measurable, or not among ``rows``) enters as p = 1: Holm's adjusted p-values only fall as any input
    falls, so other rows landing can only strengthen a verdict. A row's own verdict still moves as its own cells
    land, since they change its estimate and p-value.
    """
    ran = {r.id: r.p for r in rows if r.p is not None}
    adjusted = holm({k: ran.get(k, 1.0) for k in family})
    for r in rows:
        if r.p is None:
            continue
        r.p_holm = adjusted.get(r.id)
        p = r.decision_p
        assert p is not None
        if p >= ALPHA:
            r.verdict = "unresolved (Holm)" if r.p < ALPHA else "unresolved"
        else:
            r.verdict = "reproduced" if r.extra["lean"] == r.side else "refuted"


def power(r: Row, tt: TTest | None, family_size: int) -> None:
    """Seeds per group for :data:`POWER` power if the estimate were the truth, at 0.05 and (confirmatory rows)
    at Bonferroni's level over the confirmatory family of ``family_size`` rows, and whether they reproduce or
    refute the claim."""
    if r.estimate is None or tt is None:
        return
    effect = r.estimate - r.threshold
    r.extra["power_goal"] = "reproduce" if (effect > 0) == (r.side == "above") else "refute"

    def at_least_two(n: float | None) -> float | None:  # a t test needs two seeds per group
        return None if n is None else max(2.0, n)

    r.extra["seeds_power"] = at_least_two(seeds_for_t_power(abs(effect), tt.seed_units, tt.interaction_var))
    if r.confirmatory:
        r.extra["seeds_power_holm"] = at_least_two(
            seeds_for_t_power(abs(effect), tt.seed_units, tt.interaction_var, alpha=ALPHA / family_size)
        )


def refine(
    rows: list[Row], an: Analysis, family: Sequence[str], n_boot: int = REFINED, ids: set[str] | None = None
) -> None:
    """Redraw the bootstrap of every row near its threshold (or of the rows ``ids``) with ``n_boot`` replicates
    from ``an``'s stream, keeping its t-based test, and decide again over the confirmatory ``family``."""
    for r in rows:
        chosen = near_threshold(r) if ids is None else r.id in ids
        if r.estimate is not None and "redraw" in r.extra and chosen:
            fill(r, r.estimate, an.replicates(n_boot, r.extra["redraw"]), r.t)
    decide([r for r in rows if not r.id.endswith("m")], family)


def fmt_value(r: Row) -> str:
    if r.estimate is None:
        if r.verdict.startswith("refused"):
            return "refused"
        return r.verdict if r.verdict in ("not run", "not measurable") else "n/a"
    f = (lambda v: f"{v:+.{r.digits}f}") if r.signed else (lambda v: f"{v:.{r.digits}f}")
    return f"{f(r.estimate)} [{f(r.low)}, {f(r.high)}]"


def fmt_p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_seeds(n: float | None) -> str:
    return "-" if n is None else f"{np.ceil(n):.0f}"


def claims_table(rows: list[Row], family_size: int) -> list[str]:
    """The claims' rows as the report's markdown section (``family_size``: the confirmatory rows Holm covers)."""
    lines = [
        "## The paper's claims",
        "",
        "Each row: the claim in the paper's words, the paper's number, the rule (fixed before the grid ran unless "
        "its note says otherwise), the statistic's estimate with its 95% interval, two p-values against the rule's "
        "threshold and the verdict. *Bootstrap p*: two-sided, over prompts and seeds, with its number of replicates "
        f"({REFINED:,} for a row whose p lies within a factor {NEAR:g} of {ALPHA}). *t p*: Welch's test over seeds "
        "(unbiased variances, Satterthwaite's degrees of freedom) with the prompts' interaction with the difference "
        "added (`benchmarks/compare/studentized.py`); no random stream moves it. The interval is the hull of the "
        "percentile interval and the t interval, and the decision p the larger of the two p-values (Holm-adjusted "
        "over all the confirmatory rows, a row not run yet counting as p = 1), so a row passes only when both tests "
        "do. *Seeds for 80% power*: seeds per group (per cell for S-rows) at which a two-sided test at 0.05 would "
        "pass with probability 0.8 if the estimate were the truth, from the unbiased seed variance with only the "
        "prompt interaction as a floor (- when that floor alone is too wide; at least 2), and whether those seeds "
        "would *reproduce* or *refute* the claim; for a confirmatory row, in brackets, the same at Bonferroni's "
        f"level (0.05/{family_size}), which passes Holm however the other rows fall.",
        "",
        "| id | claim | paper | rule | family | ours [95% CI] | bootstrap p [replicates] | t p (df) | p (Holm) | "
        "verdict | seeds for 80% power | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = "" if r.p is None else fmt_p(r.p) + (f" ({fmt_p(r.p_holm)})" if r.p_holm is not None else "")
        boot = "" if r.p_boot is None else f"{fmt_p(r.p_boot)} [{r.n_boot:,}]"
        t = "" if r.t is None else f"{fmt_p(r.t.p)} ({r.t.df:.1f})"
        need = ""
        if r.estimate is not None and "power_goal" in r.extra:
            need = f"{fmt_seeds(r.extra['seeds_power'])} to {r.extra['power_goal']}"
            if "seeds_power_holm" in r.extra:
                need += f" ({fmt_seeds(r.extra['seeds_power_holm'])})"
        lines.append(
            f"| {r.id} | {r.claim} | {r.paper} | {r.rule} | {r.family} | {fmt_value(r)} | {boot} | {t} | {p} | "
            f"{r.verdict} | {need} | {r.note} |"
        )
    lines.append("")
    return lines
