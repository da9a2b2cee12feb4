"""Local Prefect and MLflow servers for the pipeline: start, wait until healthy, stop by process group.

Each server runs in its own session (``start_new_session=True``), so its process group holds the server and every
child it spawns (MLflow's uvicorn workers, Prefect's services). :meth:`Service.stop` sends SIGTERM to the whole
group, waits, then SIGKILLs what is left: nothing outlives a stop.

``Service.url`` is what a client sets: ``PREFECT_API_URL`` (``http://HOST:PORT/api``) for Prefect and
``MLFLOW_TRACKING_URI`` (``http://HOST:PORT``) for MLflow; ``url + "/health"`` is the readiness endpoint of both.

Command line (the README's one-command scripts)::

    python -m flows.services up --root runs/services      # start both, write runs/services/services.json
    python -m flows.services status --root runs/services  # exit 0 when both answer their health check
    eval "$(python -m flows.services env --root runs/services)"  # export the client environment
    python -m flows.services down --root runs/services    # stop both process groups
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from vgrpo.atomic import write_json_atomic

__all__ = [
    "Service",
    "ServiceError",
    "free_port",
    "process_group_members",
    "service_env",
    "start_mlflow_server",
    "start_prefect_server",
    "start_services",
    "write_state",
]

HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0  # cold starts measured 13-34 s on a shared 2-core machine
STOP_TIMEOUT_S = 15.0
STATE_FILE = "services.json"
# Telemetry off: MLflow accepts only "true" for these two.
_QUIET_ENV = {"DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}


class ServiceError(RuntimeError):
    """A service did not start, did not become healthy, or could not be stopped."""


@dataclass
class Service:
    """A server running in its own process group; a context manager that stops it on exit.

    Args:
        name: ``"prefect"`` or ``"mlflow"``.
        url: What a client sets (``PREFECT_API_URL`` / ``MLFLOW_TRACKING_URI``); ``url + "/health"`` is polled.
        pid: Process id of the group leader (equal to the process group id).
        log_path: File receiving the server's stdout and stderr.
        start_time: The leader's start time in clock ticks (``/proc/PID/stat`` field 22), so that a stale state
            file never signals a process that reused the pid; ``None`` where ``/proc`` is missing.
    """

    name: str
    url: str
    pid: int
    log_path: Path
    start_time: int | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def health_url(self) -> str:
        return self.url + "/health"

    def alive(self) -> bool:
        """Whether any non-zombie process of the group is left (the leader may exit before its children)."""
        if self._proc is not None:
            self._proc.poll()  # reap our own child so that it does not linger as a zombie
        if self.start_time is not None and _proc_start_time(self.pid) not in (None, self.start_time):
            return False  # the pid belongs to another process now: our group is gone
        return bool(process_group_members(self.pid))

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether the health endpoint answers HTTP 200 within ``timeout`` seconds."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=timeout) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Poll the health endpoint until it answers; on timeout or early exit stop the group and raise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if self._proc is not None and self._proc.poll() is not None:
                self.stop()
                raise ServiceError(
                    f"{self.name} server exited with code {self._proc.returncode} before {self.health_url} "
                    f"answered; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.25)
        self.stop()
        raise ServiceError(
            f"{self.name} server did not answer {self.health_url} within {timeout:.0f} s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the process group, wait up to ``timeout`` s, then SIGKILL it; raise if anything survives."""
        for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            if not self.alive():
                return
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.1)
        if self.alive():
            raise ServiceError(
                f"{self.name} process group {self.pid} survived SIGKILL: {process_group_members(self.pid)}"
            )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            return f"(log unreadable: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "health_url": self.health_url,
            "pid": self.pid,
            "log_path": str(self.log_path),
            "start_time": self.start_time,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Service:
        return cls(data["name"], data["url"], int(data["pid"]), Path(data["log_path"]), data.get("start_time"))

    def __enter__(self) -> Service:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def free_port(host: str = HOST) -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it; another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def process_group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in process group ``pgid``, read from ``/proc``.

    Without ``/proc`` it falls back to ``os.killpg(pgid, 0)`` and returns ``[pgid]`` while the group exists.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # fields[0] is the state, fields[2] the process group (stat fields 3 and 5, counted after the comm).
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def service_env(
    prefect_api_url: str | None = None, mlflow_tracking_uri: str | None = None, prefect_home: Path | None = None
) -> dict[str, str]:
    """Environment variables a client process (flow, DVC stage, ``serve``) needs; merge into ``os.environ``.

    Args:
        prefect_api_url: The Prefect server's API URL (``Service.url``), or ``None`` to leave it unset.
        mlflow_tracking_uri: ``http(s)://`` server URL or an absolute ``sqlite:////ABS/mlflow.db``; a relative
            sqlite path is rejected because DVC stages and flow runs start in different directories.
        prefect_home: Folder for the client's Prefect home (task results persist under ``PREFECT_HOME/storage``).
    """
    env = dict(_QUIET_ENV)
    env.update(PREFECT_RUNNER_POLL_FREQUENCY="2", PREFECT_SERVER_ANALYTICS_ENABLED="false", HF_HUB_OFFLINE="1")
    if prefect_api_url is not None:
        env["PREFECT_API_URL"] = prefect_api_url
    if prefect_home is not None:
        env["PREFECT_HOME"] = str(prefect_home.resolve())
    if mlflow_tracking_uri is not None:
        if mlflow_tracking_uri.startswith("sqlite:") and not mlflow_tracking_uri.startswith("sqlite:////"):
            raise ValueError(
                f"MLFLOW_TRACKING_URI must be absolute (sqlite:////ABS/mlflow.db), got {mlflow_tracking_uri!r}"
            )
        if "://" not in mlflow_tracking_uri:
            raise ValueError(
                f"MLFLOW_TRACKING_URI must be a URI (http://..., sqlite:////...), got {mlflow_tracking_uri!r}"
            )
        env["MLFLOW_TRACKING_URI"] = mlflow_tracking_uri
    return env


