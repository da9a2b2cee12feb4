"""The curriculum's live progress in the terminal, while Prefect's event stream goes to its log and UI.

The flow writes where it stands (stage k of n, and whether it prepares prompts, trains, evaluates or found the stage
cached) to ``<run dir>/progress.json`` (:func:`write_stage_state`); the training stage writes its iterations
(:class:`vgrpo.progress_line.Progress`) to ``<run dir>/work/<stage>/progress.json``. This watcher, a separate process
beside ``prefect deployment run --watch``, reads both and draws one line (:func:`current_line`):

    stage 2/5 s2-geneval | iteration 12/40 | 4.1 s/it | ETA 1m55s | reward 0.532 0.541 0.538

On a terminal the line is redrawn in place (a new line per stage); in a log, a line when the stage or phase
changes and at most every ``--every`` seconds otherwise. It stops when the process ``--pid`` ends.

    python -m flows.watch --root runs/curriculum --since runs/services/.run-started --pid PID
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from vgrpo.atomic import write_json_atomic
from vgrpo.progress_line import Progress

__all__ = ["STATE_FILE", "current_line", "newest_state", "watch", "write_stage_state"]

STATE_FILE = "progress.json"


def write_stage_state(run_dir: Path, stages: Sequence[str], index: int, phase: str) -> None:
    """Record that the run in ``run_dir`` is at stage ``index`` (0-based) of ``stages``, doing ``phase``."""
    state = {"stages": list(stages), "index": index, "phase": phase, "since": time.time()}
    write_json_atomic(run_dir / STATE_FILE, state)


def newest_state(root: Path, since: float) -> Path | None:
    """The newest run-level state file under ``root`` (a run dir, or an ablation's, at most four levels down)
    written after ``since`` (epoch seconds)."""
    found = [
        p
        for depth in range(1, 5)
        for p in root.glob("/".join(["*"] * depth) + "/" + STATE_FILE)
        if "work" not in p.parts[len(root.parts) :] and p.stat().st_mtime >= since
    ]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not written yet (the writer replaces it atomically, so never half-written)
    return data if isinstance(data, dict) else None


def current_line(state_file: Path) -> tuple[str, str] | None:
    """``(key, line)``: the line to show and a key that changes with the stage and phase (``None`` when nothing
    can be read)."""
    state = _read(state_file)
    if state is None:
        return None
    stages, index, phase = state["stages"], state["index"], state["phase"]
    name = stages[index]
    key = f"{index}:{phase}"
    where = f"stage {index + 1}/{len(stages)} {name}"
    if phase == "done":
        return key, f"all {len(stages)} stages done"
    stage_file = state_file.parent / "work" / name / STATE_FILE
    if phase == "training" and stage_file.is_file() and stage_file.stat().st_mtime >= state["since"]:
        data = _read(stage_file)
        if data is not None:
            progress = Progress.from_json(data)
            progress.stage_index, progress.stages = index + 1, len(stages)
            return key, progress.line()
    if phase == "training":
        phase = "loading the model, resuming"
    return key, f"{where} | {phase}"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited child its parent has not reaped yet, a zombie, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def watch(root: Path, since: float, pid: int, out: TextIO, every_s: float = 60.0, poll_s: float = 1.0) -> int:
    """Draw the newest run's line until process ``pid`` ends; returns the lines written."""
    tty = out.isatty()
    shown_key, shown_line, written_at, lines = "", "", 0.0, 0
    while True:
        running = _alive(pid)
        state_file = newest_state(root, since)
        current = current_line(state_file) if state_file is not None else None
        if current is not None:
            key, line = current
            now = time.monotonic()
            if tty:
                if key != shown_key and shown_key:
                    out.write("\n")
                    lines += 1
                if line != shown_line:
                    out.write("\r" + line + "\x1b[K")
            elif key != shown_key or (line != shown_line and now - written_at >= every_s):
                out.write(line + "\n")
                lines += 1
                written_at = now
            out.flush()
            shown_key, shown_line = key, line
        if not running:
            if tty and shown_line:
                out.write("\n")
                lines += 1
            return lines
        time.sleep(poll_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.watch",
        description="Draw a running curriculum's progress line until a process ends.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--root", default="runs/curriculum", help="the folder the runs write under")
    parser.add_argument("--since", required=True, help="a file whose modification time the run started after")
    parser.add_argument("--pid", type=int, required=True, help="stop when this process ends (the Prefect watcher)")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between lines when not on a terminal")
    args = parser.parse_args(argv)
    watch(Path(args.root), Path(args.since).stat().st_mtime, args.pid, sys.stdout, every_s=args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
