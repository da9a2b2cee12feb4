"""MLflow helpers over :class:`mlflow.MlflowClient` with explicit run ids.

MLflow's active run is thread-local, so tasks submitted to Prefect's thread pool do not see it: everything here
takes a ``client`` and a ``run_id`` and never calls ``mlflow.start_run`` / ``mlflow.log_*``.

Layout of a tracking root (``root``): the store is ``root/mlflow.db`` (:func:`tracking_uri`) and artifacts go
under ``root/artifacts`` (:func:`artifact_root`); ``mlflow ui --backend-store-uri`` browses it
(``scripts/ui.sh``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

__all__ = [
    "NONFINITE_METRIC",
    "PARAM_VALUE_LIMIT",
    "Tracking",
    "artifact_root",
    "end_run",
    "flatten_params",
    "git_commit",
    "log_artifact_dir",
    "log_image",
    "log_json",
    "log_metrics",
    "log_params",
    "redact_secrets",
    "sanitize_key",
    "start_run",
    "tracked_run",
    "tracking_uri",
]

# MLflow 3.17 stores up to 6000 characters per param value; 500 keeps values readable in the UI and within the
# limit of older servers. The full values always go to the params JSON artifact.
PARAM_VALUE_LIMIT = 500
TRUNCATION_MARKER = "...[truncated]"
NONFINITE_METRIC = "tracking/nonfinite_dropped"
_KEY_LIMIT = 250  # MLflow's MAX_ENTITY_KEY_LENGTH
_BATCH = 100  # MLflow's MAX_PARAMS_TAGS_PER_BATCH (metrics allow 1000; one size keeps it simple)
_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")  # MLflow also allows ':' except on Windows; we do not


@dataclass(frozen=True)
class Tracking:
    """Where a stage's MLflow run goes: the store, the experiment, the parent run, the run's name and tags."""

    uri: str
    experiment: str
    run_name: str
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


def tracking_uri(root: Path) -> str:
    """Absolute SQLite tracking URI ``sqlite:////ABS/root/mlflow.db`` (a relative one depends on the cwd)."""
    return f"sqlite:///{(root.resolve() / 'mlflow.db').as_posix()}"


def artifact_root(root: Path) -> Path:
    """Absolute artifact folder of a tracking root: ``root/artifacts``."""
    return root.resolve() / "artifacts"


