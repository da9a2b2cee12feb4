"""Seeds per group for 80% power on each claim row, from the variances of the committed grid: the power analysis
the v3 pre-registration (`docs/benchmarks/v3-preregistration.md`) sizes its seeds by.

    python -m benchmarks.compare.power docs/benchmarks/cells.jsonl [--out docs/benchmarks/v3-power.md] [--claims v3]
    python -m benchmarks.compare.power docs/benchmarks-v3/tuning/cells.jsonl --tuning --claims v3
    python -m benchmarks.compare.power docs/benchmarks-v4/tuning/cells.jsonl --tuning v4 --claims v4

With ``--tuning`` the records are the v3 tuning sweep's (``--tuning v4``: v4's): each method's chosen rung (its
seeds, validation prompts) stands in for its methods cells (:meth:`benchmarks.compare.rungs.Sweep.chosen_as_methods`),
so the rows that compare methods (E1-E3, D1-D3, N1, N2) are sized by the tuned methods' effects; the other rows have
no cells there, nor do the methods the sweep has not settled yet.

For each row: its estimate's distance from the threshold (taken as the true effect), the seeds' part of the
variance at one seed per group (unbiased) and the prompt interaction (which seeds do not lower), both from
:mod:`~benchmarks.compare.studentized`, and the seeds per group at which a two-sided test at 0.05 and at
Bonferroni's level over the confirmatory rows would pass with probability 0.8, to reproduce or to refute the claim.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from benchmarks.compare import tuning, tuning_v4
from benchmarks.compare.analysis import Analysis, load_records
from benchmarks.compare.claim_rows import claim_rows
from benchmarks.compare.claim_sets import CLAIM_SETS
from benchmarks.compare.rules import ClaimSet
from benchmarks.compare.rungs import BASE
from benchmarks.compare.studentized import POWER, seeds_for_power
from benchmarks.compare.verdicts import ALPHA, Row, fmt_seeds
from vgrpo.atomic import write_text_atomic

SWEEPS = {"v3": tuning.V3, "v4": tuning_v4.V4}


def bonferroni(r: Row, family_size: int) -> float | None:
    """Seeds per group for 80% power at Bonferroni's level over ``family_size`` confirmatory rows, for any row (an
    exploratory row may become confirmatory), at least 2."""
    assert r.t is not None and r.estimate is not None
    n = seeds_for_power(abs(r.estimate - r.threshold), r.t.seed_units, r.t.interaction_var, ALPHA / family_size)
    return None if n is None else max(2.0, n)


def power_table(rows: list[Row], source: str, claims: ClaimSet) -> list[str]:
    """The power analysis as markdown lines, Bonferroni's level over ``claims``' confirmatory family."""
    size = len(claims.confirmatory)
    lines = [
        f"Seeds per group (per cell for the S rows) for {POWER:.0%} power if each estimate were the truth, from "
        f"`{source}` (`python -m benchmarks.compare.power {source} --claims {claims.name}`). *Seed part*: the variance "
        "of the row's statistic "
        "at one seed per group (unbiased); *interaction*: the prompts' part, which seeds do not lower. Bonferroni: "
        f"{ALPHA}/{size} ({claims.name}'s confirmatory rows), which passes Holm however the other rows fall (given for "
        "exploratory rows too, "
        "should they become confirmatory).",
        "",
        "| id | family | estimate - threshold | seed part (1 seed) | interaction | seeds now | at 0.05 | "
        "at Bonferroni | would |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.t is None or r.estimate is None or "power_goal" not in r.extra:
            continue
        now = min(r.extra.get("seeds", []), default=None)
        lines.append(
            f"| {r.id} | {r.family} | {r.estimate - r.threshold:+.4f} | {r.t.seed_units:.3g} | "
            f"{r.t.interaction_var:.3g} | {'' if now is None else now} | {fmt_seeds(r.extra['seeds_power'])} | "
            f"{fmt_seeds(bonferroni(r, size))} | "
            f"{r.extra['power_goal']} |"
        )
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, help="a report's cells.jsonl (or a grid's cell folder)")
    parser.add_argument("--out", type=Path, default=None, help="write the table here (markdown) as well")
    parser.add_argument("--claims", choices=sorted(CLAIM_SETS), default="v2", help="the grid's claims (default v2)")
    parser.add_argument(
        "--tuning",
        nargs="?",
        const="v3",
        choices=sorted(SWEEPS),
        default=None,
        help="the records are a tuning sweep's (see above): v3's (the default) or v4's",
    )
    args = parser.parse_args(argv)
    if not args.records.exists():
        parser.error(f"records: {args.records} does not exist")
    # The variances are the question here, not verdicts: a set that refuses rows read across machine types (v4's)
    # sizes its seeds from grids that ran across them (v3's), so every row is read.
    claims = replace(CLAIM_SETS[args.claims], one_machine=False)
    records = load_records(args.records)
    if args.tuning:
        if BASE.name not in records:
            parser.error(f"records: {args.records} has no {BASE.name} (not the tuning sweep's records?)")
        records = SWEEPS[args.tuning].chosen_as_methods(records)
    rows = claim_rows(Analysis(records), refine_near=False, claims=claims)
    flag = {None: "", "v3": " --tuning", "v4": " --tuning v4"}[args.tuning]
    source = args.records.as_posix() + flag
    lines = power_table(rows, source, claims)
    print("\n".join(lines))
    if args.out:
        write_text_atomic(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
