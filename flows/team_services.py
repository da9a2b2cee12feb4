"""The services a team shares across machines: PostgreSQL, Prefect's server and MLflow's tracking server on it, and
the store every machine reaches (docs/cluster.md). One machine runs them; every other machine sources the
environment file they write.

    python -m flows.team_services up --root runs/team --store s3://vgrpo/team   # start them (detached)
    python -m flows.team_services down --root runs/team                          # stop them
    . runs/team/team.env                                                          # on every machine

``up`` starts, each in its own process group with its pid in ``root``: PostgreSQL on ``--pg-port`` (a cluster
under ``root/postgres``, created on the first start; ``--database-url`` uses an existing server instead), then
``prefect server start`` with ``PREFECT_API_DATABASE_CONNECTION_URL`` on its database, then ``mlflow server`` with
its backend store on its database and its artifacts under the store (served by the tracking server, so clients
need no store credentials for them). Prefect's result storage (the cached tasks' pickled results and cache
records) stays on each machine: a stage done on another machine comes from the store as JSON and safetensors
(:mod:`tasks.store`). The one-machine default stays what it was: sqlite files, no servers.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flows.services import QUIET_ENV, ServiceError, wait_healthy
from tasks.process_group import log_tail, stop_recorded_group, write_pid_file

__all__ = ["TeamServices", "team_down", "team_env", "team_up"]

HOST = "127.0.0.1"
PG_USER = "vgrpo"
DATABASES = ("prefect", "mlflow")
START_TIMEOUT_S = 180.0
_QUIET = {**QUIET_ENV, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


@dataclass(frozen=True)
class TeamServices:
    """Where the services listen. ``host`` is the address the other machines reach this one at."""

    root: Path
    store: str
    host: str = HOST
    pg_port: int = 5432
    prefect_port: int = 4200
    mlflow_port: int = 5000
    database_url: str | None = None  # an existing PostgreSQL server (postgresql://user:password@host:port)

    @property
    def pg_url(self) -> str:
        return self.database_url or f"postgresql://{PG_USER}@{self.host}:{self.pg_port}"

    def database(self, name: str, driver: str) -> str:
        """The SQLAlchemy URL of one database (``driver``: asyncpg for Prefect, psycopg2 for MLflow)."""
        scheme, rest = self.pg_url.split("://", 1)
        return f"{scheme}+{driver}://{rest}/{name}"

    @property
    def prefect_api_url(self) -> str:
        return f"http://{self.host}:{self.prefect_port}/api"

    @property
    def mlflow_tracking_uri(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"


def team_env(services: TeamServices) -> dict[str, str]:
    """What a client on any machine exports: the servers' addresses and the store. Prefect's result storage is
    left to each machine (``$PREFECT_HOME/storage``): its records are pickles, which run code when read, so they
    never go where other hosts write; what crosses machines goes through the store as JSON and safetensors
    (:mod:`tasks.store`)."""
    return {
        **_QUIET,
        "PREFECT_API_URL": services.prefect_api_url,
        "MLFLOW_TRACKING_URI": services.mlflow_tracking_uri,
        "VGRPO_STORE": services.store,
        "HF_HUB_OFFLINE": "1",
    }


def _as_postgres(cmd: Sequence[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run ``cmd`` as the ``postgres`` system user."""
    if os.geteuid() != 0:
        return list(cmd)
    return ["runuser", "-u", "postgres", "--", *cmd]


