"""Sharded training checkpoints (``distributed.strategy: fsdp``): every rank writes its own shards, no pickle.

A sharded checkpoint is a directory that every rank writes into one temporary sibling; after a barrier rank 0
renames it into place (:func:`vgrpo.atomic.publish_dir`), so a run killed at any moment leaves either the whole
checkpoint or none:

* ``shards/shard-<rank + 1>-model-00001-of-00001.safetensors`` -- written by ``torch.distributed.checkpoint.save``
  through its ``HuggingFaceStorageWriter`` (``save_distributed=True``): this rank's shards of the trainable
  parameters (``model/<name>``), of the optimizer's tensors (``optim/state.<name>.<key>``, the flattened state of
  ``get_state_dict``) and of the snapshots (``snapshot/<name>/<i>``), each with its offsets in the file's header;
* ``optimizer.json`` -- the optimizer's param groups (lr, betas, ...), its only values that are not tensors;
* ``manifest.json`` -- the SHA-256 of every file above, checked (each rank a share of the files) before loading;
* ``state.json`` -- the iteration, history and run identity, as in :mod:`vgrpo.checkpoints.state`, written last.

Why this storage: torch.distributed.checkpoint's default ``FileSystemWriter`` writes a ``.metadata`` file that its
``FileSystemReader`` reads with ``pickle.load``, and its ``DefaultLoadPlanner`` reads any non-tensor entry with
``torch.load(weights_only=False)``; both would run code planted in a checkpoint. ``HuggingFaceStorageReader``
rebuilds the metadata from the safetensors headers (JSON) and reads tensors with safetensors; the rest is JSON.
Nothing here unpickles.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from vgrpo.atomic import publish_dir, temporary_dir
from vgrpo.checkpoints.state import Checkpointed, CheckpointError
from vgrpo.models.saving import save_pipeline
from vgrpo.parallel.distributed import Distributed
from vgrpo.parallel.fsdp import full_state_dict, unsharded_copy

__all__ = ["export_pipeline", "load_sharded_state", "save_sharded_state"]

SHARDS = "shards"
FILES = ("optimizer.json", "manifest.json", "state.json")


def _state_dicts(live: Checkpointed) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every tensor a checkpoint holds by its key (the live ones: loading writes into them), and the optimizer's
    other values."""

    model, optim = get_state_dict(live.module, live.optimizer, options=_options())
    tensors: dict[str, Any] = {f"model/{k}": v for k, v in model.items()}
    tensors |= {f"optim/{k}": v for k, v in optim.items() if isinstance(v, Tensor)}
    tensors |= {f"snapshot/{name}/{i}": v for name, s in live.snapshots.items() for i, v in enumerate(s.values)}
    return tensors, {k: v for k, v in optim.items() if not isinstance(v, Tensor)}


def _options() -> Any:
    return StateDictOptions(flatten_optimizer_state_dict=True, ignore_frozen_params=True)


@contextmanager
def _quiet_in_one_process(dist: Distributed) -> Iterator[None]:
    """DCP warns on every call without a process group that it assumes one process: here that is the intent."""
    with warnings.catch_warnings():
        if dist.world_size == 1:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(2**24):
            digest.update(chunk)
    return digest.hexdigest()


def _my_files(root: Path, dist: Distributed) -> list[Path]:
    """This rank's share of the files to hash: every ``world_size``-th of them, in name order."""
    files = [*sorted((root / SHARDS).iterdir()), root / "optimizer.json"]
    return files[dist.rank :: dist.world_size]


