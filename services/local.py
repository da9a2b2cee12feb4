"""A throwaway local Prefect server for tests and benchmarks, and process-group stops.

The scripts use Prefect's own ``prefect server start --background`` / ``status --wait`` / ``stop``
(``scripts/curriculum.sh``). MLflow needs no server: clients log to ``MLFLOW_TRACKING_URI=sqlite:////ABS/mlflow.db``
and ``mlflow ui`` only browses (``scripts/ui.sh``). :func:`local_services` runs the server in its own session, so
that :func:`tasks.process_group.stop_group` (SIGTERM to the process group, then SIGKILL) leaves nothing behind.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tasks.process_group import log_tail, start_detached, stop_group

__all__ = ["QUIET_ENV", "LocalServices", "ServiceError", "local_services", "service_env", "wait_healthy"]

HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
# Telemetry off: MLflow accepts only "true" for these two.
QUIET_ENV = {"DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}


class ServiceError(RuntimeError):
    """The server did not answer its health check."""


@dataclass(frozen=True)
class LocalServices:
    env: dict[str, str]  # what a client (flow, DVC stage, ``serve``) merges into ``os.environ``
    pgid: int  # the server's process group
    log: Path  # the server's stdout and stderr


def service_env(
    prefect_api_url: str | None = None, mlflow_tracking_uri: str | None = None, prefect_home: Path | None = None
) -> dict[str, str]:
    """Client environment; ``mlflow_tracking_uri`` must be absolute (``sqlite:////ABS/mlflow.db`` or ``http://``)
    because DVC stages and flow runs start in different directories."""
    env = {**QUIET_ENV, "PREFECT_RUNNER_POLL_FREQUENCY": "2", "HF_HUB_OFFLINE": "1"}
    if prefect_api_url is not None:
        env["PREFECT_API_URL"] = prefect_api_url
    if prefect_home is not None:
        env["PREFECT_HOME"] = str(prefect_home.resolve())
    if mlflow_tracking_uri is not None:
        if not mlflow_tracking_uri.startswith(("sqlite:////", "http://", "https://")):
            raise ValueError(f"MLFLOW_TRACKING_URI must be absolute (sqlite:////ABS/...), not {mlflow_tracking_uri}")
        env["MLFLOW_TRACKING_URI"] = mlflow_tracking_uri
    return env


@contextmanager
def local_services(root: Path, timeout: float = START_TIMEOUT_S) -> Iterator[LocalServices]:
    """Start ``prefect server start`` on a free loopback port with ``PREFECT_HOME=root/prefect`` (log
    ``root/prefect/server.log``), wait for ``/api/health``, yield the client env (MLflow store
    ``root/mlflow/mlflow.db``), and stop the server's process group on exit."""
    root = root.resolve()
    home, store = root / "prefect", root / "mlflow"
    home.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:  # a port that is free now; the OS picks it
        sock.bind((HOST, 0))
        port = int(sock.getsockname()[1])
    url = f"http://{HOST}:{port}/api"
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # no inherited API URL or DB
    server_env.update(QUIET_ENV, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)]
    log = home / "server.log"
    with log.open("wb") as out:
        proc = start_detached(command, server_env, home, out)
    try:
        wait_healthy("the Prefect server", url + "/health", proc, log, timeout)
        yield LocalServices(service_env(url, f"sqlite:///{store / 'mlflow.db'}", home), proc.pid, log)
    finally:
        stop_group(proc, STOP_TIMEOUT_S)


def wait_healthy(
    what: str, url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float, cafile: Path | None = None
) -> None:
    """Poll ``url`` until it answers 200 (over https, its certificate checked against ``cafile``); a
    :class:`ServiceError` naming ``what`` with the tail of its ``log`` when ``proc`` exits first or ``timeout``
    seconds pass."""
    deadline = time.monotonic() + timeout
    while not _healthy(url, cafile):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ServiceError(
                f"{what} did not answer {url} within {timeout:.0f} s (exit code {proc.returncode}); log {log}:\n"
                + log_tail(log)
            )
        time.sleep(0.25)


def _healthy(url: str, cafile: Path | None = None) -> bool:
    context = ssl.create_default_context(cafile=str(cafile)) if cafile is not None else None
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except OSError:  # URLError included
        return False