def _pg_bin(name: str) -> str:
    """A PostgreSQL program: on PATH, or in the distribution's versioned folder (Debian keeps initdb off PATH)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for folder in versions:
        if (folder / name).is_file():
            return str(folder / name)
    raise ServiceError(f"PostgreSQL's {name} is not installed (Debian: apt install postgresql)")


def start_postgres(services: TeamServices) -> None:
    """Create the cluster under ``root/postgres`` on the first start (trust on loopback only, a ``vgrpo``
    superuser), start it on ``pg_port`` and create the databases it lacks."""
    data, log = services.root / "postgres" / "data", services.root / "postgres" / "server.log"
    data.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(data.parent, "postgres", "postgres")
    if not (data / "PG_VERSION").is_file():
        subprocess.run(
            _as_postgres([_pg_bin("initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust", "-E", "UTF8"]),
            check=True,
            capture_output=True,
        )
    options = f"-h {services.host} -p {services.pg_port} -k {data.parent}"
    result = subprocess.run(
        _as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"]),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ServiceError(f"PostgreSQL did not start on port {services.pg_port}: {result.stderr}\n{log_tail(log)}")
    psql = [_pg_bin("psql"), "-h", services.host, "-p", str(services.pg_port), "-U", PG_USER, "-d", "postgres"]
    existing = subprocess.run(
        [*psql, "-tAc", "SELECT datname FROM pg_database"], check=True, capture_output=True, text=True
    ).stdout.split()
    for name in DATABASES:
        if name not in existing:
            subprocess.run([*psql, "-c", f"CREATE DATABASE {name}"], check=True, capture_output=True)


def stop_postgres(root: Path) -> None:
    data = root / "postgres" / "data"
    if (data / "postmaster.pid").is_file():
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "stop"]), capture_output=True)


def _spawn(name: str, cmd: Sequence[str], env: dict[str, str], root: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` detached in its own process group, its pid in ``root/<name>.pid``, its log ``root/<name>.log``."""
    log = root / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            env=env,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    write_pid_file(root / f"{name}.pid", proc.pid)
    return proc


def team_up(services: TeamServices, timeout: float = START_TIMEOUT_S) -> dict[str, str]:
    """Start PostgreSQL (unless ``database_url``), Prefect's server and MLflow's tracking server; write
    ``root/team.env``; return the client environment. On a failure, stop what started."""
    root = services.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))} | _QUIET
    try:
        if services.database_url is None:
            start_postgres(services)
        prefect_env = base | {
            "PREFECT_HOME": str(root / "prefect"),
            "PREFECT_API_DATABASE_CONNECTION_URL": services.database("prefect", "asyncpg"),
        }
        prefect = _spawn(
            "prefect",
            [
                sys.executable,
                "-m",
                "prefect",
                "server",
                "start",
                "--host",
                services.host,
                "--port",
                str(services.prefect_port),
            ],
            prefect_env,
            root,
        )
        mlflow = _spawn(
            "mlflow",
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                services.host,
                "--port",
                str(services.mlflow_port),
                "--backend-store-uri",
                services.database("mlflow", "psycopg2"),
                "--artifacts-destination",
                services.store.rstrip("/") + "/mlflow-artifacts",
                "--workers",
                "1",
            ],
            base,
            root,
        )
        wait_healthy("Prefect's server", services.prefect_api_url + "/health", prefect, root / "prefect.log", timeout)
        wait_healthy("MLflow's server", services.mlflow_tracking_uri + "/health", mlflow, root / "mlflow.log", timeout)
    except BaseException:
        team_down(root)
        raise
    env = team_env(services)
    (root / "team.env").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    return env


def team_down(root: Path, timeout: float = 15.0) -> None:
    """Stop the servers' process groups (SIGTERM, then SIGKILL after ``timeout``), each only when its pid file still
    names the process ``up`` started (:func:`tasks.process_group.stop_recorded_group`), and PostgreSQL."""
    root = root.resolve()
    for name in ("mlflow", "prefect"):
        pid_file = root / f"{name}.pid"
        if pid_file.is_file() and not stop_recorded_group(pid_file, timeout):
            print(f"{name}: its recorded process is gone (its pid now names another process, left alone)")
    stop_postgres(root)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--root", type=Path, default=Path("runs/team"), help="the services' data, logs and pids")
    parser.add_argument("--store", default=None, help="the shared store: a path every machine mounts, or s3://...")
    parser.add_argument("--host", default=HOST, help="the address the other machines reach this one at")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--prefect-port", type=int, default=4200)
    parser.add_argument("--mlflow-port", type=int, default=5000)
    parser.add_argument("--database-url", default=None, help="an existing PostgreSQL (postgresql://user:pw@host:port)")
    args = parser.parse_args(argv)
    if args.action == "down":
        team_down(args.root)
        return
    if not args.store:
        parser.error("up needs --store (a shared path or an s3:// URL)")
    store = args.store if "://" in args.store else str(Path(args.store).resolve())
    services = TeamServices(
        args.root, store, args.host, args.pg_port, args.prefect_port, args.mlflow_port, args.database_url
    )
    env = team_up(services)
    print(f"services up; on every machine: . {args.root.resolve() / 'team.env'}")
    for k, v in env.items():
        print(f"  {k}={v}")


if __name__ == "__main__":
    main()
