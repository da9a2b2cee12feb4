"""Where a run keeps a stage: its output folder, its work folder with the checkpoints and the manifest beside them,
and the content hash that names an output."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["MANIFEST", "dir_hash", "stage_dirs"]

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