def start_prefect_server(
    home: Path, port: int | None = None, host: str = HOST, timeout: float = START_TIMEOUT_S, wait: bool = True
) -> Service:
    """Start ``prefect server start`` with ``PREFECT_HOME=home`` (its SQLite database is ``home/prefect.db``).

    Args:
        home: The server's Prefect home; the log is ``home/prefect-server.log``.
        port: TCP port, or ``None`` for a free one.
        host: Interface to bind; loopback unless told otherwise.
        timeout: Seconds to wait for ``GET /api/health``.
        wait: ``False`` returns right after spawning; call :meth:`Service.wait_ready` later.
    """
    home = home.resolve()
    port = _claim_port(host, port)
    env = _server_env()
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)]
    url = f"http://{_url_host(host)}:{port}/api"
    return _spawn("prefect", command, env, url, home / "prefect-server.log", timeout if wait else None)


def start_mlflow_server(
    store: Path,
    artifacts: Path,
    port: int | None = None,
    host: str = HOST,
    timeout: float = START_TIMEOUT_S,
    wait: bool = True,
) -> Service:
    """Start ``mlflow server`` on ``sqlite:////ABS/store/mlflow.db`` with artifacts under ``artifacts``.

    One uvicorn worker and no job runner (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``): the default four workers
    and seven huey consumers made a cold start 34 s instead of 13 s on a 2-core machine, and the pipeline submits
    no server-side jobs. The log is ``store/mlflow-server.log``. Other arguments as :func:`start_prefect_server`.
    """
    store, artifacts = store.resolve(), artifacts.resolve()
    store.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    port = _claim_port(host, port)
    env = _server_env()
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
        "--default-artifact-root", str(artifacts),
        "--host", host, "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    url = f"http://{_url_host(host)}:{port}"
    return _spawn("mlflow", command, env, url, store / "mlflow-server.log", timeout if wait else None)


def start_services(root: Path, timeout: float = START_TIMEOUT_S) -> dict[str, Service]:
    """Start Prefect (``root/prefect``) and MLflow (``root/mlflow``, artifacts ``root/mlflow/artifacts``) together.

    Both spawn first and are then waited for, so the two cold starts overlap; if either fails, both are stopped.
    """
    root = root.resolve()
    services = {"prefect": start_prefect_server(root / "prefect", wait=False)}
    try:
        services["mlflow"] = start_mlflow_server(root / "mlflow", root / "mlflow" / "artifacts", wait=False)
        for service in services.values():
            service.wait_ready(timeout)
    except BaseException:
        for service in services.values():
            service.stop()
        raise
    return services


