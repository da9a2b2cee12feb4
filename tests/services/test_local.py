"""services.local: a real Prefect server in a temporary folder, started once for the module; and the group stops of
tasks.process_group that it (and the stage launcher) stop their children with."""

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

from services.local import LocalServices, ServiceError, local_services, service_env
from tasks.process_group import process_group_members, stop_group


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    with local_services(tmp_path_factory.mktemp("services")) as started:
        yield started
    assert process_group_members(started.pgid) == [], "the server's process group survived its stop"


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_local_services_prefect_status_available_on_loopback(services: LocalServices) -> None:
    env = services.env
    assert env["PREFECT_API_URL"].startswith("http://127.0.0.1:") and env["PREFECT_API_URL"].endswith("/api")
    assert env["MLFLOW_TRACKING_URI"] == f"sqlite:///{services.log.parents[1] / 'mlflow' / 'mlflow.db'}"
    assert (Path(env["PREFECT_HOME"]) / "prefect.db").exists()  # the server's database lives in its own home
    assert os.getpgid(services.pgid) == services.pgid
    status = subprocess.run(
        [sys.executable, "-m", "prefect", "server", "status", "-o", "json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    reply = json.loads(status.stdout)
    assert reply["status"] == "available" and reply["api_url"] == env["PREFECT_API_URL"]


def test_local_services_env_runs_flow_on_server(services: LocalServices, tmp_path: Path) -> None:
    env = {**os.environ, **services.env}
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
    api = services.env["PREFECT_API_URL"]
    run = _get_json(f"{api}/flow_runs/{run_id}")
    assert isinstance(run, dict) and run["state_type"] == "COMPLETED"
    flow = _get_json(f"{api}/flows/{run['flow_id']}")
    assert isinstance(flow, dict) and flow["name"] == "services-smoke"


def test_service_env_relative_sqlite_raises() -> None:
    with pytest.raises(ValueError, match="absolute"):
        service_env(mlflow_tracking_uri="sqlite:///mlflow.db")
    env = service_env(mlflow_tracking_uri="sqlite:////abs/mlflow.db")
    assert env["MLFLOW_TRACKING_URI"] == "sqlite:////abs/mlflow.db"
    assert env["DO_NOT_TRACK"] == "true" and env["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert env["PREFECT_RUNNER_POLL_FREQUENCY"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert env["DVC_NO_ANALYTICS"] == "1" and "PREFECT_API_URL" not in env


def test_local_services_timeout_raises_with_log_and_stops_group(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match="did not answer") as error, local_services(tmp_path, timeout=0.5):
        pass
    log = tmp_path / "prefect" / "server.log"
    assert str(log) in str(error.value) and log.exists()
    assert _running_in(tmp_path / "prefect") == []  # the server runs with its home as working directory


def _running_in(cwd: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == cwd.resolve():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _fake_group(script: str) -> subprocess.Popen[bytes]:
    """A process group of a shell and two sleeping children, standing in for a server."""
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(process_group_members(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(process_group_members(proc.pid)) == 3
    return proc


def test_stop_group_term_ignored_escalates_to_kill() -> None:
    proc = _fake_group("trap '' TERM; sleep 300 & sleep 300 & wait")
    started = time.monotonic()
    stop_group(proc, timeout=0.5)
    assert process_group_members(proc.pid) == [] and proc.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 0.5 + 5


def test_stop_group_term_stops_children_too() -> None:
    proc = _fake_group("sleep 300 & sleep 300 & wait")
    stop_group(proc)
    assert process_group_members(proc.pid) == [] and proc.returncode == -signal.SIGTERM
