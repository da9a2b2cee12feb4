"""The claims read off the cell records: each claim of a grid's claim set (:data:`~benchmarks.compare.claims.V2`,
:data:`~benchmarks.compare.claim_sets.V3`) becomes a row with its statistic's estimate, bootstrap replicates and
t-based test (:func:`read`), and the rows get their verdicts together (:func:`claim_rows`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.compare.analysis import Analysis, Group, cells, cv_ratio, drop_of
from benchmarks.compare.claims import V2
from benchmarks.compare.rules import Claim, ClaimSet, CvRatio, Groups, PaperFactor, RaisedRates, WorstDrops
from benchmarks.compare.studentized import ratio_t_test, t_test
from benchmarks.compare.verdicts import Row, decide, fill, power, refine


def groups_of(claim: Claim, an: Analysis) -> tuple[Groups, dict[str, str]]:
    """The claim's groups (None where no cell has run) and, for :class:`RaisedRates`, the rates in its words."""
    if not isinstance(claim.cells, RaisedRates):
        return [(c.key, an.group(c.phase, c.method, reward=c.reward, variant=c.variant)) for c in claim.cells], {}
    reward = claim.cells.reward
    rates = sorted(
        {
            r["spec"]["variant"]
            for r in an.records.values()
            if r["spec"]["phase"] == "stability" and r["spec"]["reward"] == reward
        }
    )
    done, groups = [], []
    for x in rates:
        pair = [
            (f"stab-{reward}-{m}-{x}", an.group("stability", method, reward=reward, variant=x))
            for m, method in (("naive", "naive_elbo"), ("vgrpo", "vgrpo"))
        ]
        if all(g is not None for _, g in pair):
            done.append(x)
            groups += pair
    words = {"rates": " and ".join(done) or "x2 and x4", "rate_list": ", ".join(done) or "x2, x4"}
    return groups or [("none", None)], words


def machines(groups: Groups) -> list[str]:
    """The machine types the groups' cells ran on: each a CPU model at a thread count, sorted."""
    seen = {
        f"{(run.get('machine') or {}).get('cpu', 'an unrecorded CPU')} at {run.get('threads', '?')} threads"
        for _, g in groups
        if g is not None
        for run in g.runs
    }
    return sorted(seen)


def read(claim: Claim, an: Analysis, rows: dict[str, Row], family_size: int, one_machine: bool = False) -> Row | None:
    """One claim's row from the records: its statistic's estimate, replicates and t-based test and the seeds for
    80% power (at Bonferroni's level over ``family_size`` confirmatory rows too; no verdict yet:
    :func:`~benchmarks.compare.verdicts.decide`). None for a :class:`PaperFactor` whose row has no ratio.
    With ``one_machine``, a row whose cells ran on more than one machine type gets no estimate: its verdict says
    it is refused and names the machines (a confirmatory one enters Holm's family as p = 1)."""
    groups, words = groups_of(claim, an)
    note = claim.note if isinstance(claim.note, str) else claim.note(groups)
    r = Row(
        claim.id,
        claim.claim.format(**words) if words else claim.claim,
        claim.paper,
        claim.rule.format(**words) if words else claim.rule,
        threshold=claim.threshold,
        side=claim.side,
        note=note,
        digits=claim.digits,
        signed=claim.signed,
        confirmatory=claim.confirmatory,
    )
    stat = claim.statistic
    if one_machine and len(types := machines(groups)) > 1:
        r.verdict = "refused: its cells ran on " + " and ".join(types)
    elif isinstance(stat, PaperFactor):
        of = rows[stat.of]
        if "cv_means" not in of.extra:
            return None
        ma, mb = of.extra["cv_means"]
        r.estimate, r.low, r.high = mb / ma, of.low, of.high
        r.verdict = "consistent" if of.low <= stat.ratio <= of.high else "differs"
        r.note = f"naive {ma:.3f} -> V-GRPO {mb:.3f}"
    elif isinstance(stat, CvRatio):
        assert not isinstance(claim.cells, RaisedRates)
        naive, ours = (cells(an.records, c.phase, c.method, reward=c.reward, variant=c.variant) for c in claim.cells)
        read_cv_ratio(r, an, naive, ours, stat.key, family_size)
    elif all(g is not None for _, g in groups):
        read_statistic(r, an, [(k, g) for k, g in groups if g is not None], claim, family_size)
    if claim.remark is not None:
        r.note = claim.remark(an, groups, r.note)
    return r


