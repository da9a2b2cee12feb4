"""A check as timed steps: each step runs in its own process from the repository root with what is left of the
check's time budget as its limit, so a hung or slow step is cut and reported and the check goes on
(:mod:`benchmarks.gpu_check`)."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT


@dataclass
class Step:
    """One step's record: what ran, how it ended (``passed``, ``failed``, ``timed_out``, ``skipped``) and its
    numbers."""

    name: str
    command: list[str] = field(default_factory=list)
    status: str = "skipped"
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


class Budget:
    """Seconds left of the whole check; each step gets what is left, at most its own cap."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        remaining = max(0.0, self.deadline - time.monotonic())
        return remaining if cap is None else min(cap, remaining)


def run_step(step: Step, budget: Budget, log: Path, env: dict[str, str], cap: float | None = None) -> str:
    """Run ``step.command`` from the repository root with the budget's time limit; append its output to ``log``;
    return the output."""
    limit = budget.left(cap)
    if limit < 5:
        step.status, step.details["reason"] = "skipped", "out of time"
        return ""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(step.command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        output, step.status = proc.stdout + proc.stderr, "passed" if proc.returncode == 0 else "failed"
        step.details["returncode"] = proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        step.status, step.details["reason"] = "timed_out", f"cut after {limit:.0f} s"
    step.seconds = round(time.monotonic() - t0, 2)
    with log.open("a") as f:
        f.write(f"===== {step.name}: {' '.join(step.command)}\n{output}\n")
    return output
