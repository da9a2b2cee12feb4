"""Running a tuning sweep (:mod:`benchmarks.compare.tuning`, :mod:`benchmarks.compare.tuning_v4`): its command
line, and its cells in the sweep's order, planned again after each (a finished rung may add an edge extension,
which runs next to its recipe's other rungs), until its plan has nothing left to run; then its report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.compare import cell_runs
from benchmarks.compare.analysis import load_records
from benchmarks.compare.plan import RunSpec, Sizes, eval_prompt_file
from benchmarks.compare.rungs import Sweep
from vgrpo.atomic import write_text_atomic


def parser(prog: str, description: str, out: Path, docs: Path) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", type=Path, default=out, help="records folder")
    parser.add_argument("--docs", type=Path, default=docs)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--allow-load", action="store_true", help="start cells while other processes load the cores")
    parser.add_argument("--report-only", action="store_true")
    return parser


def committed_records(args: argparse.Namespace) -> Path:
    """The committed records of the sweep: ``<docs>/tuning/cells.jsonl``."""
    return Path(args.docs) / "tuning" / "cells.jsonl"


def running_order(sweep: Sweep, spec: RunSpec) -> int:
    """A cell's place in the running order: the base first, then by its (method, recipe) in the sweep's order, so
    that a recipe's edge extensions run before the recipes after it (the sort keeps the plan's order within one)."""
    return -1 if spec.phase == "base" else sweep.order.index((spec.method, spec.variant))


def run(
    sweep: Sweep,
    args: argparse.Namespace,
    report: Callable[[dict[str, dict[str, Any]], list[RunSpec]], str],
    runnable: Callable[[dict[str, dict[str, Any]]], Callable[[RunSpec], bool]] | None = None,
) -> int:
    """Run (or resume) the sweep's cells in ``args.out``, writing them back to the committed records after each,
    then write ``report(records, planned)`` to ``<docs>/tuning.md`` (only that with ``--report-only``).
    ``runnable(records)`` says which of the cells left this machine may run (default: all); the others are left
    for a machine that may, and named."""
    args.quick, args.rerun_loaded, args.grid = False, False, "v2"  # the cells run at the v2 grid's sizes
    args.records = committed_records(args)
    args.records.parent.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cell_runs.sync_records(out, args.records, export=False)
    started = time.perf_counter()
    args.started_at = time.strftime("%Y-%m-%dT%H:%M:%S")
    sizes = Sizes()
    eval_prompt_file(out, "geneval", "val", sizes)  # written once here, not by two cells at once
    tried: set[str] = set()  # a cell that failed is not started again in this invocation
    while not args.report_only:
        records = load_records(out)
        left = [s for s in sweep.plan(records) if not (out / f"{s.name}.json").is_file()]
        here = runnable(records) if runnable else (lambda _: True)
        todo = sorted((s for s in left if here(s) and s.name not in tried), key=lambda spec: running_order(sweep, spec))
        if not todo:
            if others := [s for s in left if not here(s)]:
                names = ", ".join(s.name for s in others)
                print(f"{len(others)} cells left for another machine: {names}", file=sys.stderr)
            break
        # ``workers`` cells at a time, planned again after each batch: a rung's edge extension runs as soon as
        # its recipe's rungs call for it, before the recipes after it in the sweep's order
        batch = todo[: max(1, args.workers)]
        tried |= {s.name for s in batch}
        cell_runs.run_phase(batch, args, sizes, out, started)
    failed = sorted(n for n in tried if not (out / f"{n}.json").is_file())
    if failed:
        print(f"{len(failed)} cells did not finish (see their logs): {', '.join(failed)}", file=sys.stderr)
    records = load_records(out)
    write_text_atomic(args.docs / "tuning.md", report(records, sweep.plan(records)))
    print(json.dumps({m: (c.recipe, c.lr) if c else None for m, c in sweep.choose(records).items()}))
    return 1 if not args.report_only and failed else 0
