"""The paper's claims as rows of the report: each in the paper's words, with a rule stated before the grid ran,
its statistic's estimate and 95% interval over prompts and seeds, and a verdict consistent with both.

A rule names a statistic, a threshold and a side: the claim is *reproduced* when the statistic is on the claim's
side of the threshold, *refuted* when it is on the other side, *unresolved* when the data cannot tell. Each row's
two-sided bootstrap p-value against its threshold (:func:`test`) decides: for the *confirmatory* rows (the paper's
main claims, fixed in :data:`CONFIRMATORY` before the grid ran) after Holm's correction over all of them, for the
*exploratory* rows at 0.05 on their own. A percentile interval excludes the threshold exactly when the unadjusted
p-value is below 0.05, so a confirmatory row whose interval excludes its threshold but whose Holm-adjusted p does
not pass reads *unresolved (Holm)*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.analysis import (
    AXES,
    COLLAPSE_DROP,
    Analysis,
    Group,
    at_budget,
    collapsed,
    curve_mean,
    cv_ratio,
    drop_of,
    final,
    fisher_p,
    identity,
    seeds_for_power,
    seeds_to_resolve,
    start,
)
from benchmarks.bootstrap import interval
from benchmarks.common import LABELS
from benchmarks.tables import plateau

MARGIN = {"geneval": 0.02, "preference": 0.2}
"""Non-inferiority and "adds little" margins: GenEval strict credit, world PickScore."""
CONVERGED_GAIN = 0.02
"""A setting "fails to converge" when its final GenEval strict credit is at most this far above the base."""
EFFICIENCY = {
    "mixgrpo": ("iteration", 0.5),
    "flow_grpo": ("iteration", 0.5),
    "diffusion_nft": ("gradient_steps", 1 / 3),
}
"""Each speed claim's axis and budget fraction r: V-GRPO at r times the other method's budget on that axis."""
CONFIRMATORY = (
    "E1",
    "E3",
    "N1",
    "N2",
    "S1",
    "S2",
    "A1",
    "A2",
    "A3",
    "A4",
    "A5",
    "A6",
    "C1",
    "C2",
)
"""The rows Holm's correction covers: the paper's claims the grid was built to test."""
ALPHA = 0.05


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
    p: float | None = None
    p_holm: float | None = None
    verdict: str = "not run"
    note: str = ""
    digits: int = 3
    signed: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return "confirmatory" if self.id in CONFIRMATORY else "exploratory"


def test(reps: np.ndarray, threshold: float) -> tuple[float, str]:
    """Two-sided bootstrap p-value of "the statistic equals ``threshold``" and the side the replicates lean to."""
    r = reps[~np.isnan(reps)]
    n = r.size
    p_above = (1 + np.sum(r <= threshold)) / (n + 1)  # small when the statistic is above the threshold
    p_below = (1 + np.sum(r >= threshold)) / (n + 1)
    return float(min(1.0, 2 * min(p_above, p_below))), "above" if p_above < p_below else "below"


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (Holm 1979)."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[k]))
        out[k] = running
    return out


def fill(row: Row, est: float, reps: np.ndarray) -> Row:
    """The row's estimate, interval and unadjusted p-value from a statistic's replicates."""
    if np.isnan(est) or np.isnan(reps).mean() > 0.5:
        row.verdict, row.note = "not measurable", row.note or "the budget lies beyond the curve"
        return row
    row.estimate = est
    row.low, row.high = interval(reps)
    row.p, row.extra["lean"] = test(reps, row.threshold)
    return row


def decide(rows: list[Row]) -> None:
    """Holm over the whole confirmatory family, then every row's verdict.

    The family is :data:`CONFIRMATORY`, fixed before the grid ran, so a confirmatory row without a p-value (not
    run, not measurable, or not among ``rows``) enters as p = 1: Holm's adjusted p-values only fall as any input
    falls, so other rows landing can only strengthen a verdict. A row's own verdict still moves as its own cells
    land, since they change its estimate and p-value.
    """
    ran = {r.id: r.p for r in rows if r.p is not None}
    adjusted = holm({k: ran.get(k, 1.0) for k in CONFIRMATORY})
    for r in rows:
        if r.p is None:
            continue
        r.p_holm = adjusted.get(r.id)
        p = r.p_holm if r.p_holm is not None else r.p
        if p >= ALPHA:
            r.verdict = "unresolved (Holm)" if r.p < ALPHA else "unresolved"
        else:
            r.verdict = "reproduced" if r.extra["lean"] == r.side else "refuted"


def fmt_value(r: Row) -> str:
    if r.estimate is None:
        return r.verdict if r.verdict in ("not run", "not measurable") else "n/a"
    f = (lambda v: f"{v:+.{r.digits}f}") if r.signed else (lambda v: f"{v:.{r.digits}f}")
    return f"{f(r.estimate)} [{f(r.low)}, {f(r.high)}]"


def claim_rows(an: Analysis) -> list[Row]:
    """Every claim row (see the module docstring), with verdicts."""
    rows: list[Row] = []
    g = an.groups
    m_geneval = MARGIN["geneval"]

    def row(
        id_: str,
        claim: str,
        paper: str,
        rule: str,
        groups: list[tuple[str, Group | None]],
        fn: Callable[..., np.ndarray] | None = None,
        *,
        threshold: float = 0.0,
        side: str = "above",
        per_seed: Callable[[Group, np.ndarray], np.ndarray] | None = None,
        combine: Callable[..., np.ndarray] | None = None,
        reward: str = "geneval",
        note: str = "",
    ) -> Row:
        r = Row(id_, claim, paper, rule, threshold=threshold, side=side, note=note)
        rows.append(r)
        if any(grp is None for _, grp in groups):
            return r
        present = [(k, grp) for k, grp in groups if grp is not None]
        if per_seed is not None and combine is not None:
            est, reps = an.seed_statistic(present, per_seed, combine, reward)
            split = [an.seed_statistic(present, per_seed, combine, reward, mode)[1] for mode in ("seeds", "prompts")]
        else:
            assert fn is not None
            est, reps = an.statistic(present, fn, reward)
            split = [an.statistic(present, fn, reward, mode)[1] for mode in ("seeds", "prompts")]
        fill(r, est, reps)
        if r.estimate is not None:
            seeds = min(grp.seeds for _, grp in present)
            seed_var, prompt_var = float(np.nanvar(split[0])), float(np.nanvar(split[1]))
            r.extra["seeds_needed"] = seeds_to_resolve(est - threshold, seed_var, prompt_var, seeds, observed_p=r.p)
            if id_ in CONFIRMATORY:
                r.extra["seeds_needed_holm"] = seeds_to_resolve(
                    est - threshold, seed_var, prompt_var, seeds, alpha=0.05 / len(CONFIRMATORY), observed_p=r.p
                )
        return r

    # -- Efficiency: V-GRPO at a fraction r of the other method's budget minus the other at its full budget.
    v = g.get("vgrpo")
    for id_, other, words, paper, margin in (
        (
            "E1",
            "mixgrpo",
            "V-GRPO is 2x faster than MixGRPO: at half MixGRPO's iterations it already scores higher",
            "FLUX: V-GRPO at 150 iterations beats MixGRPO at 300",
            0.0,
        ),
        (
            "E2",
            "flow_grpo",
            "V-GRPO is faster than the MDP method Flow-GRPO: at half its iterations it scores higher",
            "no number for Flow-GRPO (SD3.5-M curriculum only)",
            0.0,
        ),
        (
            "E3",
            "diffusion_nft",
            "V-GRPO matches DiffusionNFT with a 3x speedup in gradient steps",
            "580 against about 1.7K gradient steps over SD3.5-M's five stages",
            m_geneval,
        ),
    ):
        axis, r_ = EFFICIENCY[other]
        o = g.get(other)
        budget = float(o.axes[axis][-1]) if o else float("nan")
        vx = v.axes[axis] if v else np.zeros(1)
        kind = "superiority" if margin == 0 else f"non-inferiority, margin {margin}"
        r = row(
            id_,
            words,
            paper,
            f"V-GRPO at {r_:.2g} x the other's budget in {AXES[axis].split(' (')[0]} minus the other at its full "
            f"budget > {-margin if margin else 0.0:g} ({kind})",
            [("vgrpo", v), (other, o)],
            lambda a, b, vx=vx, x=r_ * budget: at_budget(vx, a, x) - final(b),
            threshold=-margin if margin else 0.0,
            note="one GenEval stage at matched gradient steps per iteration, not the paper's five-stage count"
            if other == "diffusion_nft"
            else "",
        )
        if o is not None:  # whether the level compared has settled: a rising one makes the comparison a lower bound
            r.note = "; ".join(n for n in (r.note, f"{LABELS[other]}'s last quarter {plateau(an, other, o)}") if n)
    for id_, other in (("E4", "mixgrpo"), ("E5", "flow_grpo")):
        o = g.get(other)
        budget = float(o.axes["train_s"][-1]) if o else float("nan")
        vx = v.axes["train_s"] if v else np.zeros(1)
        row(
            id_,
            f"... in training wall time: V-GRPO at half {LABELS[other]}'s wall time scores higher",
            "2x faster than MixGRPO" if other == "mixgrpo" else "",
            "V-GRPO at 0.5 x the other's training seconds minus the other at its full budget > 0",
            [("vgrpo", v), (other, o)],
            lambda a, b, vx=vx, x=0.5 * budget: at_budget(vx, a, x) - final(b),
            note=f"seconds from {v.timed_cells} and {o.timed_cells} cells that ran with the cores to themselves"
            f" (CPU: {'; '.join(sorted(set(v.timed_cpus) | set(o.timed_cpus)))})"
            if v and o
            else "",
        )

    # -- Naive ELBO-GRPO at each method's own rate (GenEval stage).
    naive = g.get("naive_elbo")
    row(
        "N1",
        "V-GRPO ends at least as high as naive ELBO-GRPO",
        "naive ELBO-GRPO underperforms",
        f"final V-GRPO minus naive > {-m_geneval:g} (non-inferiority, margin {m_geneval})",
        [("vgrpo", v), ("naive_elbo", naive)],
        lambda a, b: final(a) - final(b),
        threshold=-m_geneval,
    )
    row(
        "N2",
        "V-GRPO ends higher than naive ELBO-GRPO",
        "naive ELBO-GRPO underperforms",
        "final V-GRPO minus naive > 0 (superiority)",
        [("vgrpo", v), ("naive_elbo", naive)],
        lambda a, b: final(a) - final(b),
    )

    # -- Stability: worst drop below the start, naive minus V-GRPO, over the ladder of raised rates.
    for id_, reward in (("S1", "geneval"), ("S2", "preference")):
        mults = sorted(
            {
                r["spec"]["variant"]
                for r in an.records.values()
                if r["spec"]["phase"] == "stability" and r["spec"]["reward"] == reward
            }
        )
        pairs = [
            (
                (f"stab-{reward}-naive-{x}", an.group("stability", "naive_elbo", reward=reward, variant=x)),
                (f"stab-{reward}-vgrpo-{x}", an.group("stability", "vgrpo", reward=reward, variant=x)),
            )
            for x in mults
        ]
        done = [(x, a, b) for x, (a, b) in zip(mults, pairs, strict=True) if a[1] is not None and b[1] is not None]
        flat: list[tuple[str, Group | None]] = [grp for _, a, b in done for grp in (a, b)]
        unit = "GenEval strict" if reward == "geneval" else "world PickScore"
        r = row(
            id_,
            f"Naive ELBO-GRPO is unstable where V-GRPO is not ({'GenEval' if reward == 'geneval' else 'preference'}"
            " stage)",
            "the naive baseline is severely unstable (SD3.5-M stage 1: preference)",
            f"worst drop below the base at any evaluation point ({unit}), naive minus V-GRPO, averaged over the "
            f"raised rates ({', '.join(x for x, _, _ in done) or 'x2, x4'} each method's own) > 0",
            flat or [("none", None)],
            per_seed=drop_of,
            combine=lambda *d: np.mean([d[i] - d[i + 1] for i in range(0, len(d), 2)], axis=0),
            reward=reward,
        )
        if done:
            base = an.bases[reward]
            assert base is not None
            hits, n_cells = {"naive_elbo": 0, "vgrpo": 0}, {"naive_elbo": 0, "vgrpo": 0}
            for _, grp in flat:
                assert grp is not None
                for c in grp.runs:
                    hits[c["spec"]["method"]] += collapsed(c, base, COLLAPSE_DROP[reward])
                    n_cells[c["spec"]["method"]] += 1
            p = fisher_p(hits["naive_elbo"], n_cells["naive_elbo"], hits["vgrpo"], n_cells["vgrpo"])
            r.note = (
                f"collapsed (a drop > {COLLAPSE_DROP[reward]:g} at a point, or diverged): naive "
                f"{hits['naive_elbo']}/{n_cells['naive_elbo']}, V-GRPO {hits['vgrpo']}/{n_cells['vgrpo']}, Fisher "
                f"p = {p:.2f}; Fisher's test has 0.8 power against 'naive collapses half the time, V-GRPO never' "
                f"from {seeds_for_power(0.5, 0.0)} cells per method"
            )

    # -- Ablations of V-GRPO, every seed of each against every seed of V-GRPO.
    def abl(variant: str) -> tuple[str, Group | None]:
        return f"abl-{variant}", an.group("ablation", "vgrpo", variant=variant)

    ref = ("vgrpo", v)
    drop = COLLAPSE_DROP["geneval"]
    at_rate = "at V-GRPO's rate (tuned for x-prediction, N_MC 4), not retuned for the variant"
    row(
        "A1",
        "N_MC 2 fails to converge",
        "N_MC 2 fails to converge",
        f"final N_MC 2 minus base <= {CONVERGED_GAIN:g}",
        [abl("n_mc_2")],
        lambda a: final(a) - start(a),
        threshold=CONVERGED_GAIN,
        side="below",
        note=at_rate,
    )
    row(
        "A2",
        "N_MC 2 converges slower than N_MC 4",
        "(the reading of 'fails' the data may support)",
        "curve mean (points after the start) N_MC 4 minus N_MC 2 > 0",
        [ref, abl("n_mc_2")],
        lambda a, b: curve_mean(a) - curve_mean(b),
        note=at_rate,
    )
    row(
        "A3",
        "N_MC 8 adds little over N_MC 4",
        "8 adds little",
        f"final N_MC 8 minus N_MC 4 < {m_geneval:g}",
        [abl("n_mc_8"), ref],
        lambda a, b: final(a) - final(b),
        threshold=m_geneval,
        side="below",
        note=at_rate,
    )
    row(
        "A4",
        "v-prediction is stable",
        "v is stable but slower",
        f"worst drop of v-prediction below the base < {drop:g}",
        [abl("v_prediction")],
        per_seed=drop_of,
        combine=identity,
        threshold=drop,
        side="below",
        note=at_rate,
    )
    row(
        "A5",
        "v-prediction converges slower than x-prediction",
        "v is stable but slower; x is best",
        "curve mean x minus v > 0",
        [ref, abl("v_prediction")],
        lambda a, b: curve_mean(a) - curve_mean(b),
        note=at_rate,
    )
    row(
        "A6",
        "eps-prediction collapses",
        "eps causes severe training collapse",
        f"worst drop of eps-prediction below the base > {drop:g} (or a divergence)",
        [abl("eps_prediction")],
        per_seed=drop_of,
        combine=identity,
        threshold=drop,
        note=at_rate,
    )
    row(
        "A7",
        "x-prediction ends higher than v-prediction",
        "x is best",
        "final x minus v > 0",
        [ref, abl("v_prediction")],
        lambda a, b: final(a) - final(b),
        note=at_rate,
    )
    row(
        "A8",
        "x-prediction ends higher than eps-prediction",
        "x is best",
        "final x minus eps > 0",
        [ref, abl("eps_prediction")],
        lambda a, b: final(a) - final(b),
        note=at_rate,
    )

    # -- Surrogate CV: the direction (confirmatory) and the magnitude against the paper's (descriptive).
    from benchmarks.analysis import cells

    naive_runs, ours = cells(an.records, "methods", "naive_elbo"), cells(an.records, "methods", "vgrpo")
    for id_, key, label, paper_ratio, paper in (
        ("C1", "surrogate_cv_per_iteration", "overall", 0.128 / 0.230, "FLUX: 0.230 -> 0.128 (ratio 0.56)"),
        ("C2", "surrogate_cv_within_group_per_iteration", "within-group", 0.038 / 0.170, "0.170 -> 0.038 (ratio 0.22)"),
    ):
        r = Row(
            id_,
            f"Variance reduction lowers the surrogate's CV ({label})",
            paper,
            "ratio V-GRPO / naive of the mean per-iteration CV < 1",
            threshold=1.0,
            side="below",
            signed=False,
            digits=2,
        )
        rows.append(r)
        res = cv_ratio(naive_runs, ours, key, an.rng, an.n_boot)
        if res is None:
            continue
        ma, mb, reps = res
        fill(r, mb / ma, reps)
        m = Row(
            id_ + "m",
            f"... and by the paper's factor ({label})",
            f"ratio {paper_ratio:.2f}",
            f"the paper's ratio {paper_ratio:.2f} inside our interval (consistent) or outside it (differs)",
            signed=False,
            digits=2,
        )
        m.estimate, m.low, m.high = mb / ma, r.low, r.high
        m.verdict = "consistent" if r.low <= paper_ratio <= r.high else "differs"
        m.note = f"naive {ma:.3f} -> V-GRPO {mb:.3f}"
        rows.append(m)

    # -- Preference stage at its own rate.
    pv = ("pref-vgrpo", an.group("preference", "vgrpo", reward="preference"))
    pn = ("pref-naive", an.group("preference", "naive_elbo", reward="preference"))
    m_pref = MARGIN["preference"]
    row(
        "P1",
        "V-GRPO raises the preference reward (world PickScore)",
        "V-GRPO improves every preference reward over the base",
        "final minus base > 0",
        [pv],
        lambda a: final(a) - start(a),
        reward="preference",
    )
    row(
        "P2",
        "V-GRPO ends at least as high as naive ELBO-GRPO (preference)",
        "naive ELBO-GRPO underperforms",
        f"final V-GRPO minus naive > {-m_pref:g} (non-inferiority, margin {m_pref})",
        [pv, pn],
        lambda a, b: final(a) - final(b),
        threshold=-m_pref,
        reward="preference",
    )
    row(
        "P3",
        "V-GRPO ends higher than naive ELBO-GRPO (preference)",
        "naive ELBO-GRPO underperforms",
        "final V-GRPO minus naive > 0 (superiority)",
        [pv, pn],
        lambda a, b: final(a) - final(b),
        reward="preference",
    )
    decide([r for r in rows if not r.id.endswith("m")])
    return rows


def fmt_p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def claims_table(rows: list[Row]) -> list[str]:
    """The claims' rows as the report's markdown section."""
    lines = [
        "## The paper's claims",
        "",
        "Each row: the claim in the paper's words, the paper's number, the rule fixed before the grid ran, the "
        "statistic's estimate with its 95% interval over prompts and seeds, its two-sided bootstrap p-value "
        "against the rule's threshold (Holm-adjusted over all the confirmatory rows, a row not run yet counting "
        "as p = 1), and the verdict. *Seeds to "
        "resolve*: the seeds per group at which the interval would exclude the threshold if the estimate held "
        "(- when the prompts' noise alone is too wide; resolved rows: already); for a confirmatory row, in "
        "brackets, the seeds at which it would pass Holm however the other rows fall (Bonferroni's level, "
        f"0.05/{len(CONFIRMATORY)}).",
        "",
        "| id | claim | paper | rule | family | ours [95% CI] | p (Holm) | verdict | seeds to resolve | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = "" if r.p is None else fmt_p(r.p) + (f" ({fmt_p(r.p_holm)})" if r.p_holm is not None else "")
        need = r.extra.get("seeds_needed", None)
        resolved = r.verdict in ("reproduced", "refuted")
        need_s = (
            ""
            if r.estimate is None or "seeds_needed" not in r.extra
            else ("already" if resolved else ("-" if need is None else f"{np.ceil(need):.0f}"))
        )
        if need_s and not resolved and "seeds_needed_holm" in r.extra:
            need_holm = r.extra["seeds_needed_holm"]
            need_s += f" ({'-' if need_holm is None else f'{np.ceil(need_holm):.0f}'})"
        lines.append(
            f"| {r.id} | {r.claim} | {r.paper} | {r.rule} | {r.family} | {fmt_value(r)} | {p} | {r.verdict} | "
            f"{need_s} | {r.note} |"
        )
    lines.append("")
    return lines
