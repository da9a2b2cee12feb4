"""Two "machines" for the pool tests: separate checkouts (working directories) that share only the servers and
the store, each with its own Prefect worker; and a machine's death (every process its worker started, killed)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.tiny_world import write_sweep_project

REPO = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def deploy_to_pool(env: dict[str, str], *args: str) -> str:
    """``python -m flows.deploy --pool vgrpo ARGS`` (the docs' command) against ``env``'s servers; returns its
    output."""
    cmd = [sys.executable, "-m", "flows.deploy", "--pool", "vgrpo", *args]
    deployed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    return deployed.stdout


def wait_for(what: str, check: Callable[[], T], timeout: float, logs: list[Path], poll: float = 1.0) -> T:
    """``check()``'s first truthy value, polled every ``poll`` seconds; after ``timeout`` seconds an assertion
    naming ``what``, with the tails of ``logs``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll)
    tails = "".join(f"\n--- {p}:\n{p.read_text(errors='replace')[-4000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tails}")


def logged_steps(env: dict[str, str], experiment: str, stage: str) -> list[int]:
    """The iterations stage ``stage``'s one MLflow run logged (``reward/total_mean``) on ``env``'s tracking server
    (with its credentials and CA), sorted: an iteration trained twice (on a machine that died and on the one that
    resumed) appears twice."""
    from mlflow import MlflowClient

    from tests.cluster.servers import environ

    with environ({k: v for k, v in env.items() if k.startswith("MLFLOW_TRACKING_")}):
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])  # type: ignore[union-attr]
        (run,) = [r for r in runs if r.info.run_name == stage]
        return sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/total_mean"))


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
            # Each machine keeps its own Prefect results (pickles): nothing another machine wrote is unpickled.
            env={
                **env,
                "VGRPO_ROOT": str(checkout),
                "VGRPO_DEVICES": "cpu:1",
                "PREFECT_LOCAL_STORAGE_PATH": str(checkout / ".prefect-results"),
            },
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
