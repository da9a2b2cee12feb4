"""Workers in a Prefect work pool on two "machines" (separate working directories that share only the team's
services, started as ``services.team up`` starts them, with credentials and TLS, and the shared store): an
ablation sweep's two cells land one on each machine's worker and train at the same time, and the sweep reads both
cells' summaries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tasks.process_group import stop_group
from tests.cluster.pool import deploy_to_pool, machine, worker
from tests.cluster.servers import team_services
from tests.tiny_world import SWEEP_ABLATIONS, run_sweep_deployment, write_tiny_world

pytestmark = pytest.mark.slow

ABLATIONS = SWEEP_ABLATIONS


def test_a_sweeps_cells_land_one_on_each_machine(tmp_path: Path) -> None:
    world = write_tiny_world(tmp_path / "world", n_test=4)
    a, b = machine(tmp_path / "a", world), machine(tmp_path / "b", world)
    store = tmp_path / "store"
    with team_services(store) as team:
        env = team.client_env(PREFECT_RUNNER_POLL_FREQUENCY="2", PREFECT_WORKER_QUERY_SECONDS="2")
        deploy_to_pool(env)
        workers = [
            worker("machine-a", a, "gpu", env, tmp_path / "worker-a.log"),
            worker("machine-b", b, "gpu", env, tmp_path / "worker-b.log"),
            worker("control", a, "control", env, tmp_path / "worker-control.log"),
        ]
        try:
            run = run_sweep_deployment(".", env)
            logs = "".join((tmp_path / f"worker-{n}.log").read_text()[-2000:] for n in ("a", "b", "control"))
            assert run.returncode == 0, run.stdout[-3000:] + logs
        finally:
            for w in workers:
                stop_group(w)
    trained = {c.name: sorted(p.name for p in (c / "runs" / "one" / "ablations").glob("*")) for c in (a, b)}
    # One cell on each machine's worker, each in that machine's checkout, and both published to the store.
    assert sorted(trained["a"] + trained["b"]) == sorted(ABLATIONS) and len(trained["a"]) == 1, trained
    for name in ABLATIONS:
        assert json.loads((store / "runs" / "one" / "ablations" / name / "results.json").read_text())
    shutil.rmtree(tmp_path / "world", ignore_errors=True)
