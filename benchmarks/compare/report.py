"""Turn the cells of :mod:`benchmarks.compare` into the benchmark report (markdown, PNG plots) and MLflow runs.

    python -m benchmarks.compare.report runs/bench/full docs/benchmarks [--tracking-uri sqlite:////abs/mlflow.db]
    python -m benchmarks.compare.report docs/benchmarks/cells.jsonl docs/benchmarks  # again, from the records
    python -m benchmarks.compare.report docs/benchmarks-v3/grid/cells.jsonl docs/benchmarks-v3/grid --grid v3

Every number in the report is computed from the cell records (:mod:`~benchmarks.compare.analysis` and
:mod:`~benchmarks.compare.bootstrap` for the intervals, :mod:`~benchmarks.compare.claims` for the verdicts); nothing
is typed in by hand. The protocol below is printed at the top of the report with the sizes the cells ran at.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from benchmarks.common import LABELS, METHODS, ROOT
from benchmarks.compare.analysis import AXES, Analysis, load_records, write_records
from benchmarks.compare.claim_rows import claim_rows
from benchmarks.compare.claim_sets import V2
from benchmarks.compare.exchange_check import exchange_lines
from benchmarks.compare.grid import Tuned
from benchmarks.compare.grid import full_plan as full_grid_plan
from benchmarks.compare.method_tables import cost_ratios, methods_table, time_to_reward
from benchmarks.compare.mlflow_runs import track
from benchmarks.compare.phase_tables import (
    ablation_table,
    preference_table,
    provenance_table,
    quick_table,
    stability_table,
    sweep_table,
)
from benchmarks.compare.plan import (
    PHASES,
    QUICK,
    RunSpec,
    Sizes,
    full_plan,
    plan_phase,
    stage_config,
)
from benchmarks.compare.plots import plot_curves
from benchmarks.compare.protocol import protocol_lines
from benchmarks.compare.registered import GRIDS, Registered
from benchmarks.compare.standing import standing_lines
from benchmarks.compare.stream_check import stream_lines
from benchmarks.compare.verdicts import Row, claims_table
from benchmarks.provenance import code_hash
from vgrpo.atomic import write_text_atomic


def config_mismatches(records: dict[str, dict[str, Any]], sizes: Sizes) -> list[str]:
    """The trained cells whose recorded config differs from the one this checkout's plan gives their spec.

    A record is read through the plan's config model, so a setting added after the cell ran (absent from its
    record) counts as the default it ran with; a setting removed since (unknown to the model) is a difference."""
    out = []
    for name, r in sorted(records.items()):
        if r["spec"]["phase"] == "base" or "config" not in r:
            continue
        spec = RunSpec(**r["spec"])
        planned = stage_config(spec, sizes, Path(r["config"]["eval_prompts"]))
        try:
            recorded = type(planned).model_validate(r["config"]).model_dump(mode="json")
        except ValidationError:
            recorded = r["config"]
        if planned.model_dump(mode="json") != recorded:
            out.append(name)
    return out


def tuned_table(tuned: dict[str, Tuned], lines: list[str]) -> None:
    """Each method's recipe and rate, as the tuning sweep chose them."""
    lines += ["## Recipes and rates (the tuning sweep's choice)", "", "| method | recipe | rate | settings |"]
    lines.append("|---|---|---|---|")
    for m, t in tuned.items():
        settings = json.dumps(t.overrides, sort_keys=True) if t.overrides else "its params/algorithms preset"
        lines.append(f"| {LABELS[m]} | {t.recipe} | {t.lr:g} | `{settings}` |")
    lines.append("")


def deviation_lines(path: Path) -> list[str]:
    """The report's section on how the grid departed from its pre-registration: the body of ``path`` (its title
    line left out), or a line saying that no file lists any."""
    lines = ["## Deviations from the pre-registration", ""]
    if not path.is_file():
        return [*lines, f"None listed (`{path.name}` does not exist).", ""]
    body = path.read_text().splitlines()
    if body and body[0].startswith("# "):
        body = body[1:]
    return [*lines, f"From `{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`:", *body, ""]


def _invocations(docs: Path) -> list[dict[str, Any]]:
    """The grid's invocations as ``grid.json`` beside the records lists them (elapsed seconds, workers, threads)."""
    path = docs / "grid.json"
    return list(json.loads(path.read_text())) if path.is_file() else []


