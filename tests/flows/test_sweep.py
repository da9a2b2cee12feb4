"""An ablation sweep through a real Prefect server and a served deployment: each cell is its own flow run of the
deployment, and two cells train at the same time under a device concurrency limit of 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from services.local import local_services
from tasks.process_group import stop_group
from tests.tiny_world import SWEEP_ABLATIONS, run_sweep_deployment, write_sweep_project, write_tiny_world

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SERVE = (  # the sweep's own run and its two cells at once, from the project's sweep and cell deployments
    "from prefect import serve; from flows.deploy import deployments; "
    "serve(*[d for d in deployments() if d.name in ('ablation-sweep', 'ablation-cell')], limit=3)"
)


def _project(root: Path) -> Path:
    """The sweep project, its stage also scored by :func:`tests.flows.rendezvous.rendezvous`: each cell waits in its
    first reward call until the other cell is training too, so the overlap asserted below does not depend on how
    fast each cell's process starts."""
    write_tiny_world(root, n_test=4)
    write_sweep_project(root)
    stage = yaml.safe_load((root / "a.yaml").read_text())
    barrier = {"folder": str(root / "rendezvous"), "parties": len(SWEEP_ABLATIONS)}
    stage["rewards"].append({"name": "tests.flows.rendezvous:rendezvous", "options": barrier})
    (root / "a.yaml").write_text(yaml.safe_dump(stage))
    return root


def test_two_ablation_cells_train_at_once_under_a_device_limit_of_two(tmp_path: Path) -> None:
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    project = _project(tmp_path / "project")
    with local_services(tmp_path / "services") as services:
        env = {**os.environ, **services.env, "PYTHONPATH": str(REPO), "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
        log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 -- the serve process writes it until stopped
        serve = subprocess.Popen(
            [sys.executable, "-c", SERVE], cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True
        )
        try:
            prefect = [sys.executable, "-m", "prefect"]
            deadline = time.monotonic() + 120
            while (
                subprocess.run(
                    [*prefect, "deployment", "inspect", "vgrpo-sweep/ablation-sweep"], env=env, capture_output=True
                ).returncode
                != 0
            ):
                assert serve.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(2)
            run = run_sweep_deployment(str(project), env)
            assert run.returncode == 0, run.stdout[-3000:] + (tmp_path / "serve.log").read_text()[-3000:]
            api = {PREFECT_API_URL: services.env["PREFECT_API_URL"]}
            with temporary_settings(api), get_client(sync_client=True) as client:
                cells = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        name=FlowRunFilterName(any_=["cell-no_shared_pairs", "cell-v_prediction"])
                    )
                )
                limit = client.read_global_concurrency_limit_by_name("vgrpo-devices")
        finally:
            stop_group(serve)
    assert len(cells) == 2 and all(c.state is not None and c.state.is_completed() for c in cells)
    assert all(c.parent_task_run_id is not None for c in cells)  # linked under the sweep's flow run
    assert max(c.start_time for c in cells) < min(c.end_time for c in cells)  # the two trained at the same time
    assert len(list((project / "rendezvous").glob("*.arrived"))) == 2  # both reached the barrier
    assert limit.limit == 2 and limit.active_slots == 0
    for variant in ("no_shared_pairs", "v_prediction"):
        assert (project / f"runs/one/ablations/{variant}/stages/s1-pick/pytorch_lora_weights.safetensors").is_file()
    client = MlflowClient(services.env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("one").experiment_id])
    (sweep,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    cell_runs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep.info.run_id]
    assert sorted(r.data.tags["vgrpo.ablation"] for r in cell_runs) == ["no_shared_pairs", "v_prediction"]
    assert sweep.info.status == "FINISHED"
