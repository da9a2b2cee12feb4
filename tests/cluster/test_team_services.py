"""Team services, really started: PostgreSQL on 127.0.0.1, Prefect's server and MLflow's tracking server on it,
with the artifacts under a shared store; two "machines" (processes in separate working directories that share only
the servers and the store) land their runs in one experiment with the team's credentials, each keeping its Prefect
results (pickles) to itself. And the attacks of the security review, each refused: a request without the
credentials (Prefect 401, MLflow 401), a PostgreSQL connection without the password (over TCP, and from another OS
user through the socket), a cross-origin request answered with '*', a secret in any process's command line, a log
or a world-readable file."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.team import TeamSecrets, TeamServices, team_env, team_secrets
from tests.cluster.servers import environ, team_services

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
    store = Path(tempfile.mkdtemp(prefix="vgrpo-team-store-"))  # the artifacts, written by MLflow's server
    try:
        with team_services(store) as started:
            assert started.services.tls is not None  # Prefect and MLflow over https, verified against a CA made here
            _CA[:] = [started.services.tls.ca]
            yield started.services, started.env
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _secrets(services: TeamServices) -> TeamSecrets:
    return team_secrets(services.root.resolve())


def _psql(
    services: TeamServices, sql: str, database: str, password: str | None, sslmode: str = "prefer"
) -> subprocess.CompletedProcess[str]:
    """``psql`` over TCP as the ``vgrpo`` role, with ``password`` or none (``-w``: never prompt), with libpq's
    ``sslmode`` (``verify-full``: against the team's CA)."""
    cmd = [shutil.which("psql") or "psql", "-h", services.host, "-p", str(services.pg_port), "-U", "vgrpo", "-w"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"PGSSLMODE": sslmode}
    if sslmode == "verify-full":
        env["PGSSLROOTCERT"] = str(_CA[0])
    if password is not None:
        env["PGPASSWORD"] = password
    return subprocess.run([*cmd, "-d", database, "-tAc", sql], capture_output=True, text=True, env=env, timeout=60)


_CA: list[Path] = []  # the team's CA, which the fixture made


def _request(
    url: str, method: str = "GET", body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    """The status and headers of one request (an error status included), the server's certificate verified
    against the team's CA."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    context = ssl.create_default_context(cafile=str(_CA[0]))
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def _basic(user_password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(user_password.encode()).decode()}


def test_two_machines_share_one_tracking_server_and_one_prefect_server(team, tmp_path: Path) -> None:
    services, env = team
    assert (services.root / "team.env").read_text().count("export ") == len(team_env(services))
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

    with environ({k: v for k, v in env.items() if k.startswith("MLFLOW_TRACKING_")}):
        client = MlflowClient(services.mlflow_tracking_uri)
        runs = client.search_runs([client.get_experiment_by_name("team").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]
    # The artifacts went through the tracking server into the store; the metadata into PostgreSQL.
    notes = sorted(p.read_text() for p in Path(services.store, "mlflow-artifacts").rglob("note.txt"))
    assert notes == ["a", "b"]
    password = _secrets(services).pg_password
    assert _psql(services, "SELECT count(*) FROM flow_run", "prefect", password).stdout.strip() == "2"
    assert _psql(services, "SELECT count(*) FROM runs", "mlflow", password).stdout.strip() == "2"


def test_no_request_without_the_teams_credentials_is_answered(team) -> None:
    services, env = team
    made = _secrets(services)
    api, mlflow = services.prefect_api_url, services.mlflow_tracking_uri
    # Prefect: the attack of the review (a flow run with job_variables.command on any deployment) and a read.
    attack = {"job_variables": {"command": "touch /tmp/owned"}, "state": {"type": "SCHEDULED"}}
    deployment = "00000000-0000-0000-0000-000000000000"
    # A POST is refused before it is read (403: no CSRF token; 401: no credentials), a GET for want of credentials.
    assert _request(f"{api}/deployments/{deployment}/create_flow_run", "POST", attack)[0] in (401, 403)
    assert _request(f"{api}/flow_runs/filter", "POST", {})[0] in (401, 403)
    assert _request(f"{api}/deployments/{deployment}")[0] == 401  # not 404: refused before any lookup
    assert _request(f"{api}/deployments/{deployment}", headers=_basic("vgrpo:wrong"))[0] == 401
    assert _request(f"{api}/deployments/{deployment}", headers=_basic(made.prefect_auth))[0] == 404
    assert _request(f"{api}/health")[0] == 200  # the health probe alone answers
    # With the auth string but no CSRF token (what a browser page elsewhere would send with a stolen session):
    assert _request(f"{api}/flow_runs/filter", "POST", {}, _basic(made.prefect_auth))[0] == 403
    # Cross-origin: no '*' to a page elsewhere; the UI's own origin only.
    _, headers = _request(f"{api}/health", headers={"Origin": "http://evil.example"})
    assert headers.get("access-control-allow-origin") in (None, services.prefect_origin)
    _, headers = _request(f"{api}/health", headers={"Origin": services.prefect_origin})
    assert headers.get("access-control-allow-origin") == services.prefect_origin
    # TLS: https only, and a client that does not trust the team's CA refuses the servers.
    assert api.startswith("https://") and mlflow.startswith("https://")
    for url in (api.replace("https://", "http://") + "/health", mlflow.replace("https://", "http://") + "/health"):
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(url, timeout=10)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{api}/health", timeout=10, context=ssl.create_default_context())
    # MLflow: reads and deletes refused without credentials, or with the wrong ones.
    search = f"{mlflow}/api/2.0/mlflow/experiments/search"
    assert _request(search, "POST", {"max_results": 10})[0] == 401
    assert _request(f"{mlflow}/api/2.0/mlflow/experiments/delete", "POST", {"experiment_id": "0"})[0] == 401
    assert _request(search, "POST", {"max_results": 10}, _basic("admin:wrong-password"))[0] == 401
    assert _request(search, "POST", {"max_results": 10}, _basic(f"admin:{made.mlflow_password}"))[0] == 200
    assert env["MLFLOW_TRACKING_PASSWORD"] == made.mlflow_password


def test_postgresql_refuses_a_connection_without_the_password(team) -> None:
    services, _ = team
    refused = _psql(services, "SELECT 1", "postgres", None)
    assert refused.returncode != 0 and "password" in refused.stderr, refused.stderr
    wrong = _psql(services, "SELECT 1", "postgres", "not-the-password")
    assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr, wrong.stderr
    password = _secrets(services).pg_password
    assert _psql(services, "SELECT 1", "postgres", password).stdout.strip() == "1"
    # TLS only: the right password without encryption finds no rule; verified against the team's CA it connects,
    # and Prefect's and MLflow's servers hold only encrypted connections.
    plain = _psql(services, "SELECT 1", "postgres", password, sslmode="disable")
    assert plain.returncode != 0 and "no encryption" in plain.stderr, plain.stderr
    verified = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
    assert _psql(services, verified, "postgres", password, sslmode="verify-full").stdout.strip() == "t"
    servers = (
        "SELECT a.datname, s.ssl, count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
        "WHERE a.datname IN ('prefect', 'mlflow') GROUP BY 1, 2 ORDER BY 1, 2"
    )
    rows = _psql(services, servers, "postgres", password, sslmode="verify-full").stdout.split()
    assert rows and all(row.split("|")[1] == "t" for row in rows), rows
    assert {row.split("|")[0] for row in rows} == {"prefect", "mlflow"}, rows
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return
    # Another OS user (nobody): the socket's folder is closed to it, TCP asks it for the password.
    socket_dir = services.root / "postgres"
    as_nobody = ["runuser", "-u", "nobody", "--", shutil.which("psql") or "psql", "-w", "-U", "vgrpo", "-d", "postgres"]
    through_socket = subprocess.run(
        [*as_nobody, "-h", str(socket_dir), "-p", str(services.pg_port), "-c", "COPY (SELECT 1) TO PROGRAM 'id'"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert through_socket.returncode != 0 and "Permission denied" in through_socket.stderr, through_socket.stderr
    over_tcp = subprocess.run(
        [*as_nobody, "-h", services.host, "-p", str(services.pg_port), "-c", "COPY (SELECT 1) TO PROGRAM 'id'"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert over_tcp.returncode != 0 and "password" in over_tcp.stderr, over_tcp.stderr


def test_no_secret_on_a_command_line_in_a_log_or_in_a_file_others_read(team) -> None:
    services, _ = team
    made = _secrets(services)
    values = [made.prefect_auth.split(":", 1)[1], made.mlflow_password, made.pg_password, made.flask_secret]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert not any(v in args for v in values), f"a secret on the command line of {cmdline.parent.name}: {args}"
    root = services.root.resolve()
    logs = [*root.glob("*.log"), root / "postgres" / "server.log"]
    assert len(logs) == 3
    for log in logs:
        text = log.read_text(errors="replace")
        assert not any(v in text for v in values), log
    assert not any(v in (root / "team.env").read_text() for v in values)
    for private in (root / "secrets.json", root / "secrets.env", root / "mlflow-auth" / "basic_auth.ini"):
        assert private.stat().st_mode & 0o777 == 0o600, private
    assert (root / "postgres").stat().st_mode & 0o777 == 0o700
    assert not (root / "postgres" / "pwfile").exists()
    assert (root / "mlflow-auth").stat().st_mode & 0o777 == 0o700
