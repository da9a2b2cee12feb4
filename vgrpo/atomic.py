"""Atomic writes: a file or directory is either the old one or the complete new one, never half-written.

Everything the project writes that a later step reads -- prompt splits, metrics, evaluation tables, model and
checkpoint directories -- goes through these, so a run killed at any moment leaves nothing a resume could
mistake for a finished result.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_dir",
    "dir_size_mb",
    "file_sha256",
    "publish_dir",
    "temporary_dir",
    "write_json_atomic",
    "write_text_atomic",
]


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, read in chunks (what records name the files they read by)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented, key-sorted JSON with :func:`write_text_atomic`."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def atomic_dir(final: Path, write: Callable[[Path], None]) -> None:
    """Write a directory via ``write(tmp)`` into a sibling temporary directory, then rename it over ``final``."""
    tmp = temporary_dir(final)
    try:
        write(tmp)
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def temporary_dir(final: Path) -> Path:
    """A new, empty sibling of ``final`` to write it in (``.NAME.tmp-PID``), for :func:`publish_dir`. Processes that
    write one directory together (a sharded checkpoint) share the one their first process made."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` over ``final`` (the old ``final``, if any, is moved aside first, then deleted)."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def dir_size_mb(path: Path) -> float:
    """Size of the files under ``path`` in MiB (of a model directory written by :func:`atomic_dir`)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
