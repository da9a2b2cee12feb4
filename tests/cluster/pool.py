"""Two "machines" for the pool tests: separate checkouts (working directories) that share only the servers and
the store, each with its own Prefect worker; and a machine's death (every process its worker started, killed)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.tiny_world import write_sweep_project

REPO = Path(__file__).resolve().parents[2]


def machine(root: Path, world: Path) -> Path:
    """A checkout on one machine: the code (the flows the deployments' entrypoints name) and the project files."""
    root.mkdir(parents=True)
    (root / "flows").symlink_to(REPO / "flows")
    for item in world.iterdir():
        (root / item.name).symlink_to(item)
    return write_sweep_project(root)


def worker(name: str, checkout: Path, queue: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``prefect worker start`` on the pool ``vgrpo``'s ``queue``, one flow run at a time, in ``checkout``."""
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "vgrpo", "--work-queue", queue]
    cmd += ["--type", "process", "--limit", "1", "--name", name]
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=checkout,
            env={**env, "VGRPO_ROOT": str(checkout), "VGRPO_DEVICES": "cpu:1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (children, their children, ...), from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def kill_machine(worker_proc: subprocess.Popen[bytes]) -> list[int]:
    """What a machine's power loss leaves of its worker: the worker and everything it started (the flow run's
    process, its training) stopped at once, then killed, with no chance to report. Returns the pids."""
    pids = descendants(worker_proc.pid)
    for sig in (signal.SIGSTOP, signal.SIGKILL):  # frozen first, so none reacts to another's death
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    worker_proc.wait(timeout=30)
    return pids
