"""The tables of the plateau diagnosis (:mod:`benchmarks.compare.diagnosis`), from cell records: per method and
quarter of the run, each per-iteration series of :data:`benchmarks.compare.series.DIAGNOSTICS` (the seeds' median
and range of each cell's quarter mean); the held-out score at each quarter's end; and the held-out curve per prompt
tag, seed-mean per method."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.common import LABELS, METHODS
from benchmarks.compare.series import DIAGNOSTICS, Diagnostic

__all__ = [
    "FALL",
    "NOT_RECORDED",
    "by_method",
    "change_table",
    "diagnostic_table",
    "fall_point",
    "heldout_table",
    "not_recorded",
    "precursor_table",
    "quarter_bounds",
    "quarter_means",
    "seed_tag_table",
    "spread",
    "tag_tables",
]

NOT_RECORDED = "not recorded"
Records = dict[str, list[dict[str, Any]]]


def by_method(records: Sequence[dict[str, Any]], phase: str, reward: str, by: str = "method") -> Records:
    """The trained cells of ``phase`` scoring ``reward``, by method (the report's order), each method's by seed.
    With ``by="rung"``, by rung instead (a tuning sweep's method, recipe and rate, labelled ``V-GRPO nmc10 lr
    0.0004``): the methods in the report's order, each method's recipes in the order of their first cell, rates
    rising."""
    if by not in ("method", "rung"):
        raise ValueError(f"by: {by!r} is not 'method' or 'rung'")
    cells = [r for r in records if r["spec"]["phase"] == phase and r["spec"]["reward"] == reward]
    order = {m: i for i, m in enumerate((*METHODS, *sorted({r["spec"]["method"] for r in cells} - set(METHODS))))}
    recipes: dict[tuple[str, str], int] = {}
    for r in cells if by == "rung" else ():
        recipes.setdefault((r["spec"]["method"], r["spec"]["variant"]), len(recipes))

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        spec = r["spec"]
        if by == "method":
            return (order[spec["method"]],)
        return (order[spec["method"]], recipes[(spec["method"], spec["variant"])], spec["lr"])

    out: Records = {}
    for r in sorted(cells, key=lambda r: (*key(r), r["spec"]["seed"])):
        spec = r["spec"]
        label = spec["method"]
        if by == "rung":
            label = f"{LABELS.get(label, label)} {spec['variant']} lr {spec['lr']:g}"
        out.setdefault(label, []).append(r)
    return out


def quarter_bounds(n: int) -> list[tuple[int, int]]:
    """``[start, stop)`` positions of the four quarters of ``n`` iterations (``n = 80``: 0-20, 20-40, 40-60, 60-80)."""
    edges = [round(n * k / 4) for k in range(5)]
    return list(itertools.pairwise(edges))


def span_means(series: Sequence[float | None], bounds: Sequence[tuple[int, int]]) -> list[float | None]:
    """The mean of a per-iteration series over each ``[start, stop)`` span, over the iterations that logged it
    (None: none did)."""
    out: list[float | None] = []
    for start, stop in bounds:
        values = [v for v in series[start:stop] if v is not None]
        out.append(sum(values) / len(values) if values else None)
    return out


def quarter_means(series: Sequence[float | None]) -> list[float | None]:
    """Each quarter's mean of a per-iteration series (:func:`span_means`)."""
    return span_means(series, quarter_bounds(len(series)))


def fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def spread(values: Sequence[float | None]) -> str:
    """The seeds' median and range, ``median [min, max]``; :data:`NOT_RECORDED` when no seed has a value."""
    known = [v for v in values if v is not None]
    if not known:
        return NOT_RECORDED
    if len(known) == 1:
        return fmt(known[0])
    return f"{fmt(statistics.median(known))} [{fmt(min(known))}, {fmt(max(known))}]"


def _quarter_labels(records: Records) -> list[str]:
    n = max(len(r.get("train_reward") or []) for cells in records.values() for r in cells)
    return [f"it. {start + 1}-{stop}" for start, stop in quarter_bounds(n)]


def _header(first: str, columns: Sequence[str]) -> list[str]:
    return [f"| {first} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]


def diagnostic_table(records: Records, diagnostic: Diagnostic) -> list[str] | None:
    """One row per method: the diagnostic's quarter means, seeds' median [range]; None when no cell records it."""
    per_method = {m: [quarter_means(r.get(diagnostic.record_key) or []) for r in cells] for m, cells in records.items()}
    if all(q is None for rows in per_method.values() for row in rows for q in row):
        return None
    lines = _header("method", _quarter_labels(records))
    for method, rows in per_method.items():
        cols = [spread([row[k] if k < len(row) else None for row in rows]) for k in range(4)]
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cols) + " |")
    return lines


