"""The tuning report's tables (:mod:`benchmarks.compare.tuning`): each rung's curve, and the chosen rungs'
strength with intervals."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from benchmarks.common import LABELS
from benchmarks.compare.analysis import Analysis, final, start
from benchmarks.compare.bootstrap import interval
from benchmarks.compare.method_tables import PLATEAU, est_ci, fmt_ci, plateau
from benchmarks.compare.standing import standing_lines


def strength_lines(grid: dict[str, dict[str, Any]], chosen: Mapping[str, Any], seeds: int) -> list[str]:
    """Each method's chosen rung (``chosen``: method -> rung, with its ``recipe`` and ``lr``), strongest first, from
    ``grid``, the chosen rungs' cells as the grid's methods cells
    (:func:`benchmarks.compare.tuning.chosen_as_methods`): its final score and gain over the base with 95%
    intervals (validation prompts and the ``seeds`` resampled), and whether its curve has plateaued."""
    an = Analysis(grid)
    if not an.groups:
        return []
    lines = [
        "## Baseline strength (each method's chosen rung)",
        "",
        "Validation GenEval strict at the horizon, 95% intervals over the validation prompts and the "
        f"{seeds} seeds. *Last quarter*: final minus the point at 3/4 of the horizon; *plateaued* when its "
        f"interval lies within +-{PLATEAU}, *rising* when it lies above 0.",
        "",
        "| rank | method | recipe | lr | final [95% CI] | gain over base [95% CI] | last quarter |",
        "|---|---|---|---|---|---|---|",
    ]
    ranked = sorted(an.groups.items(), key=lambda kv: -float(an.statistic([kv], final)[0]))
    for rank, (m, g) in enumerate(ranked, 1):
        rung = chosen[m]
        assert rung is not None
        est, reps = an.statistic([(m, g)], final)
        low, high = interval(reps)
        gain = est_ci(an, [(m, g)], lambda c: final(c) - start(c))
        lines.append(
            f"| {rank} | {LABELS[m]} | {rung.recipe} | {rung.lr:g} | {est:.3f} {fmt_ci(low, high)} | {gain} | "
            f"{plateau(an, m, g)} |"
        )
    return [*lines, "", *standing_lines(an, f"validation prompts, the chosen rungs, {seeds} seeds")]


def curve_lines(records: dict[str, dict[str, Any]], every: int, horizon: int) -> list[str]:
    """Each rung's seed-mean validation curve, a column per evaluation point (every ``every`` iterations up to
    ``horizon``)."""
    by_rung: dict[tuple[str, str, float], list[list[float]]] = {}
    for record in records.values():
        spec = record["spec"]
        if spec["phase"] == "tune" and record["curve"]:
            by_rung.setdefault((spec["method"], spec["variant"], spec["lr"]), []).append(
                [p["score"] for p in record["curve"]]
            )
    points = list(range(every, horizon + 1, every))
    lines = ["| method | recipe | lr | seeds | " + " | ".join(str(p) for p in points) + " |"]
    lines.append("|---|---|---|---|" + "---|" * len(points))
    for (m, recipe, lr), curves in sorted(by_rung.items()):
        cols = [
            f"{statistics.mean(c[i] for c in curves):.3f}" if all(len(c) > i for c in curves) else ""
            for i in range(len(points))
        ]
        lines.append(f"| {LABELS[m]} | {recipe} | {lr:g} | {len(curves)} | " + " | ".join(cols) + " |")
    return lines
