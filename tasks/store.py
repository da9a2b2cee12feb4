"""The store every machine reaches (``VGRPO_STORE``): a folder they all mount, or an object store through fsspec
(``s3://bucket/prefix``, any S3-compatible server: ``AWS_ENDPOINT_URL`` names it). Stage outputs, checkpoints
and the pipeline's cached results live there, so that a stage on machine B finds what machine A wrote.

Layout (keys under the store's root):

* ``adapters/<hash>/``: a stage's exported adapter, by its content hash (:func:`tasks.stage.dir_hash`);
* ``<run folder>/work/<stage>/export.json``: which adapter a stage's training produced (fingerprint, starting
  adapter, code, hash), written after the adapter; the run folder's key is its path in the project
  (``runs/curriculum/<name>``);
* ``<run folder>/work/<stage>/checkpoints/iter-<n>/``: each resumable checkpoint as it is written.

A folder is complete when its ``.complete`` file exists: it is written last and lists every file's size and
SHA-256, which a download checks, so a reader never takes a half-uploaded folder (an object store has no atomic
rename) and a corrupted one is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import fsspec

__all__ = ["COMPLETE", "Store", "StoreError", "file_sha256"]

COMPLETE = ".complete"


class StoreError(RuntimeError):
    """The store is unreachable, or a folder in it is incomplete or corrupted; the message names the key."""


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Store:
    """A shared folder or an fsspec URL, with complete-or-absent folders (see the module docstring)."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        self.url = url
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as exc:
            raise StoreError(f"VGRPO_STORE={url!r}: {exc}") from exc
        self.root = self.root.rstrip("/")

    @classmethod
    def from_env(cls) -> Store | None:
        """The store ``VGRPO_STORE`` names, or None (one machine: everything stays local)."""
        url = os.environ.get("VGRPO_STORE")
        return cls(url) if url else None

    def path(self, key: str) -> str:
        return f"{self.root}/{key.strip('/')}"

    def has(self, key: str) -> bool:
        """Whether the folder ``key`` is complete in the store."""
        return bool(self.fs.exists(self.path(key) + "/" + COMPLETE))

    def put_dir(self, local: Path, key: str) -> None:
        """Upload the files under ``local`` to ``key``, then its ``.complete`` listing (sizes and hashes)."""
        files = sorted(p for p in local.rglob("*") if p.is_file())
        listing = {p.relative_to(local).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in files}
        if self.has(key) and self._listing(key) == listing:
            return  # already there, byte for byte
        for rel in listing:
            target = self.path(key) + "/" + rel
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(local / rel), target)
        with self.fs.open(self.path(key) + "/" + COMPLETE, "w") as f:
            f.write(json.dumps(listing, sort_keys=True))

    def _listing(self, key: str) -> dict[str, dict[str, Any]]:
        with self.fs.open(self.path(key) + "/" + COMPLETE, "r") as f:
            return dict(json.loads(f.read()))

    def get_dir(self, key: str, local: Path) -> Path:
        """Download the complete folder ``key`` to ``local`` (through a temporary sibling renamed into place, each
        file checked against the listing). Raises :class:`StoreError` when it is absent, incomplete or corrupted."""
        if not self.has(key):
            raise StoreError(f"{self.url}: {key} is absent or incomplete (no {COMPLETE})")
        listing = self._listing(key)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{local.name}.", dir=local.parent))
        try:
            for rel, meta in listing.items():
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(self.path(key) + "/" + rel, str(dest))
                if dest.stat().st_size != meta["size"] or file_sha256(dest) != meta["sha256"]:
                    raise StoreError(f"{self.url}: {key}/{rel} does not match its listing (corrupted upload?)")
            if local.exists():
                shutil.rmtree(local)
            tmp.rename(local)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
        return local

    def put_json(self, key: str, value: Any) -> None:
        self.fs.makedirs(self.path(key).rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(self.path(key), "w") as f:
            f.write(json.dumps(value, sort_keys=True))

    def get_json(self, key: str) -> Any | None:
        try:
            with self.fs.open(self.path(key), "r") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def children(self, key: str) -> list[str]:
        """The names of the complete folders directly under ``key``."""
        try:
            entries = self.fs.ls(self.path(key), detail=False)
        except FileNotFoundError:
            return []
        names = [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]
        return sorted(n for n in names if self.has(f"{key}/{n}"))