def not_recorded(records: Records) -> list[Diagnostic]:
    """The diagnostics no cell of ``records`` carries a value of."""
    return [d for d in DIAGNOSTICS if diagnostic_table(records, d) is None]


def _point_at(curve: Sequence[dict[str, Any]], iteration: int) -> dict[str, Any] | None:
    """The curve's last evaluation point at or before ``iteration``."""
    before = [p for p in curve if p["iteration"] <= iteration]
    return before[-1] if before else None


def heldout_table(records: Records) -> list[str]:
    """The held-out score at the end of each quarter (the last evaluation point at or before it), seeds' median
    [range]: the curve to set against the train reward's."""
    n = max(len(r.get("train_reward") or []) for cells in records.values() for r in cells)
    ends = [stop for _, stop in quarter_bounds(n)]
    lines = _header("method", [f"it. {e}" for e in ends])
    for method, cells in records.items():
        cols = []
        for end in ends:
            scores = [p["score"] for r in cells if (p := _point_at(r["curve"], end)) is not None]
            cols.append(spread(scores) if scores else "before the first evaluation")
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cols) + " |")
    return lines


def _tag_mean(per_prompt: Sequence[float], tags: Sequence[str], tag: str) -> float:
    values = [s for s, t in zip(per_prompt, tags, strict=True) if t == tag]
    return sum(values) / len(values)


def tag_tables(records: Records, tags: Sequence[str], base: dict[str, Any] | None) -> list[str]:
    """Per tag, one row per method: the tag's held-out score (the mean over its prompts) at each evaluation point,
    the seeds' mean, then the last point's seed range; the base model's score as iteration 0 where ``base`` (the
    base cell's record) is given."""
    iterations = sorted({int(p["iteration"]) for cells in records.values() for r in cells for p in r["curve"]})
    columns = (["0 (base)"] if base is not None else []) + [str(i) for i in iterations] + ["last: seed range"]
    lines: list[str] = []
    for tag in dict.fromkeys(tags):  # first-seen order
        lines += ["", f"**{tag}** ({sum(t == tag for t in tags)} prompts)", "", *_header("method", columns)]
        for method, cells in records.items():
            cols = [] if base is None else [fmt(_tag_mean(base["curve"][0]["per_prompt"], tags, tag))]
            for it in iterations:
                values = [
                    _tag_mean(p["per_prompt"], tags, tag) for r in cells for p in r["curve"] if p["iteration"] == it
                ]
                cols.append(fmt(sum(values) / len(values)) if values else "")
            last = [_tag_mean(r["curve"][-1]["per_prompt"], tags, tag) for r in cells if r["curve"]]
            cols.append(f"[{fmt(min(last))}, {fmt(max(last))}]" if last else "")
            lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cols) + " |")
    return lines


def _per_seed(cells: Sequence[dict[str, Any]], fn: Any) -> str:
    values = []
    for r in cells:
        try:
            values.append(fn(r))
        except (TypeError, ZeroDivisionError):  # a series the cell does not record (None), or a zero to divide by
            values.append(None)
    return spread(values)


