"""Team services, really started: PostgreSQL on 127.0.0.1, Prefect's server and MLflow's tracking server on it,
with the artifacts under a shared store; two "machines" (processes in separate working directories that share only
the servers and the store) land their runs in one experiment, each keeping its Prefect results (pickles) to itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.team_services import TeamServices, team_down, team_up
from tasks.launch import free_port

pytestmark = pytest.mark.slow

CLIENT = """
import mlflow, pathlib, sys
from prefect import flow, task

@task(persist_result=True, cache_key_fn=lambda context, parameters: "team-cache-check")
def expensive(x: int) -> int:
    pathlib.Path("computed-here").write_text(str(x))
    return 2 * x

@flow(name="team-check")
def check(machine: str) -> int:
    return expensive(21)

machine = sys.argv[1]
check(machine)
mlflow.set_experiment("team")
with mlflow.start_run(run_name=machine):
    mlflow.log_metric("x", 1.0)
    pathlib.Path("note.txt").write_text(machine)
    mlflow.log_artifact("note.txt")
"""


@pytest.fixture(scope="module")
def team() -> Iterator[tuple[TeamServices, dict[str, str]]]:
    if shutil.which("initdb") is None and not Path("/usr/lib/postgresql").is_dir():
        pytest.skip("PostgreSQL is not installed (Debian: apt install postgresql)")
    # PostgreSQL runs as the postgres user when the tests run as root: a folder it can reach (pytest's own
    # temporary folders are private to root).
    root = Path(tempfile.mkdtemp(prefix="vgrpo-team-"))
    root.chmod(0o755)
    services = TeamServices(
        root / "services",
        str(root / "store"),
        pg_port=free_port(),
        prefect_port=free_port(),
        mlflow_port=free_port(),
    )
    try:
        env = team_up(services)
        yield services, env
    finally:
        team_down(services.root)
        shutil.rmtree(root, ignore_errors=True)


def test_two_machines_share_one_tracking_server_and_one_prefect_server(team, tmp_path: Path) -> None:
    services, env = team
    assert (services.root / "team.env").read_text().count("export ") == len(env)
    for machine in ("a", "b"):
        cwd = tmp_path / machine
        cwd.mkdir()
        client_env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))} | env
        client_env["PREFECT_HOME"] = str(cwd / ".prefect")  # each machine's own, as on separate hosts
        subprocess.run([sys.executable, "-c", CLIENT, machine], cwd=cwd, env=client_env, check=True, timeout=300)
        assert (cwd / "computed-here").read_text() == "21"  # computed on each machine: no result crosses hosts
    # Prefect's result records (pickles) stay on each machine: none in the store, which other hosts write.
    assert not Path(services.store, "prefect-results").exists()
    assert all(any((tmp_path / m / ".prefect" / "storage").iterdir()) for m in ("a", "b"))
    from mlflow import MlflowClient

    client = MlflowClient(services.mlflow_tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("team").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]
    # The artifacts went through the tracking server into the store; the metadata into PostgreSQL.
    notes = sorted(p.read_text() for p in Path(services.store, "mlflow-artifacts").rglob("note.txt"))
    assert notes == ["a", "b"]
    psql = [
        shutil.which("psql") or "psql",
        "-h",
        services.host,
        "-p",
        str(services.pg_port),
        "-U",
        "vgrpo",
        "-tA",
        "-c",
    ]
    flow_runs = subprocess.run(
        [*psql, "SELECT count(*) FROM flow_run", "-d", "prefect"], check=True, capture_output=True, text=True
    )
    assert int(flow_runs.stdout.strip()) == 2
    mlflow_runs = subprocess.run(
        [*psql, "SELECT count(*) FROM runs", "-d", "mlflow"], check=True, capture_output=True, text=True
    )
    assert int(mlflow_runs.stdout.strip()) == 2
