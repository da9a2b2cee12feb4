"""flows.services: real Prefect and MLflow servers in a temporary folder, started once for the module.

Measured on a shared 2-core machine: the two cold starts overlap (25-31 s); the whole module 40-45 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from flows.services import (
    Service,
    ServiceError,
    free_port,
    process_group_members,
    service_env,
    start_mlflow_server,
    start_prefect_server,
    start_services,
    write_state,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Service]]:
    root = tmp_path_factory.mktemp("services")
    started = start_services(root)
    yield started
    for service in started.values():
        service.stop()
        assert process_group_members(service.pid) == [], f"{service.name} group survived its stop"


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_start_services_both_healthy_and_loopback(services: dict[str, Service]) -> None:
    prefect, mlflow = services["prefect"], services["mlflow"]
    assert prefect.url.startswith("http://127.0.0.1:") and prefect.url.endswith("/api")
    assert mlflow.url.startswith("http://127.0.0.1:")
    assert _get_json(prefect.health_url) is True
    assert mlflow.healthy()
    assert (prefect.log_path.parent / "prefect.db").exists()  # PREFECT_HOME is the project's folder
    assert (mlflow.log_path.parent / "mlflow.db").exists()
    # MLflow's uvicorn worker is a child in the same group: stopping the leader alone would leak it.
    assert len(process_group_members(mlflow.pid)) >= 2
    assert os.getpgid(mlflow.pid) == mlflow.pid and os.getpgid(prefect.pid) == prefect.pid


def test_service_env_prefect_api_url_runs_flow_on_server(services: dict[str, Service], tmp_path: Path) -> None:
    prefect, mlflow = services["prefect"], services["mlflow"]
    env = {**os.environ, **service_env(prefect.url, mlflow.url, prefect_home=tmp_path / "client")}
    code = textwrap.dedent(
        """
        from prefect import flow
        from prefect.runtime import flow_run

        @flow(name="services-smoke")
        def three() -> int:
            print("FLOW_RUN_ID", flow_run.id)
            return 3

        assert three() == 3
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = next(line.split()[-1] for line in result.stdout.splitlines() if line.startswith("FLOW_RUN_ID"))
    run = _get_json(f"{prefect.url}/flow_runs/{run_id}")
    assert isinstance(run, dict) and run["state_type"] == "COMPLETED"
    flow = _get_json(f"{prefect.url}/flows/{run['flow_id']}")
    assert isinstance(flow, dict) and flow["name"] == "services-smoke"


def test_service_env_relative_sqlite_raises() -> None:
    with pytest.raises(ValueError, match="absolute"):
        service_env(mlflow_tracking_uri="sqlite:///mlflow.db")
    env = service_env(mlflow_tracking_uri="sqlite:////abs/mlflow.db")
    assert env["MLFLOW_TRACKING_URI"] == "sqlite:////abs/mlflow.db"
    assert env["DO_NOT_TRACK"] == "true" and env["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert env["PREFECT_RUNNER_POLL_FREQUENCY"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert env["DVC_NO_ANALYTICS"] == "1" and "PREFECT_API_URL" not in env


def test_start_prefect_server_busy_port_raises(services: dict[str, Service], tmp_path: Path) -> None:
    busy = int(services["prefect"].url.split(":")[-1].split("/")[0])
    with pytest.raises(ServiceError, match="in use"):
        start_prefect_server(tmp_path / "prefect", port=busy)


def test_start_mlflow_server_timeout_raises_with_log_and_stops_group(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(ServiceError, match="did not answer") as error:
        start_mlflow_server(tmp_path / "store", tmp_path / "artifacts", port=port, timeout=0.5)
    assert "mlflow-server.log" in str(error.value)
    log = tmp_path / "store" / "mlflow-server.log"
    assert log.exists()
    leftovers = [
        line
        for line in subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
        if f"--port {port}" in line
    ]
    assert leftovers == []


def _fake_group(script: str) -> subprocess.Popen[bytes]:
    """A process group of a shell and two sleeping children, standing in for a server."""
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(process_group_members(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(process_group_members(proc.pid)) == 3
    return proc


def test_service_stop_term_ignored_escalates_to_kill(tmp_path: Path) -> None:
    proc = _fake_group("trap '' TERM; sleep 300 & sleep 300 & wait")
    service = Service("fake", "http://127.0.0.1:9", proc.pid, tmp_path / "fake.log", _proc=proc)
    started = time.monotonic()
    service.stop(timeout=0.5)
    assert process_group_members(proc.pid) == [] and proc.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 0.5 + 5


def test_service_context_manager_exit_stops_group(tmp_path: Path) -> None:
    proc = _fake_group("sleep 300 & sleep 300 & wait")
    with Service("fake", "http://127.0.0.1:9", proc.pid, tmp_path / "fake.log", _proc=proc) as service:
        assert service.alive()
    assert process_group_members(proc.pid) == [] and proc.returncode == -signal.SIGTERM


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "flows.services", *args, "--root", str(root)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_cli_up_status_env_running_services_reported(services: dict[str, Service], tmp_path: Path) -> None:
    write_state(tmp_path, services)
    up = _cli(tmp_path, "up")  # already running and healthy: no second start
    assert up.returncode == 0 and "already running" in up.stdout, up.stderr
    status = _cli(tmp_path, "status")
    assert status.returncode == 0 and status.stdout.count(" healthy") == 2, status.stdout + status.stderr
    env = _cli(tmp_path, "env")
    assert f"export PREFECT_API_URL={services['prefect'].url}" in env.stdout
    assert f"export MLFLOW_TRACKING_URI={services['mlflow'].url}" in env.stdout


def test_cli_down_stops_recorded_group(tmp_path: Path) -> None:
    proc = _fake_group("sleep 300 & sleep 300 & wait")
    fake = Service("fake", "http://127.0.0.1:9", proc.pid, tmp_path / "fake.log", start_time=None)
    (tmp_path / "services.json").write_text(json.dumps({"services": {"fake": fake.to_json()}}))
    assert _cli(tmp_path, "status").returncode == 1  # alive but not healthy
    down = _cli(tmp_path, "down")
    assert down.returncode == 0, down.stderr
    proc.wait(timeout=10)
    assert process_group_members(proc.pid) == []
    assert not (tmp_path / "services.json").exists()