# --- internals ------------------------------------------------------------------------------------------------


def _server_env() -> dict[str, str]:
    env = {**os.environ, **_QUIET_ENV}
    # A client setting inherited from the caller must not point the server at another server or database.
    for key in ("PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL"):
        env.pop(key, None)
    return env


def _url_host(host: str) -> str:
    return HOST if host in ("0.0.0.0", "") else host


def _claim_port(host: str, port: int | None) -> int:
    """Return ``port`` (or a free one), refusing a busy port: a foreign server there would pass our health check."""
    if port is None:
        return free_port(host)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as error:
            raise ServiceError(f"port {port} on {host} is in use ({error}); pass another port or None") from error
    return port


def _spawn(
    name: str, command: list[str], env: dict[str, str], url: str, log_path: Path, timeout: float | None
) -> Service:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, env=env, cwd=log_path.parent, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    service = Service(name, url, proc.pid, log_path, _proc_start_time(proc.pid), proc)
    if timeout is not None:
        service.wait_ready(timeout)
    return service


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the ``(comm)`` field (index 0 = state), or ``None`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _proc_start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None  # stat field 22, starttime in clock ticks


# --- command line ---------------------------------------------------------------------------------------------


def write_state(root: Path, services: dict[str, Service]) -> Path:
    """Write ``root/services.json`` atomically: each service's pid, url, log and start time, plus the client env."""
    path = root / STATE_FILE
    state = {
        "services": {name: s.to_json() for name, s in services.items()},
        "env": _client_env(root.resolve(), services),
        "mlflow_sqlite_uri": f"sqlite:///{(root / 'mlflow' / 'mlflow.db').resolve()}",
    }
    write_json_atomic(path, state)
    return path


def _load_state(root: Path) -> dict[str, Service]:
    path = root / STATE_FILE
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {name: Service.from_json(entry) for name, entry in data["services"].items()}


def _client_env(root: Path, services: dict[str, Service]) -> dict[str, str]:
    return service_env(services["prefect"].url, services["mlflow"].url, prefect_home=root / "prefect")


def _cmd_up(root: Path, timeout: float) -> int:
    running = _load_state(root)
    if running and all(s.alive() and s.healthy() for s in running.values()):
        print(f"services already running ({root / STATE_FILE})")
        return 0
    for service in running.values():  # stale or half-dead: clear it before starting afresh
        service.stop()
    services = start_services(root, timeout)
    write_state(root, services)
    for name, s in services.items():
        print(f"{name}: {s.url} (pid {s.pid}, log {s.log_path})")
    return 0


def _cmd_down(root: Path) -> int:
    services = _load_state(root)
    for service in reversed(list(services.values())):
        service.stop()
        print(f"{service.name}: stopped (process group {service.pid})")
    (root / STATE_FILE).unlink(missing_ok=True)
    return 0


def _cmd_status(root: Path) -> int:
    services = _load_state(root)
    if not services:
        print(f"no services recorded in {root / STATE_FILE}")
        return 1
    ok = True
    for s in services.values():
        alive, healthy = s.alive(), s.healthy()
        ok = ok and alive and healthy
        print(f"{s.name}: {s.url} pid {s.pid} {'alive' if alive else 'dead'} {'healthy' if healthy else 'unhealthy'}")
    return 0 if ok else 1


def _cmd_env(root: Path) -> int:
    services = _load_state(root)
    if not services:
        print(f"no services recorded in {root / STATE_FILE}", file=sys.stderr)
        return 1
    for key, value in sorted(_client_env(root.resolve(), services).items()):
        print(f"export {key}={shlex.quote(value)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.services", description="Start, stop and inspect the local Prefect and MLflow servers."
    )
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("--root", type=Path, required=True, help="folder for databases, logs and services.json")
    parser.add_argument("--timeout", type=float, default=START_TIMEOUT_S, help="seconds to wait for health (up)")
    args = parser.parse_args(argv)
    root: Path = args.root
    root.mkdir(parents=True, exist_ok=True)
    if args.command == "up":
        return _cmd_up(root, args.timeout)
    if args.command == "down":
        return _cmd_down(root)
    if args.command == "status":
        return _cmd_status(root)
    return _cmd_env(root)


if __name__ == "__main__":
    sys.exit(main())
