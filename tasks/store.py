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

Whoever can write the store must not run code on the machines that read it: a download writes only the plain
relative names of its listing under its destination (an absolute, empty, ``.`` or ``..`` name, or one that resolves
outside, is refused before anything is written), an upload refuses symlinks (which would publish whatever they
point at), every key is checked the same way, and JSON is written whole (a temporary file renamed into place on a
folder; one PUT on an object store). Nothing here unpickles: the store holds JSON, safetensors and listings.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from vgrpo.atomic import file_sha256, write_text_atomic

__all__ = ["COMPLETE", "Store", "StoreError", "check_results_stay_local", "checked_key", "file_sha256"]

COMPLETE = ".complete"


class StoreError(RuntimeError):
    """The store is unreachable, or a folder in it is incomplete or corrupted; the message names the key."""


def checked_key(key: str, what: str = "key") -> str:
    """``key`` when it is a plain relative ``/``-separated name (no empty, ``.`` or ``..`` part, not absolute, no
    backslash or NUL), else a :class:`StoreError` naming it: what a store key or a listed file may be."""
    if not isinstance(key, str) or not key or "\\" in key or "\0" in key or key.startswith("/"):
        raise StoreError(f"{what} {key!r} is not a relative path")
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise StoreError(f"{what} {key!r} has an empty, '.' or '..' part")
    return key


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
        """The store path of ``key`` (checked: :func:`checked_key`)."""
        return f"{self.root}/{checked_key(key.strip('/'))}"

    def _write_text(self, key: str, text: str) -> None:
        """Write ``text`` at ``key`` whole: on a folder through a temporary file renamed into place (a reader sees
        the old file or the new one), on an object store as one PUT (an object appears whole)."""
        target = self.path(key)
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        if isinstance(self.fs, LocalFileSystem):
            write_text_atomic(target, text)
        else:
            self.fs.pipe_file(target, text.encode())

    def has(self, key: str) -> bool:
        """Whether the folder ``key`` is complete in the store."""
        return bool(self.fs.exists(self.path(key) + "/" + COMPLETE))

    def put_dir(self, local: Path, key: str) -> None:
        """Upload the files under ``local`` to ``key``, then its ``.complete`` listing (sizes and hashes). A
        symlink under ``local`` is refused (it would publish whatever it points at), before anything is sent."""
        entries = sorted(local.rglob("*"))
        links = [p for p in entries if p.is_symlink()]
        if links or local.is_symlink():
            raise StoreError(f"{local}: refusing to upload the symlink {(links or [local])[0]} to {key}")
        files = [p for p in entries if p.is_file()]
        listing = {p.relative_to(local).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in files}
        if self.has(key) and self._listing(key) == listing:
            return  # already there, byte for byte
        for rel in listing:
            target = self.path(key) + "/" + rel
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(local / rel), target)
        self._write_text(f"{key}/{COMPLETE}", json.dumps(listing, sort_keys=True))

    def _listing(self, key: str) -> dict[str, dict[str, Any]]:
        """The ``.complete`` listing of ``key``, each name checked (:func:`checked_key`) and each entry a size and
        a SHA-256; a :class:`StoreError` naming the key otherwise."""
        with self.fs.open(self.path(key) + "/" + COMPLETE, "r") as f:
            try:
                listing = json.loads(f.read())
            except ValueError as exc:
                raise StoreError(f"{self.url}: {key}/{COMPLETE} is not JSON: {exc}") from exc
        if not isinstance(listing, dict):
            raise StoreError(f"{self.url}: {key}/{COMPLETE} is not a listing")
        for rel, meta in listing.items():
            checked_key(rel, f"{self.url}: {key}/{COMPLETE} lists")
            if not (
                isinstance(meta, dict)
                and isinstance(meta.get("size"), int)
                and isinstance(meta.get("sha256"), str)
                and set(meta) == {"size", "sha256"}
            ):
                raise StoreError(f"{self.url}: {key}/{COMPLETE}: the entry of {rel!r} is not a size and a SHA-256")
        return dict(listing)

    def get_dir(self, key: str, local: Path) -> Path:
        """Download the complete folder ``key`` to ``local`` (through a temporary sibling renamed into place, each
        file checked against the listing). Raises :class:`StoreError` when it is absent, incomplete or corrupted,
        or when its listing names a file outside the folder (checked for every name before anything is written)."""
        if not self.has(key):
            raise StoreError(f"{self.url}: {key} is absent or incomplete (no {COMPLETE})")
        listing = self._listing(key)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{local.name}.", dir=local.parent))
        try:
            inside = tmp.resolve()
            dests = {rel: tmp / PurePosixPath(rel) for rel in listing}
            for rel, dest in dests.items():  # checked_key already refused '..'; a belt against platform quirks
                if inside not in dest.resolve().parents:
                    raise StoreError(f"{self.url}: {key}/{COMPLETE} lists {rel!r}, outside the folder")
            for rel, meta in listing.items():
                dest = dests[rel]
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
        """Write ``value`` as JSON at ``key``, whole (:meth:`_write_text`)."""
        self._write_text(key, json.dumps(value, sort_keys=True))

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
        return sorted(n for n in names if _plain(n) and self.has(f"{key}/{n}"))


def _plain(name: str) -> bool:
    """Whether ``name`` is one plain path part (what :meth:`Store.children` offers to a download)."""
    try:
        checked_key(name)
    except StoreError:
        return False
    return "/" not in name


def check_results_stay_local(store: Store | None) -> None:
    """Refuse Prefect result storage that other hosts can write, in team mode (``store`` set): Prefect reads a
    result record with the serializer the record names, pickle included, so a record planted there runs code on
    the next cache hit. A results block (``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK``, which an earlier ``up`` saved
    for an object store) or ``PREFECT_LOCAL_STORAGE_PATH`` inside a folder store is refused with the setting's
    name; the results then stay in ``$PREFECT_HOME/storage`` on this machine (docs/cluster.md)."""
    if store is None:
        return
    from prefect.settings import get_current_settings

    results = get_current_settings().results
    fix = "unset it: Prefect's result records are pickles and stay on each machine; the store carries the rest"
    if results.default_storage_block:
        raise StoreError(f"PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK={results.default_storage_block}: {fix}")
    if isinstance(store.fs, LocalFileSystem):
        local = Path(results.local_storage_path).resolve()
        shared = Path(store.root).resolve()
        if local == shared or shared in local.parents:
            raise StoreError(f"PREFECT_LOCAL_STORAGE_PATH={local} lies in the store {store.url}: {fix}")