def git_commit(path: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``path`` (default: this code's), or ``None`` outside git."""
    cwd = path if path is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None  # no git, not a repository, or a repository without commits
    return out.stdout.strip() or None


def start_run(
    client: MlflowClient,
    experiment: str,
    run_name: str,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    artifact_location: str | None = None,
    source_dir: Path | None = None,
) -> str:
    """Create a run (nested under ``parent_run_id`` via the ``mlflow.parentRunId`` tag) and return its id.

    Args:
        experiment: Experiment name, created when missing.
        artifact_location: For a new experiment; by default ``artifact_root(<db folder>)/<experiment>`` when the
            client writes to a SQLite file (MLflow's own default is ``./mlruns`` of the current directory), and the
            server's default for an HTTP tracking URI.
        source_dir: Where to read the git commit (tag ``mlflow.source.git.commit``); default this code's checkout.
    """
    experiment_id = _experiment_id(client, experiment, artifact_location)
    all_tags = dict(tags or {})
    if parent_run_id is not None:
        all_tags["mlflow.parentRunId"] = parent_run_id
    commit = git_commit(source_dir)
    if commit is not None:
        all_tags.setdefault("mlflow.source.git.commit", commit)
    return str(client.create_run(experiment_id, tags=all_tags, run_name=run_name).info.run_id)


def end_run(client: MlflowClient, run_id: str, status: str = "FINISHED") -> None:
    """Terminate a run with ``status``: ``FINISHED``, ``FAILED`` or ``KILLED``."""
    if status not in ("FINISHED", "FAILED", "KILLED"):
        raise ValueError(f"status must be FINISHED, FAILED or KILLED, got {status!r}")
    client.set_terminated(run_id, status=status)


@contextmanager
def tracked_run(
    client: MlflowClient, experiment: str, run_name: str, parent_run_id: str | None = None, **kwargs: Any
) -> Iterator[str]:
    """:func:`start_run` as a context manager: yields the run id, ends ``FINISHED``, ``FAILED`` on an exception
    and ``KILLED`` on KeyboardInterrupt."""
    run_id = start_run(client, experiment, run_name, parent_run_id, **kwargs)
    try:
        yield run_id
    except KeyboardInterrupt:
        end_run(client, run_id, "KILLED")
        raise
    except BaseException:
        end_run(client, run_id, "FAILED")
        raise
    end_run(client, run_id, "FINISHED")


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings to dotted keys: ``{"optim": {"lr": 1e-4}}`` -> ``{"optim.lr": 1e-4}``."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = value
    return flat


SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)
"""Environment variables whose values never reach MLflow (params, their JSON artifact): credentials by name."""
REDACTED = "<redacted>"
_MIN_SECRET_CHARS = 8  # shorter values ("true", "1") are settings, and would redact half of every text


def redact_secrets(text: str) -> str:
    """``text`` with the value of every environment variable named like a credential (:data:`SECRET_NAME`)
    replaced by :data:`REDACTED`: what is logged to MLflow, which every reader of the tracking server sees."""
    secrets = sorted(
        (v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_CHARS),
        key=len,
        reverse=True,
    )
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def log_params(
    client: MlflowClient,
    run_id: str,
    params: Mapping[str, Any],
    artifact_file: str = "params.json",
    max_length: int = PARAM_VALUE_LIMIT,
) -> list[str]:
    """Log nested ``params`` flattened with dots and stringified; return the keys whose values were truncated.

    Values longer than ``max_length`` end in ``TRUNCATION_MARKER``; the full nested params are always logged as the
    JSON artifact ``artifact_file``. A credential's value (:func:`redact_secrets`) is never logged. Lists and
    tuples are stringified as JSON, other values with ``str``.
    """
    entries: list[Param] = []
    truncated: list[str] = []
    for key, value in _unique_keys(flatten_params(params)).items():
        text = json.dumps(value, default=str) if isinstance(value, list | tuple) else str(value)
        text = redact_secrets(text)
        if len(text) > max_length:
            text = text[: max_length - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER
            truncated.append(key)
        entries.append(Param(key, text))
    for start in range(0, len(entries), _BATCH):
        client.log_batch(run_id, params=entries[start : start + _BATCH])
    log_json(client, run_id, params, artifact_file)
    return truncated


def log_metrics(client: MlflowClient, run_id: str, metrics: Mapping[str, float], step: int) -> int:
    """Log ``metrics`` at ``step`` in batches; return how many non-finite values were dropped.

    Keys are sanitised with :func:`sanitize_key`. NaN and +-inf are not logged (they break MLflow's charts); when any
    are dropped, their count is logged as ``tracking/nonfinite_dropped`` at the same step.
    """
    timestamp = int(time.time() * 1000)
    entries: list[Metric] = []
    dropped = 0
    for key, value in _unique_keys(metrics).items():
        number = float(value)
        if not math.isfinite(number):
            dropped += 1
            continue
        entries.append(Metric(key, number, timestamp, step))
    if dropped:
        entries.append(Metric(NONFINITE_METRIC, float(dropped), timestamp, step))
    for start in range(0, len(entries), _BATCH):
        client.log_batch(run_id, metrics=entries[start : start + _BATCH])
    return dropped


def log_image(client: MlflowClient, run_id: str, image: Path | np.ndarray, artifact_file: str) -> None:
    """Log an image file as is, or an array (``uint8 (H, W)``, ``(H, W, 3|4)`` or floats in [0, 1]) as PNG/JPEG."""
    if isinstance(image, np.ndarray):
        client.log_image(run_id, image, artifact_file=artifact_file)
        return
    _log_file_as(client, run_id, Path(image), artifact_file)


def log_json(client: MlflowClient, run_id: str, data: Any, artifact_file: str) -> None:
    """Log ``data`` as indented, key-sorted JSON (credentials redacted: :func:`redact_secrets`); paths and other
    non-JSON values are written with ``str``."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    client.log_text(run_id, redact_secrets(text), artifact_file)


def log_artifact_dir(client: MlflowClient, run_id: str, local_dir: Path, artifact_path: str | None = None) -> None:
    """Log every file under ``local_dir`` (recursively) under ``artifact_path`` of the run."""
    if not local_dir.is_dir():
        raise NotADirectoryError(f"log_artifact_dir expects a directory, got {local_dir}")
    client.log_artifacts(run_id, str(local_dir), artifact_path)


def sanitize_key(key: str) -> str:
    """Map ``key`` to MLflow's allowed names: ASCII alphanumerics, ``_ - . /`` and spaces; no empty, ``.`` or
    ``..`` path segments; at most 250 characters. Other characters become ``_``."""
    cleaned = _BAD_KEY_CHARS.sub("_", str(key))
    segments = [s for s in cleaned.split("/") if s not in ("", ".", "..")]
    result = "/".join(segments)[:_KEY_LIMIT].rstrip("/")
    if not result:
        raise ValueError(f"metric or param key {key!r} has no usable characters")
    return result


# --- internals ------------------------------------------------------------------------------------------------


def _unique_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """Sanitise keys; two keys that sanitise to the same name are an error rather than a silent overwrite."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in values.items():
        clean = sanitize_key(key)
        if clean in out:
            raise ValueError(f"keys {origin[clean]!r} and {key!r} both sanitise to {clean!r}")
        out[clean], origin[clean] = value, key
    return out


def _experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    if artifact_location is None:
        db = _sqlite_path(client.tracking_uri)
        if db is not None:
            artifact_location = (artifact_root(db.parent) / sanitize_key(name).replace("/", "_")).as_uri()
    return str(client.create_experiment(name, artifact_location=artifact_location))


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI (absolute with four slashes), else ``None``."""
    prefix = "sqlite:///"
    path = uri[len(prefix) :].split("?", 1)[0] if uri.startswith(prefix) else ""
    return Path(path).resolve() if path and path != ":memory:" else None


def _log_file_as(client: MlflowClient, run_id: str, path: Path, artifact_file: str) -> None:
    """Log ``path`` under the run as ``artifact_file`` (``log_artifact`` keeps the source name, so copy first)."""
    if not path.is_file():
        raise FileNotFoundError(f"no image file at {path}")
    artifact_dir, _, name = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / name
        shutil.copyfile(path, target)
        client.log_artifact(run_id, str(target), artifact_dir or None)
