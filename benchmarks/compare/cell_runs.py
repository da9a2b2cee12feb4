"""Running a phase's cells: each a subprocess (``python -m benchmarks.compare --cell SPEC``), ``--workers`` at a
time, resumed from the records on disk when their provenance key still holds, and written back to the committed
records after each cell (so a killed run leaves its finished cells in the repository). The grid
(:mod:`benchmarks.compare.runner`) and the tuning sweep (:mod:`benchmarks.compare.tuning`) both run their cells
through it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.compare.analysis import load_records, write_records
from benchmarks.compare.cell import expected_key
from benchmarks.compare.plan import RunSpec, Sizes
from benchmarks.provenance import wait_until_idle
from vgrpo.atomic import write_json_atomic


def sync_records(out: Path, committed: Path, *, export: bool) -> None:
    """The committed records (``cells.jsonl``, one JSON per line) and the records folder, made to agree: on start,
    records only the committed file has are copied into the folder (the grid resumes in a fresh clone); after
    each cell, the folder's records are written back to the file (atomically), so that a grid killed at any
    point leaves its finished cells in the repository."""
    if export:
        write_records(committed, load_records(out))
        return
    if committed.is_file():
        for name, record in load_records(committed).items():
            if "key" in record and not (out / f"{name}.json").is_file():  # (a record without one predates keys)
                write_json_atomic(out / f"{name}.json", record)


def reusable(spec: RunSpec, args: argparse.Namespace, sizes: Sizes, out: Path) -> bool:
    """Whether ``spec``'s record on disk can stand: it carries the key of this spec, config, thread count and
    code (:mod:`benchmarks.provenance`), and (with ``--rerun-loaded``) it did not run under load. A record that
    cannot stand is moved to ``stale/`` (kept, never overwritten) so that the cell runs again."""
    path = out / f"{spec.name}.json"
    if not path.is_file():
        return False
    record = json.loads(path.read_text())
    key = expected_key(spec, sizes, out, args.threads)
    loaded = args.rerun_loaded and record.get("machine", {}).get("under_load", False)
    if record.get("key") == key and not loaded:
        return True
    stale = out / "stale" / f"{spec.name}.{record.get('key', 'nokey')}.{int(path.stat().st_mtime)}.json"
    stale.parent.mkdir(parents=True, exist_ok=True)
    path.rename(stale)
    why = "ran under load" if record.get("key") == key else "another config, thread count or code"
    print(f"{spec.name}: its record is stale ({why}); moved to {stale.relative_to(out)}", flush=True)
    return False


def run_phase(specs: list[RunSpec], args: argparse.Namespace, sizes: Sizes, out: Path, started: float) -> None:
    """Run the phase's cells that have no reusable record, ``args.workers`` subprocesses at a time."""
    todo = [s for s in specs if not reusable(s, args, sizes, out)]
    running: list[tuple[RunSpec, subprocess.Popen[bytes], float]] = []
    (out / "logs").mkdir(parents=True, exist_ok=True)
    while todo or running:
        while todo and len(running) < args.workers:
            if not args.allow_load:
                wait_until_idle(exclude={p.pid for _, p, _ in running})
            spec = todo.pop(0)
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.compare",
                "--cell",
                json.dumps(asdict(spec)),
                "--out",
                str(out),
                "--threads",
                str(args.threads),
                "--grid",
                args.grid,
            ] + (["--quick"] if args.quick else [])
            with open(out / "logs" / f"{spec.name}.log", "wb") as log:
                proc = subprocess.Popen(
                    cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
                )
            running.append((spec, proc, time.perf_counter()))
        time.sleep(2)
        for item in list(running):
            spec, proc, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            status = "ok" if proc.returncode == 0 else f"FAILED (rc {proc.returncode}; logs/{spec.name}.log)"
            if proc.returncode == 0:
                machine = json.loads((out / f"{spec.name}.json").read_text()).get("machine", {})
                if machine.get("under_load"):
                    status += f" (under load: other processes used {machine['other_load_cores']:.2f} cores)"
            print(
                f"[{(time.perf_counter() - started) / 60:5.1f} min] {spec.name}: {status} in "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            record_elapsed(out, args, started)
            sync_records(out, args.records, export=True)


def record_elapsed(out: Path, args: argparse.Namespace, started: float) -> None:
    """This invocation's elapsed time in ``grid.json`` beside the committed records (one entry per invocation: a
    killed grid's time counts, and the machine time of a grid run over several sessions adds up)."""
    grid = args.records.parent / "grid.json"
    history = json.loads(grid.read_text()) if grid.is_file() else []
    entry = {
        "started_at": args.started_at,
        "elapsed_s": time.perf_counter() - started,
        "workers": args.workers,
        "threads": args.threads,
    }
    history = [h for h in history if h.get("started_at") != args.started_at] + [entry]
    write_json_atomic(grid, history)