def change_table(records: Records) -> list[str]:
    """Per method, what changed late in the run, per seed then the seeds' median [range]: the train reward's last
    quarter mean less its third's, the held-out score's gain over the last quarter and over the second half, and
    the gradient norm's and surrogate CV's last quarter over their first (a collapse shows as a ratio well below 1)."""
    n = max(len(r.get("train_reward") or []) for cells in records.values() for r in cells)
    _, (_, half), (_, q3), (_, end) = quarter_bounds(n)

    def q(key: str, k: int) -> Any:
        return lambda r: quarter_means(r.get(key) or [])[k]

    def score(r: dict[str, Any], at: int) -> float | None:
        point = _point_at(r["curve"], at)
        return None if point is None else float(point["score"])

    def held(at: int, since: int) -> Any:
        def gain(r: dict[str, Any]) -> float | None:
            now, then = score(r, at), score(r, since)
            return None if now is None or then is None else now - then

        return gain

    def ratio(key: str) -> Any:
        return lambda r: q(key, 3)(r) / q(key, 0)(r)

    columns = {
        "train reward, Q4 - Q3": lambda r: q("train_reward", 3)(r) - q("train_reward", 2)(r),
        f"held-out, it. {end} - it. {q3}": held(end, q3),
        f"held-out, it. {end} - it. {half}": held(end, half),
        "grad norm, Q4 / Q1": ratio("grad_norm_per_iteration"),
        "surrogate CV, Q4 / Q1": ratio("surrogate_cv_per_iteration"),
        "CV within group, Q4 / Q1": ratio("surrogate_cv_within_group_per_iteration"),
    }
    lines = _header("method", list(columns))
    for method, cells in records.items():
        cols = [_per_seed(cells, fn) for fn in columns.values()]
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cols) + " |")
    return lines


def seed_tag_table(records: Records, tags: Sequence[str]) -> list[str]:
    """Each cell's last evaluation point: its held-out score and each tag's, one row per seed (what the seed
    ranges of :func:`tag_tables` are made of, to see which tags move together across seeds)."""
    names = list(dict.fromkeys(tags))
    lines = _header("method", ["seed", "iteration", "score", *names])
    for method, cells in records.items():
        for r in cells:
            if not r["curve"]:
                continue
            point = r["curve"][-1]
            cols = [str(r["spec"]["seed"]), str(int(point["iteration"])), fmt(point["score"])]
            cols += [fmt(_tag_mean(point["per_prompt"], tags, tag)) for tag in names]
            lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cols) + " |")
    return lines


FALL = 0.08
"""A held-out fall: an evaluation point this far below the cell's best point before it (the tuning sweeps' late
collapse margin, pre-registered for v3's and v4's sweeps)."""
PRECURSORS = (
    ("gradient norm", "grad_norm_per_iteration"),
    ("surrogate mean", "surrogate_mean_per_iteration"),
    ("train reward", "train_reward"),
)


def fall_point(curve: Sequence[dict[str, Any]], fall: float = FALL) -> tuple[int, float, float] | None:
    """The first evaluation point more than ``fall`` below the best point before it: (iteration, best, score)."""
    best = None
    for p in curve:
        if best is not None and p["score"] < best - fall:
            return int(p["iteration"]), best, float(p["score"])
        best = p["score"] if best is None else max(best, p["score"])
    return None


def _block_means(series: Sequence[float | None], width: int) -> list[float | None]:
    return span_means(series, [(start, start + width) for start in range(0, len(series), width)])


def precursor_table(records: Records, fall: float = FALL, first: str = "method") -> list[str]:
    """For every method (rung) with a cell whose held-out score fell (:func:`fall_point`), each of its seeds: where
    it fell, and each series of :data:`PRECURSORS` as means over the blocks between evaluation points (the last
    block the one ending at the fall), beside the seeds that did not fall: what moved before the score did. Empty
    when no cell fell."""
    lines: list[str] = []
    for method, cells in records.items():
        falls = [fall_point(r["curve"], fall) for r in cells]
        if not any(falls):
            continue
        width = int(cells[0]["spec"].get("eval_every") or 1)
        stop = max(f[0] for f in falls if f)
        if not lines:
            lines = _header(first, ["seed", "held-out fell at", *(name for name, _ in PRECURSORS)])
        for r, f in zip(cells, falls, strict=True):
            where = f"it. {f[0]}: {f[1]:.3f} to {f[2]:.3f}" if f else "did not fall"
            cols = [str(r["spec"]["seed"]), where]
            for _, key in PRECURSORS:
                blocks = _block_means(r.get(key) or [], width)[: (f[0] if f else stop) // width]
                shown = " → ".join(NOT_RECORDED if v is None else fmt(v) for v in blocks)
                cols.append(shown if any(v is not None for v in blocks) else NOT_RECORDED)
            lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cols) + " |")
    return lines
