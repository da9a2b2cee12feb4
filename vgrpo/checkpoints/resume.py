"""Resuming a stage: which checkpoints belong to a run, the newest one that loads whole, saving and pruning.

A run is identified by its training fingerprint (:func:`training_hash`: every param that decides the steps,
not the evaluation settings) and the content hash of its starting adapter (a previous stage re-run with other
params rewrites its adapter at the same path). Sharded over processes, rank 0 picks the checkpoint and every
rank loads the same one. Under ``distributed.strategy: fsdp`` the checkpoints are sharded
(:mod:`vgrpo.checkpoints.sharded`): every rank writes and reads its own shards.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from vgrpo.checkpoints.sharded import load_sharded_state, save_sharded_state
from vgrpo.checkpoints.state import (
    LORA_FILE,
    Checkpointed,
    CheckpointError,
    checkpoints,
    load_training_state,
    prune_checkpoints,
    quarantine,
    save_training_state,
)
from vgrpo.config import StageConfig
from vgrpo.parallel.distributed import Distributed

__all__ = ["EVALUATION_FIELDS", "ResumableRun", "adapter_hash", "training_hash"]

EVALUATION_FIELDS = frozenset({"eval_prompts", "evaluation", "eval_every", "eval_at_start"})
"""Stage fields that decide what is measured, never what is trained: left out of the training fingerprint, so a
changed evaluation setting re-evaluates without retraining."""


def adapter_hash(lora_dir: Path) -> str:
    """SHA-256 (16 hex digits) of a LoRA directory's weights file: the identity of a stage's starting adapter."""
    return hashlib.sha256((lora_dir / LORA_FILE).read_bytes()).hexdigest()[:16]


def training_hash(config: StageConfig) -> str:
    """Fingerprint of everything that decides the stage's steps (a checkpoint from other params is not resumed)."""
    # ``launch`` says how many processes share the batch, not which steps it takes: a checkpoint resumes on
    # another number of processes (tests/parallel/test_distributed.py).
    trained = config.model_dump(mode="json", exclude={*EVALUATION_FIELDS, "launch"})
    return hashlib.sha256(json.dumps(trained, sort_keys=True).encode()).hexdigest()[:16]


class ResumableRun:
    """The checkpoints of one run under ``root``: ``iter-N`` directories whose ``state.json`` carries the run's
    fingerprint and starting adapter hash; others (other params) are left alone. ``sharded``: every rank writes
    and reads its shards (:mod:`vgrpo.checkpoints.sharded`), else rank 0 writes whole tensors."""

    def __init__(self, root: Path, fingerprint: str, init_hash: str | None, keep: int, *, sharded: bool = False):
        self.root, self.fingerprint, self.init_hash, self.keep = root, fingerprint, init_hash, keep
        self.sharded = sharded

    @classmethod
    def for_stage(cls, config: StageConfig, work_dir: Path, init_lora: Path | None) -> ResumableRun:
        init_hash = adapter_hash(init_lora) if init_lora is not None else None
        return cls(work_dir / "checkpoints", training_hash(config), init_hash, config.keep_checkpoints,
                   sharded=config.distributed.strategy == "fsdp")  # fmt: skip

    def owns(self, checkpoint: Path) -> bool:
        try:
            state = json.loads((checkpoint / "state.json").read_text())
        except (OSError, ValueError):
            return True  # unreadable: let loading report it and set it aside
        return bool(state.get("config_hash") == self.fingerprint and state.get("init_lora_hash") == self.init_hash)

    def newest(self) -> Path | None:
        return next((c for c in checkpoints(self.root) if self.owns(c)), None)

    def peek(self) -> dict[str, Any] | None:
        """The state of the newest checkpoint of this run, without loading weights (``None`` when there is
        none or it is unreadable): what a tracker reads to continue the run it logged to."""
        newest = self.newest()
        try:
            return None if newest is None else dict(json.loads((newest / "state.json").read_text()))
        except (OSError, ValueError):
            return None

    def restore(self, live: Checkpointed, dist: Distributed) -> dict[str, Any] | None:
        """Load the newest checkpoint of this run that loads whole (rank 0 chooses, setting corrupt ones aside;
        the other ranks load what it chose); returns its state, or ``None`` to start from iteration 0."""
        if self.sharded:  # every rank loads its shards, trying the checkpoints rank 0 lists in turn
            listed = [c for c in checkpoints(self.root) if self.owns(c)] if dist.is_main else None
            for candidate in dist.broadcast_object(listed):
                try:
                    return load_sharded_state(candidate, live, dist)
                except CheckpointError as exc:  # raised on every rank alike
                    if dist.is_main:
                        moved = quarantine(candidate)
                        warnings.warn(f"{exc}; moved to {moved.name}, resuming from an older checkpoint", stacklevel=2)
                    dist.barrier()
            return None
        found: tuple[Path, dict[str, Any]] | None = None
        if dist.is_main:
            for candidate in (c for c in checkpoints(self.root) if self.owns(c)):
                try:
                    found = candidate, load_training_state(candidate, live)
                    break
                except CheckpointError as exc:
                    moved = quarantine(candidate)
                    warnings.warn(f"{exc}; moved to {moved.name}, resuming from an older checkpoint", stacklevel=2)
        path = dist.broadcast_object(None if found is None else found[0])
        if path is None:
            return None
        if found is not None:
            return found[1]
        return load_training_state(path, live)

    def save(self, iteration: int, state: dict[str, Any], live: Checkpointed, dist: Distributed | None = None) -> Path:
        """Write ``iter-<iteration>`` (atomically, stamped with this run's identity) and prune older ones. Sharded,
        every rank of ``dist`` calls it (and rank 0 prunes); else rank 0 alone."""
        path = self.root / f"iter-{iteration}"
        stamped = {**state, "iteration": iteration, "config_hash": self.fingerprint, "init_lora_hash": self.init_hash}
        if self.sharded:
            dist = dist if dist is not None else Distributed()
            save_sharded_state(path, live, stamped, dist)
            if not dist.is_main:
                return path
        else:
            save_training_state(path, live, stamped)
        prune_checkpoints(self.root, self.keep, same_run=self.owns)
        return path
