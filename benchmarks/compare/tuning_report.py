"""A tuning sweep's report (:mod:`benchmarks.compare.tuning`, :mod:`benchmarks.compare.tuning_v4`): the rung
table with the rule's verdict per rung, the chosen rungs' strength, every rung's curve and the choices. A sweep
adds its own lines under the header (:attr:`ReportText.preamble`) and columns to the rung table
(:class:`Column`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.common import LABELS, METHODS
from benchmarks.compare.plan import RunSpec
from benchmarks.compare.rungs import BASE, Rung, Sweep
from benchmarks.compare.tuning_tables import curve_lines, strength_lines


@dataclass(frozen=True)
class ReportText:
    """What names the sweep in its report."""

    benchmark: str  # "v3"
    stated_in: str  # where the recipes, the rates and the rule are stated
    horizon: str  # what the horizon is
    preamble: tuple[str, ...] = ()  # paragraphs after the header, each followed by a blank line


@dataclass(frozen=True)
class Column:
    """A column a sweep adds to the rung table."""

    header: str
    cell: Callable[[Rung], str]


def report(
    sweep: Sweep,
    text: ReportText,
    records: dict[str, dict[str, Any]],
    planned: list[RunSpec],
    command: str,
    columns: Sequence[Column] = (),
) -> str:
    done = sweep.rungs(records)
    chosen = sweep.choose(records)
    base = records.get(BASE.name)
    missing = [s.name for s in planned if s.name not in records]
    seeds = f"{sweep.seeds} seeds ({sweep.seed0}-{sweep.seed0 + sweep.seeds - 1})"
    lines = [
        f"# Benchmark {text.benchmark}: the tuning sweep (validation prompts)",
        "",
        f"Produced by `{command}` from the records in `docs/benchmarks-{text.benchmark}/tuning/cells.jsonl`"
        f" ({text.stated_in}).",
        "",
        *(line for paragraph in text.preamble for line in (paragraph, "")),
        f"Each rung: one recipe at one rate, {seeds}, {sweep.iterations} iterations ({text.horizon}), validation"
        f" GenEval strict every {sweep.eval_every} iterations. *Stable*: on every seed the final is at most"
        f" {sweep.drop_margin} below the seed's best point, no point is more than {sweep.collapse_margin} below the"
        " base, no divergence. The chosen rung (bold) is each method's stable rung with the highest seed mean."
        " *Last quarter*: the final minus the point at 3/4 of the horizon, seed mean (near 0 on a plateau).",
        "",
        f"Base: {base['curve'][0]['score']:.3f} on the validation prompts." if base else "Base: not run yet.",
        "",
        f"Cells done: {sum(1 for s in planned if s.name in records)} of {len(planned)} planned"
        + (f"; not run yet: {len(missing)}." if missing else "."),
        "",
        "| method | recipe | lr | final per seed | mean | last quarter | worst drop from own best "
        "| lowest point - base | stable |" + "".join(f" {c.header} |" for c in columns),
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(columns),
    ]
    for r in done:
        c = chosen.get(r.method)
        mark = "**" if c is not None and (c.recipe, c.lr) == (r.recipe, r.lr) else ""  # (NaN fields: not ==)
        finals = ", ".join("diverged" if f == float("-inf") else f"{f:.3f}" for f in r.finals)
        lines.append(
            f"| {LABELS[r.method]} | {r.recipe} | {mark}{r.lr:g}{mark} | {finals} | {mark}{r.mean:.3f}{mark} | "
            f"{r.last_quarter:+.3f} | {r.worst_drop:+.3f} | {r.worst_below_base:+.3f} | "
            f"{'yes' if sweep.stable(r) else 'no'} |" + "".join(f" {col.cell(r)} |" for col in columns)
        )
    lines.append("")
    if base is not None:
        lines += strength_lines(sweep.chosen_as_methods(records), chosen, sweep.seeds)
    lines += ["## Curves (seed mean of validation strict at each evaluation point)", ""]
    lines += curve_lines(records, sweep.eval_every, sweep.iterations)
    lines += ["", "## Choice", ""]
    for m in METHODS:
        c = chosen[m]
        rungs_planned = {(s.variant, s.lr) for s in planned if s.method == m and s.phase == sweep.phase}
        rungs_done = {(r.recipe, r.lr) for r in done if r.method == m}
        pending = len(rungs_planned - rungs_done)
        status = f" (provisional: {pending} of its {len(rungs_planned)} rungs not finished)" if pending else ""
        lines.append(
            f"- {LABELS[m]}: "
            + (f"{c.recipe} at lr {c.lr:g} (mean {c.mean:.3f}){status}" if c else f"not chosen yet{status}")
        )
    return "\n".join(lines) + "\n"
