"""Where a run keeps a stage: its output folder, its work folder with the checkpoints and the manifest beside them,
and the content hash that names an output."""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from vgrpo.errors import ConfigError

__all__ = ["MANIFEST", "check_project_root", "checked_relative", "dir_hash", "stage_dirs"]

MANIFEST = "export.json"
"""Beside the checkpoints: which training produced the stage's output, and the output's hash."""


def dir_hash(path: Path, pattern: str = "*") -> str:
    """SHA-256 (16 hex digits) over the names and bytes of the files under ``path`` matching ``pattern``: the
    identity of a stage's output."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob(pattern) if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def stage_dirs(run_root: str | Path, name: str) -> tuple[Path, Path]:
    """A stage's output folder (``run_root/stages/<name>``) and its work folder with the checkpoints
    (``run_root/work/<name>``)."""
    return Path(run_root) / "stages" / name, Path(run_root) / "work" / name


def checked_relative(label: str, value: str, *, absolute: bool = False) -> str:
    """``value`` when it is a path without a ``..`` part, relative (inside the project) unless ``absolute`` allows
    an absolute one (as the CLI takes an explicit ``--out``): a flow run's or a machine job's path, which the run
    writes, replaces or deletes under. A :class:`ConfigError` naming ``label``."""
    path = PurePosixPath(str(value))
    if not str(value) or ".." in path.parts or "\\" in str(value) or (path.is_absolute() and not absolute):
        where = "a path without '..'" if absolute else "a relative path inside the project, without '..'"
        raise ConfigError(f"{label}: {value!r} must be {where}")
    return str(value)


def check_project_root(root: str) -> None:
    """A flow run's ``root`` must be an existing folder (the checkout the worker resolved), named in the error."""
    if not Path(root).is_dir():
        raise ConfigError(f"root: {root!r} is not a folder on this machine")