def write_report(
    out: Path,
    docs: Path,
    *,
    command: str,
    planned: Sequence[str],
    quick: bool = False,
    tracking_uri: str | None = None,
    sizes: Sizes | None = None,
    code_now: str | None = None,
    grid: Registered | None = None,
    tuned: dict[str, Tuned] | None = None,
) -> list[Row]:
    """Write ``docs/README.md`` and the plots from the cell records in ``out`` (a folder or a ``cells.jsonl``),
    and the MLflow runs; return the claim rows. With a pre-registered ``grid`` (:data:`GRIDS`) and ``tuned`` (each
    method's recipe and rate), the report is that grid's: its departures from the pre-registration first, its
    protocol, its claim set, no sweep."""
    records = load_records(out)
    sizes = sizes or (grid.design.sizes if grid else QUICK if quick else Sizes())
    docs.mkdir(parents=True, exist_ok=True)
    if (grid is None) != (tuned is None):
        raise ValueError("a pre-registered grid's report needs both the grid and its tuned recipes")
    claims = V2 if grid is None else grid.claims
    an = Analysis(records)
    history = _invocations(docs)
    if grid is not None:
        title = f"# {grid.title}"
        alone = f"{grid.command} --report-only"
    else:
        title = "# Benchmarks: V-GRPO and the baselines on the embedded default"
        folder = "docs/benchmarks-quick" if quick else "docs/benchmarks"
        alone = f"python -m benchmarks.compare.report {folder}/cells.jsonl {folder}{' --quick' if quick else ''}"
    lines = [
        title,
        "",
        f"Produced by `{command}`; the report alone, from the committed records: `{alone}`. Machine: 2 CPU cores, "
        "no GPU.",
        "",
        *(deviation_lines(grid.deviations) if grid is not None else []),
        protocol_lines(sizes, quick, grid, history),
    ]
    if tuned is not None:
        tuned_table(tuned, lines)
    done = [n for n in planned if n in records]
    missing = [n for n in planned if n not in records]
    elapsed = sum(float(x["elapsed_s"]) for x in history) if history else float("nan")
    cell_s = sum(float(r.get("wall_s", 0.0)) for r in records.values())
    lines += [
        f"Cells done: {len(done)} of {len(planned)} planned. Machine time: the {len(history)} invocation(s) recorded "
        f"in grid.json took {elapsed / 3600:.2f} h; the cells' own wall time (loading, training, evaluations) sums "
        f"to {cell_s / 3600:.2f} h.",
        "",
    ]
    if missing:
        lines += [f"Not run yet ({len(missing)}; the command resumes the grid): {', '.join(missing)}", ""]
    later = PHASES[2:]
    if grid is None and not quick and not any(n.startswith(tuple(f"{p}-" for p in later)) for n in planned):
        every = {m: 1e-4 for m in METHODS}  # the count does not depend on the rates
        count = sum(len(plan_phase(p, sizes, every, False)) for p in later)
        lines += [
            f"The phases after the sweep ({', '.join(later)}: {count} cells at these sizes) are planned when the "
            "sweep has chosen every method's rate.",
            "",
        ]
    rows: list[Row] = []
    if an.base and not quick:
        rows = claim_rows(an, claims=claims)
        lines += claims_table(rows, len(claims.confirmatory))
        if grid is not None:
            lines += stream_lines(records, rows, claims)
            lines += exchange_lines(records, rows, claims)  # nothing unless the grid ran a replicate group
        if an.groups:
            methods_table(an, lines)
            if grid is not None:
                lines += standing_lines(an, f"test prompts, {sizes.iterations} iterations, the methods cells")
            cost_ratios(an, (out.parent if out.is_file() else docs) / "speed", lines)  # speed.md's repeats
            time_to_reward(an, lines)
            for axis in AXES:
                plot_curves(
                    an, axis, docs / f"geneval-vs-{axis}.png", f"test GenEval strict vs {AXES[axis].split(' (')[0]}"
                )
                lines += [f"![GenEval vs {axis}](geneval-vs-{axis}.png)", ""]
            lines += [
                "Bands: each method's own 95% interval over prompts and seeds at each evaluation point; they include "
                "the prompts' shared difficulty, which the paired differences remove.",
                "",
            ]
        stability_table(an, lines)
        ablation_table(an, lines)
        preference_table(an, lines)
    sweep_table(an, sizes, lines)
    if quick:
        quick_table(an, lines)
    provenance_table(records, code_now, config_mismatches(records, sizes), lines)
    write_text_atomic(docs / "README.md", "\n".join(lines) + "\n")
    if out.is_dir():  # the records themselves (the report's only input), so the numbers can be recomputed
        write_records(docs / "cells.jsonl", records)
    if tracking_uri:
        track(records, tracking_uri, grid=grid.name if grid else "quick" if quick else "full", claims=rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the cells' folder (runs/bench/full) or a report's cells.jsonl")
    parser.add_argument("docs", type=Path, help="report folder")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--grid", choices=("v2", *GRIDS), default="v2", help="the grid the records are of")
    args = parser.parse_args()
    records = load_records(args.out)
    grid, tuned = GRIDS.get(args.grid), None
    if grid is not None:
        try:
            tuned = grid.load_tuned()
        except RuntimeError as exc:
            parser.error(f"--grid {args.grid}: {exc}")
        sizes, planned = grid.design.sizes, [s.name for s in full_grid_plan(tuned, grid.design)]
    else:
        sizes = QUICK if args.quick else Sizes()
        planned = [s.name for s in full_plan(records, sizes, args.quick)]
    write_report(
        args.out,
        args.docs,
        command=grid.command if grid else "python -m benchmarks.compare" + " --quick" * args.quick,
        planned=planned,
        quick=args.quick,
        tracking_uri=args.tracking_uri,
        sizes=sizes,
        code_now=code_hash(),
        grid=grid,
        tuned=tuned,
    )


if __name__ == "__main__":
    main()
