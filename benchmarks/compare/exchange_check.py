"""Whether the rows' verdicts hold when one seed group is exchanged for another of the same config.

v3's grid held two V-GRPO groups of identical config that disagreed at E1's read point beyond their intervals
(0.569 against 0.593, Welch p 0.006), and E1's verdict depended on which one the row read. A grid with a
``replicate`` phase (:mod:`benchmarks.compare.grid`) runs a second seed group of a method's methods config; this
reads every row again with that group in the methods group's place, by the same rules (the same Holm family), and
says for each row whether its verdict moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from benchmarks.common import LABELS
from benchmarks.compare.analysis import Analysis
from benchmarks.compare.claim_rows import claim_rows
from benchmarks.compare.plan import RunSpec
from benchmarks.compare.rules import ClaimSet
from benchmarks.compare.verdicts import Row, fmt_p, fmt_value

REPLICATE = "replicate"


def exchanged(records: dict[str, dict[str, Any]], method: str) -> dict[str, dict[str, Any]]:
    """``records`` with ``method``'s methods cells replaced by its replicate cells, relabelled as methods cells
    (the rows find a group by its phase); the records unchanged (a copy) where it has no replicate cells."""
    replicate = {k: r for k, r in records.items() if r["spec"]["phase"] == REPLICATE and r["spec"]["method"] == method}
    if not replicate:
        return dict(records)
    out = {k: r for k, r in records.items() if not (r["spec"]["phase"] == "methods" and r["spec"]["method"] == method)}
    for k, r in replicate.items():
        del out[k]
        spec = RunSpec(**{**r["spec"], "phase": "methods"})
        out[spec.name] = {**r, "spec": asdict(spec), "name": spec.name}
    return out


def replicated_methods(records: dict[str, dict[str, Any]]) -> list[str]:
    """The methods with a replicate group in ``records``, in the order their cells appear."""
    return list(dict.fromkeys(r["spec"]["method"] for r in records.values() if r["spec"]["phase"] == REPLICATE))


def exchange_lines(
    records: dict[str, dict[str, Any]], rows: Sequence[Row], claims: ClaimSet, stream: int = 0
) -> list[str]:
    """A table of ``rows`` (read on the methods groups) beside the same rows read with each replicated method's
    replicate group in its methods group's place; nothing where no method has a replicate group."""
    methods = replicated_methods(records)
    if not methods:
        return []
    others = {
        m: {r.id: r for r in claim_rows(Analysis(exchanged(records, m), stream=stream), claims=claims)} for m in methods
    }
    heads = " | ".join(f"with {LABELS[m]}'s replicate group" for m in methods)
    lines = [
        "## The verdicts under the exchange of a seed group",
        "",
        f"Each row read again with the replicate group of {', '.join(LABELS[m] for m in methods)} (the same config on "
        "other seeds) in "
        "place of its methods group, by the same rules and Holm family. Each cell: the estimate, the decision p "
        "[Holm-adjusted for a confirmatory row] and the verdict.",
        "",
        f"| id | family | methods group | {heads} | verdict unmoved |",
        "|---|---|---|" + "---|" * len(methods) + "---|",
    ]
    for r in rows:
        read = [others[m].get(r.id) for m in methods]
        same = all(o is not None and o.verdict == r.verdict for o in read)
        cells = " | ".join(_cell(o) if o is not None else "not read" for o in read)
        lines.append(f"| {r.id} | {r.family} | {_cell(r)} | {cells} | {'yes' if same else '**no**'} |")
    return [*lines, ""]


def _cell(r: Row) -> str:
    p = r.decision_p
    return f"{fmt_value(r)}, p {fmt_p(p)}: {r.verdict}" if p is not None else f"{fmt_value(r)}: {r.verdict}"
