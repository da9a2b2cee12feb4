"""The deployments registered to a Prefect work pool: each pulls into the worker's own checkout ($VGRPO_ROOT,
resolved on the worker's machine), the sweep's own run on the control queue and everything that trains on gpu."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.local import local_services

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_every_deployment_goes_to_the_pool_with_a_pull_step_into_the_workers_checkout(tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deploy import DEPLOYMENTS

    with local_services(tmp_path / "services") as services:
        env = {**os.environ, **services.env}
        done = subprocess.run(
            [sys.executable, "-m", "flows.deploy", "--pool", "vgrpo"], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.count("-> work pool vgrpo") == len(DEPLOYMENTS)
        url = services.env["PREFECT_API_URL"]
        with temporary_settings({PREFECT_API_URL: url}), get_client(sync_client=True) as client:
            assert client.read_work_pool("vgrpo").type == "process"
            deployments = {d.name: d for d in client.read_deployments()}
    assert sorted(deployments) == sorted(DEPLOYMENTS)
    for name, d in deployments.items():
        assert d.work_pool_name == "vgrpo"
        assert d.work_queue_name == ("control" if name == "ablation-sweep" else "gpu")
        assert d.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $VGRPO_ROOT }}"}}]
        assert d.entrypoint.startswith("flows/") and d.parameters == DEPLOYMENTS[name][1]