def save_sharded_state(path: Path, live: Checkpointed, state: Mapping[str, Any], dist: Distributed) -> None:
    """Write a sharded checkpoint directory at ``path`` (module docstring). A collective: every rank calls it."""

    tensors, scalars = _state_dicts(live)
    tmp = dist.broadcast_object(temporary_dir(path) if dist.is_main else None)
    try:
        writer = dcp.HuggingFaceStorageWriter(str(tmp / SHARDS), save_distributed=True)
        with _quiet_in_one_process(dist):
            dcp.save(tensors, storage_writer=writer, no_dist=dist.world_size == 1)
        if dist.is_main:
            (tmp / "optimizer.json").write_text(json.dumps(scalars, sort_keys=True))
        dist.barrier()
        hashes = {f.relative_to(tmp).as_posix(): _sha256(f) for f in _my_files(tmp, dist)}
        shares = dist.gather_object(hashes)
        if dist.is_main:
            manifest = {k: v for share in shares for k, v in share.items()}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
            (tmp / "state.json").write_text(json.dumps(dict(state), indent=2, sort_keys=True))
            publish_dir(tmp, path)
        dist.barrier()
    except BaseException:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check(path: Path, dist: Distributed) -> str | None:
    """What is wrong with the checkpoint's files from this rank's view (``None``: its share is sound)."""
    missing = [name for name in FILES if not (path / name).is_file()]
    if missing or not (path / SHARDS).is_dir():
        return f"incomplete checkpoint, missing {missing or [SHARDS]}"
    try:
        manifest: dict[str, str] = json.loads((path / "manifest.json").read_text())
    except ValueError as exc:
        return f"manifest.json unreadable ({exc})"
    listed = {f.relative_to(path).as_posix() for f in (path / SHARDS).iterdir()} | {"optimizer.json"}
    if listed != set(manifest):
        return f"files do not match manifest.json (e.g. {sorted(listed ^ set(manifest))[:3]})"
    mine = [f.relative_to(path).as_posix() for f in _my_files(path, dist)]
    bad = [name for name in mine if _sha256(path / name) != manifest[name]]
    return f"checksum mismatch in {bad}" if bad else None


def load_sharded_state(path: Path, live: Checkpointed, dist: Distributed) -> dict[str, Any]:
    """Restore a :func:`save_sharded_state` directory into ``live``'s module, optimizer and snapshots (each rank its
    shards); returns its ``state``. A collective: every rank calls it.

    Every file is checked against ``manifest.json`` (the ranks share the hashing) and the tensors' names and shapes
    against the model before anything is changed; a failure raises :class:`CheckpointError` on every rank."""

    problem = _check(path, dist)
    problems = [p for p in dist.gather_object(problem) if p is not None]
    if problems:
        raise CheckpointError(f"{path}: {problems[0]}")
    tensors, _ = _state_dicts(live)
    reader = dcp.HuggingFaceStorageReader(str(path / SHARDS))
    try:
        stored = reader.read_metadata().state_dict_metadata
        scalars = json.loads((path / "optimizer.json").read_text())
        state: dict[str, Any] = json.loads((path / "state.json").read_text())
    except Exception as exc:  # safetensors and json raise their own types for a garbled file
        raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc
    if set(stored) != set(tensors):
        raise CheckpointError(f"{path}: tensors do not match the model (e.g. {sorted(set(stored) ^ set(tensors))[:3]})")
    bad_shape = [k for k, t in tensors.items() if tuple(getattr(stored[k], "size", ())) != tuple(t.shape)]
    if bad_shape:
        raise CheckpointError(f"{path}: tensor shapes do not match the model (e.g. {bad_shape[:3]})")
    with _quiet_in_one_process(dist):  # in place, each rank reading the slices of its shards
        dcp.load(tensors, storage_reader=reader, no_dist=dist.world_size == 1)
    model: dict[str, Any] = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    optim: dict[str, Any] = {k.removeprefix("optim/"): v for k, v in tensors.items() if k.startswith("optim/")}
    optim |= {k: tuple(v) if isinstance(v, list) else v for k, v in scalars.items()}  # JSON has no tuples (betas)
    set_state_dict(live.module, live.optimizer, model_state_dict=model, optim_state_dict=optim, options=_options())
    return state


def export_pipeline(pipe: Any, dist: Distributed, out_dir: Path) -> None:
    """Write ``pipe`` with its sharded transformer gathered whole as a plain diffusers pipeline (``save_pretrained``,
    safetensors, atomically) from rank 0. A collective: every rank must call it (with the same weights swapped
    in)."""
    state = full_state_dict(pipe.transformer)
    if dist.is_main:
        whole = type(pipe)(**{**pipe.components, "transformer": unsharded_copy(pipe.transformer, state)})
        save_pipeline(whole, out_dir)
