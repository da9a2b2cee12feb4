"""Whether the confirmatory rows' p-values and verdicts hold under other random streams.

The report's rows draw their bootstrap replicates from stream 0. This reads every row again from fresh streams,
by the same rules (the same replicate counts, the same redraw near the threshold, the same Holm family), and
says for each confirmatory row how far its decision p moved and whether its verdict did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.compare.analysis import Analysis
from benchmarks.compare.claim_rows import claim_rows
from benchmarks.compare.rules import ClaimSet
from benchmarks.compare.verdicts import Row, fmt_p

STREAMS = (1, 2)
"""The other streams read; the report's own is 0."""


def _moved(p0: float, ps: list[float]) -> tuple[float, bool]:
    """The largest change from ``p0`` and whether every p equals it to three decimals."""
    return max(abs(p - p0) for p in ps), all(round(p, 3) == round(p0, 3) for p in ps)


def stream_lines(
    records: dict[str, dict[str, Any]], rows: Sequence[Row], claims: ClaimSet, streams: Sequence[int] = STREAMS
) -> list[str]:
    """A table of the confirmatory ``rows`` (read from stream 0) beside the same rows read from ``streams``."""
    others = [{r.id: r for r in claim_rows(Analysis(records, stream=s), claims=claims)} for s in streams]
    confirmatory = [r for r in rows if r.confirmatory and r.p is not None]
    if not confirmatory:
        return []
    lines = [
        "## The verdicts under other random streams",
        "",
        f"Each confirmatory row read again from random streams {', '.join(map(str, streams))} (the table above: "
        "stream 0), by the same rules: the decision p (the larger of the bootstrap and t p-values) with its "
        "Holm-adjusted value in brackets. *Moved*: the largest change from stream 0 of each; *three decimals*: "
        "whether every stream gives the same value to three decimals.",
        "",
        "| id | verdict | p [Holm], stream 0 | other streams | moved: p; Holm | three decimals: p; Holm | "
        "verdict in every stream |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in confirmatory:
        read = [o[r.id] for o in others if r.id in o and o[r.id].p is not None]
        if len(read) < len(others):
            lines.append(f"| {r.id} | {r.verdict} | | not read in every stream | | | no |")
            continue
        (p0, holm0), again = _ps(r), [_ps(o) for o in read]
        moved, same = _moved(p0, [p for p, _ in again])
        moved_holm, same_holm = _moved(holm0, [holm for _, holm in again])
        lines.append(
            f"| {r.id} | {r.verdict} | {_fmt(r)} | {', '.join(_fmt(o) for o in read)} | "
            f"{moved:.4f}; {moved_holm:.4f} | {'yes' if same else 'no'}; {'yes' if same_holm else 'no'} | "
            f"{'yes' if all(o.verdict == r.verdict for o in read) else 'no'} |"
        )
    return [*lines, ""]


def _ps(r: Row) -> tuple[float, float]:
    """A read row's decision p and the p its verdict reads (Holm-adjusted for a confirmatory row)."""
    p, holm = r.p, r.decision_p
    assert p is not None and holm is not None
    return p, holm


def _fmt(r: Row) -> str:
    p, holm = _ps(r)
    return f"{fmt_p(p)} [{fmt_p(holm)}]"
