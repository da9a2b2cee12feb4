"""Workers in a Prefect work pool on two "machines" (separate working directories that share only the Prefect
server, MLflow's store and the shared store): an ablation sweep's two cells land one on each machine's worker
and train at the same time, and the sweep reads both cells' summaries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows.services import local_services
from tasks.process_group import stop_group
from tests.tiny_world import SWEEP_ABLATIONS, run_sweep_deployment, write_sweep_project, write_tiny_world

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ABLATIONS = SWEEP_ABLATIONS


def _machine(root: Path, world: Path) -> Path:
    """A checkout on one machine: the code (the flows the deployments' entrypoints name) and the project files."""
    root.mkdir(parents=True)
    (root / "flows").symlink_to(REPO / "flows")
    for item in world.iterdir():
        (root / item.name).symlink_to(item)
    return write_sweep_project(root)


def _worker(name: str, machine: Path, queue: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "vgrpo", "--work-queue", queue]
    cmd += ["--type", "process", "--limit", "1", "--name", name]
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=machine,
            env={**env, "VGRPO_ROOT": str(machine), "VGRPO_DEVICES": "cpu:1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_a_sweeps_cells_land_one_on_each_machine(tmp_path: Path) -> None:
    world = write_tiny_world(tmp_path / "world", n_test=4)
    a, b = _machine(tmp_path / "a", world), _machine(tmp_path / "b", world)
    store = tmp_path / "store"
    with local_services(tmp_path / "services") as services:
        env = {**os.environ, **services.env, "VGRPO_STORE": str(store), "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
        env["PREFECT_WORKER_QUERY_SECONDS"] = "2"
        deployed = subprocess.run(
            [sys.executable, "-m", "flows.deploy", "--pool", "vgrpo"], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        workers = [
            _worker("machine-a", a, "gpu", env, tmp_path / "worker-a.log"),
            _worker("machine-b", b, "gpu", env, tmp_path / "worker-b.log"),
            _worker("control", a, "control", env, tmp_path / "worker-control.log"),
        ]
        try:
            run = run_sweep_deployment(".", env)
            logs = "".join((tmp_path / f"worker-{n}.log").read_text()[-2000:] for n in ("a", "b", "control"))
            assert run.returncode == 0, run.stdout[-3000:] + logs
        finally:
            for w in workers:
                stop_group(w)
    trained = {
        machine.name: sorted(p.name for p in (machine / "runs" / "one" / "ablations").glob("*")) for machine in (a, b)
    }
    # One cell on each machine's worker, each in that machine's checkout, and both published to the store.
    assert sorted(trained["a"] + trained["b"]) == sorted(ABLATIONS) and len(trained["a"]) == 1, trained
    for name in ABLATIONS:
        assert json.loads((store / "runs" / "one" / "ablations" / name / "results.json").read_text())
    shutil.rmtree(tmp_path / "world", ignore_errors=True)
