"""A curriculum's stages through the shared store (:mod:`tasks.store`): what a stage publishes when it finishes or
checkpoints, and what a machine restores before it trains or reuses a stage, so that any machine continues where
another stopped. The layout is :mod:`tasks.store`'s; a run folder's key is its path relative to the project root,
the same on every machine.

Nothing here runs when ``VGRPO_STORE`` is unset: one machine keeps everything in its run folder, as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tasks.stage_layout import MANIFEST, dir_hash, stage_dirs
from tasks.store import Store
from vgrpo.atomic import write_json_atomic
from vgrpo.errors import ConfigError
from vgrpo.training.stage import StageCallbacks

__all__ = [
    "CheckpointUpload",
    "project_path",
    "publish_outcome",
    "publish_stage",
    "published_outcome",
    "restore_adapter",
    "restore_checkpoints",
    "restore_stage",
    "run_key",
]


def project_path(path: str | Path, root: str | Path = ".") -> str:
    """``path`` relative to the project root, as every machine's checkout names it wherever it lies.

    Raises:
        ConfigError: ``path`` lies outside the project root.
    """
    rel = Path(os.path.relpath(Path(path).resolve(), Path(root).resolve())).as_posix()
    if rel.startswith(".."):
        raise ConfigError(f"{path} must lie inside the project root {root} for the other machines to find it")
    return rel


def run_key(run_root: str | Path, root: str | Path = ".") -> str:
    """The store key of a run folder: its path relative to the project root (``runs/curriculum/<name>``), the
    same on every machine whose checkout lies elsewhere."""
    rel = project_path(run_root, root)
    if rel.split("/")[0] == "adapters":
        raise ConfigError(f"run folder {run_root} must not be 'adapters' (the store's adapters live there)")
    return rel


def publish_stage(store: Store, run_root: str | Path, name: str, root: str | Path = ".") -> str:
    """Upload the stage's adapter as ``adapters/<hash>`` and then its manifest (which names the hash); returns
    the hash."""
    out_dir, work_dir = stage_dirs(run_root, name)
    manifest: dict[str, Any] = json.loads((work_dir / MANIFEST).read_text())
    store.put_dir(out_dir, f"adapters/{manifest['hash']}")
    store.put_json(f"{run_key(run_root, root)}/work/{name}/{MANIFEST}", manifest)
    return str(manifest["hash"])


def restore_adapter(store: Store, path: Path, digest: str) -> bool:
    """Make ``path`` hold the adapter ``digest`` (from ``adapters/<digest>`` when it is absent or differs here);
    returns whether it is there now."""
    if path.is_dir() and dir_hash(path) == digest:
        return True
    if not store.has(f"adapters/{digest}"):
        return False
    store.get_dir(f"adapters/{digest}", path)
    return True


def restore_stage(store: Store, run_root: str | Path, name: str, root: str | Path = ".") -> bool:
    """Bring a stage another machine finished into this run folder: its manifest, then the adapter it names by
    content hash. Returns whether the store had it (the flow then checks it as it checks a local output)."""
    manifest = store.get_json(f"{run_key(run_root, root)}/work/{name}/{MANIFEST}")
    if not isinstance(manifest, dict) or "hash" not in manifest:
        return False
    out_dir, work_dir = stage_dirs(run_root, name)
    if not restore_adapter(store, out_dir, str(manifest["hash"])):
        return False
    write_json_atomic(work_dir / MANIFEST, manifest)
    return True


OUTCOME = "outcome.json"
"""A trained stage's outcome (:meth:`tasks.outcome.StageOutcome.to_json`) in the store, beside its manifest: what
another machine's train task returns for a stage finished elsewhere, in place of Prefect's pickled result."""


def publish_outcome(
    store: Store, run_root: str | Path, name: str, outcome: dict[str, Any], root: str | Path = "."
) -> None:
    """Write a trained stage's outcome (JSON) under its run folder's key in the store."""
    store.put_json(f"{run_key(run_root, root)}/work/{name}/{OUTCOME}", outcome)


def published_outcome(store: Store, run_root: str | Path, name: str, digest: str, root: str | Path = ".") -> Any:
    """The outcome the store holds for stage ``name`` when it names the output ``digest``, else None."""
    outcome = store.get_json(f"{run_key(run_root, root)}/work/{name}/{OUTCOME}")
    if isinstance(outcome, dict) and outcome.get("hash") == digest and outcome.get("name") == name:
        return outcome
    return None


def restore_checkpoints(store: Store, run_root: str | Path, name: str, root: str | Path = ".") -> list[str]:
    """Download the stage's checkpoints that are in the store and not here (the trainer then resumes from the
    newest it owns, as from a local one). Returns the names it downloaded."""
    key = f"{run_key(run_root, root)}/work/{name}/checkpoints"
    local = stage_dirs(run_root, name)[1] / "checkpoints"
    fetched = []
    for child in store.children(key):
        if not (local / child / "state.json").is_file():
            store.get_dir(f"{key}/{child}", local / child)
            fetched.append(child)
    return fetched


class CheckpointUpload(StageCallbacks):
    """Each checkpoint the stage writes, uploaded to the store as it is written (rank 0's, which is whole)."""

    def __init__(self, store: Store, run_root: str | Path, name: str, root: str | Path = ".") -> None:
        self.store, self.key = store, f"{run_key(run_root, root)}/work/{name}/checkpoints"

    def on_checkpoint(self, path: Path, iteration: int) -> None:
        self.store.put_dir(path, f"{self.key}/{path.name}")
