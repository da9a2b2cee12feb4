"""V-GRPO against naive ELBO-GRPO, Flow-GRPO, MixGRPO and DiffusionNFT, and the paper's ablations, on the
embedded base, under the protocol written at the top of the report (:data:`benchmarks.compare.report.PROTOCOL`).

    python -m benchmarks.compare --quick        # V-GRPO against naive ELBO-GRPO on the GenEval reward
    python -m benchmarks.compare                # the full grid (resumable: run it again to continue)
    python -m benchmarks.compare --report-only  # rewrite the report and the MLflow runs from the records
    python -m benchmarks.compare --grid v3      # benchmark v3: the pre-registered replication (plan_v3)
    python -m benchmarks.compare --grid v4      # benchmark v4: the re-tuned methods at 160 iterations (plan_v4)

The grid runs in phases; each phase's cells are independent subprocesses (``--workers`` at a time), and a phase
that needs an earlier one's result (each method's learning rate) is planned when that phase is done:

1. ``base``: the base model's evaluation on the test and validation prompt files (what every curve starts from:
   a fresh LoRA is the base exactly, so no cell evaluates its start again).
2. ``sweep``: each method at three learning rates, one seed, scored on the *validation* prompts.
3. ``methods``: each method at its own best learning rate, ``--seeds`` seeds, held-out curve on the test prompts.
4. ``stability``: V-GRPO and naive ELBO-GRPO at twice V-GRPO's best learning rate, five seeds.
5. ``ablation``: V-GRPO's variance-reduction techniques one at a time (N_MC 2 and 8, v- and eps-prediction).
6. ``preference``: V-GRPO and naive ELBO-GRPO on the preference stage's rewards.

Each cell trains one stage (:func:`vgrpo.training.stage.run_stage`) from ``models/embedded-base`` with
``params/base.yaml`` + ``params/models/embedded.yaml`` + the reward's stage file + the method's
``params/algorithms`` preset + the bench's overrides, and writes one JSON record (atomically): its held-out curve
against training wall time, gradient steps and transformer evaluations (NFE, counted by a hook), the per-image
scores of every evaluation point (what the report's bootstrap resamples), its per-iteration time split, peak
memory and surrogate-CV statistics. A cell whose record exists is skipped, so a killed grid resumes.

This module runs the grid (its plan is :mod:`~benchmarks.compare.plan`, one cell :mod:`~benchmarks.compare.cell`,
the cells' subprocesses :mod:`~benchmarks.compare.cell_runs`) and then writes the report
(:mod:`~benchmarks.compare.report`).

``--grid v3`` runs benchmark v3 instead (:mod:`~benchmarks.compare.plan_v3`, records and report under
``docs/benchmarks-v3/grid``): no sweep (the tuning sweep, :mod:`~benchmarks.compare.tuning`, chose each method's
recipe and rate), an own-rate phase after the stress cells, the seeds the pre-registration fixed. ``--grid v4``
runs benchmark v4 the same way (:mod:`~benchmarks.compare.plan_v4`, ``docs/benchmarks-v4/grid``; the sweep
:mod:`~benchmarks.compare.tuning_v4`), with a replicate V-GRPO group. A pre-registered grid
(:mod:`~benchmarks.compare.registered`) refuses to start a cell before its pre-registration is committed without
``DRAFT`` or while its tuning sweep has not settled every method.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.compare import grid
from benchmarks.compare.analysis import load_records
from benchmarks.compare.cell import run_cell
from benchmarks.compare.cell_runs import record_elapsed, run_phase, sync_records
from benchmarks.compare.plan import (
    PHASES,
    QUICK,
    RunSpec,
    Sizes,
    best_learning_rates,
    full_plan,
    plan_phase,
    sweep_extensions,
)
from benchmarks.compare.registered import GRIDS
from benchmarks.compare.report import write_report
from benchmarks.provenance import code_hash
from vgrpo.atomic import write_json_atomic


def run_grid(args: argparse.Namespace, sizes: Sizes, out: Path, started: float) -> None:
    """Every phase in order (``--phases``), each planned when the phases it needs are done; the sweep adds the
    next rung out while a method's best rung is at an edge of its ladder."""
    if args.grid in GRIDS:
        design = GRIDS[args.grid].design  # its sizes are ``sizes``: --seeds is refused for a pre-registered grid
        for phase in args.phases:
            run_phase(grid.plan_phase(phase, args.tuned, design), args, sizes, out, started)
        return
    tried: list[str] = []  # a rung whose cell failed is not planned again in this invocation
    for phase in PHASES if args.quick else args.phases:
        best: dict[str, float] = {}
        if phase in ("methods", "stability", "ablation") and not args.quick:
            try:
                best = best_learning_rates(load_records(out), sizes)
            except RuntimeError as exc:  # the sweep is not finished: later phases wait for it
                print(f"{phase}: not planned ({exc})", flush=True)
                continue
        specs = plan_phase(phase, sizes, best, args.quick)
        while specs:
            tried += [s.name for s in specs]
            run_phase(specs, args, sizes, out, started)
            extensions = sweep_extensions(load_records(out), sizes) if phase == "sweep" else []
            specs = [s for s in extensions if s.name not in tried]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="V-GRPO against naive ELBO-GRPO only (GenEval)")
    parser.add_argument("--out", default=None, help="records folder (default runs/bench/quick or runs/bench/full)")
    parser.add_argument("--workers", type=int, default=1, help="cells trained at once")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per cell")
    parser.add_argument(
        "--grid",
        choices=("v2", *GRIDS),
        default="v2",
        help="v2 (default), or a pre-registered grid: v3 (the replication), v4 (the re-tuned methods)",
    )
    parser.add_argument(
        "--phases",
        nargs="*",
        default=None,
        choices=sorted(set(PHASES).union(*(g.design.phases for g in GRIDS.values()))),
        help=f"phases to run (v2: {', '.join(PHASES)}; "
        + "; ".join(f"{n}: {', '.join(g.design.phases)}" for n, g in GRIDS.items())
        + ")",
    )
    parser.add_argument("--seeds", type=int, default=None, help="training seeds per method (default 3; quick 1)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--docs", default=None, help="report folder (default docs/benchmarks[-quick])")
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="MLflow store for the cells (default sqlite under the records folder)",
    )
    parser.add_argument(
        "--allow-load",
        action="store_true",
        help="start cells while other processes load the cores (each record says how much); default: wait",
    )
    parser.add_argument(
        "--rerun-loaded", action="store_true", help="run again the cells whose records say they ran under load"
    )
    parser.add_argument(
        "--records",
        type=Path,
        default=None,
        help="committed records the grid resumes from and writes back to (default <docs>/cells.jsonl)",
    )
    parser.add_argument("--cell", help="(internal) run this cell's spec JSON in this process")
    args = parser.parse_args()
    registered = GRIDS.get(args.grid)
    phases = registered.design.phases if registered else PHASES
    args.phases = phases if args.phases is None else args.phases
    if unknown := [p for p in args.phases if p not in phases]:
        parser.error(f"--phases: {unknown} are not phases of grid {args.grid} ({', '.join(phases)})")
    if registered and (args.quick or args.seeds is not None):
        parser.error(
            f"--quick and --seeds are v2's: {args.grid}'s cells and seeds are pre-registered "
            f"(benchmarks/compare/plan_{args.grid}.py)"
        )
    sizes = registered.design.sizes if registered else QUICK if args.quick else Sizes()
    if args.seeds is not None:
        sizes = replace(sizes, seeds=args.seeds)
    name = args.grid if registered else "quick" if args.quick else "full"
    out = Path(args.out or ROOT / "runs" / "bench" / name).resolve()
    if args.cell:
        spec = RunSpec(**json.loads(args.cell))
        write_json_atomic(out / f"{spec.name}.json", run_cell(spec, sizes, out, args.threads))
        return
    args.tuned = None
    if registered:
        try:
            args.tuned = registered.load_tuned()
            if not args.report_only:
                registered.check_preregistered()
        except (RuntimeError, grid.NotPreregistered) as exc:
            parser.error(f"--grid {args.grid}: {exc}")
    out.mkdir(parents=True, exist_ok=True)
    default_docs = {"quick": ROOT / "docs" / "benchmarks-quick", **{n: g.docs for n, g in GRIDS.items()}}
    docs = Path(args.docs) if args.docs else default_docs.get(name, ROOT / "docs" / "benchmarks")
    args.records = args.records or docs / "cells.jsonl"
    sync_records(out, args.records, export=False)
    started = time.perf_counter()
    args.started_at = time.strftime("%Y-%m-%dT%H:%M:%S")
    if not args.report_only:
        run_grid(args, sizes, out, started)
        record_elapsed(out, args, started)  # the grid's elapsed time is the sum of its invocations (it resumes)
    tracking = args.tracking_uri or f"sqlite:///{out / 'mlflow.db'}"
    if registered:
        command = registered.command
        planned = [s.name for s in grid.full_plan(args.tuned, registered.design)]
    else:
        command = "python -m benchmarks.compare" + " --quick" * args.quick
        planned = [s.name for s in full_plan(load_records(out), sizes, args.quick)]
    write_report(
        out,
        docs,
        command=command,
        planned=planned,
        quick=args.quick,
        tracking_uri=tracking,
        sizes=sizes,
        code_now=code_hash(),
        grid=registered,
        tuned=args.tuned,
    )
    print(f"report: {docs / 'README.md'}")


if __name__ == "__main__":
    main()