def read_statistic(r: Row, an: Analysis, present: list[tuple[str, Group]], claim: Claim, family_size: int) -> None:
    """The estimate, the shared bootstrap's replicates and the t-based test of a statistic of the groups' curves;
    the draw is kept (``extra["redraw"]``) so that :func:`benchmarks.compare.verdicts.refine` can redraw it."""
    reward, stat = claim.reward, claim.statistic
    draw: Callable[[Analysis], np.ndarray]
    if isinstance(stat, WorstDrops):
        combine = stat.combine
        est = an.seed_statistic(present, drop_of, combine, reward)[0]
        values = an.drop_design(present, combine, reward)

        def draw(a: Analysis) -> np.ndarray:
            return a.seed_statistic(present, drop_of, combine, reward)[1]
    else:
        assert not isinstance(stat, CvRatio | PaperFactor)
        fn = stat.function([g for _, g in present])
        est = an.statistic(present, fn, reward)[0]
        values = an.design(present, fn)

        def draw(a: Analysis) -> np.ndarray:
            return a.statistic(present, fn, reward)[1]

    point, _ = an.weights(reward)
    tt = None
    if not np.isnan(est):
        linear = sum(float(point @ y.mean(axis=0)) for y in values)
        assert abs(linear - est) < 1e-9, f"{r.id}: the statistic is not the sum of its groups' seed means"
        tt = t_test(values, point, an.bases[reward]["curve"][0]["tags"], r.threshold)  # type: ignore[index]
    fill(r, est, draw(an), tt)
    r.extra["redraw"], r.extra["seeds"] = draw, [grp.seeds for _, grp in present]
    power(r, tt, family_size)


def read_cv_ratio(
    r: Row, an: Analysis, naive: list[dict[str, Any]], ours: list[dict[str, Any]], key: str, family_size: int
) -> None:
    """The ratio of the two methods' mean per-iteration CVs (record field ``key``), its replicates over seeds and
    iterations and its t-based test over the seeds' means; the two means are kept (``extra["cv_means"]``)."""
    res = cv_ratio(naive, ours, key, an.rng, an.n_boot)
    if res is None:
        return
    ma, mb, reps = res

    def seed_means(runs: list[dict[str, Any]]) -> list[float]:
        return [float(np.mean(v)) for v in ([x for x in c.get(key, []) if x is not None] for c in runs) if v]

    tt = ratio_t_test(seed_means(naive), seed_means(ours), r.threshold)
    fill(r, mb / ma, reps, tt)
    r.extra["seeds"] = [len(seed_means(naive)), len(seed_means(ours))]
    r.extra["cv_means"] = (ma, mb)
    power(r, tt, family_size)


def claim_rows(an: Analysis, refine_near: bool = True, claims: ClaimSet = V2) -> list[Row]:
    """Every row of ``claims`` in the report's order, with verdicts; ``refine_near`` redraws the rows near their
    threshold with :data:`benchmarks.compare.verdicts.REFINED` replicates (:func:`benchmarks.compare.verdicts.refine`).

    The rows are read in the declared order, the ``read_last`` ones after the others: every row draws from
    ``an``'s one random stream, so the order decides the replicates."""
    rows: dict[str, Row] = {}
    family = claims.confirmatory
    for claim in sorted(claims.claims, key=lambda c: c.read_last):
        row = read(claim, an, rows, len(family), claims.one_machine)
        if row is not None:
            rows[claim.id] = row
    ordered = [rows[c.id] for c in claims.claims if c.id in rows]
    decide([r for r in ordered if not r.id.endswith("m")], family)
    if refine_near:
        refine(ordered, an, family)
    return ordered
