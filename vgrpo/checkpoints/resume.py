"""Resuming a stage: what a checkpoint keeps (:class:`TrainingState`), which checkpoints belong to a run, the newest
one that loads whole, saving and pruning.

A run is identified by its training fingerprint (:func:`training_hash`: every param that decides the steps,
not the evaluation settings) and the content hash of its starting adapter (a previous stage re-run with other
params rewrites its adapter at the same path). Sharded over processes, rank 0 picks the checkpoint and every
rank loads the same one. Under ``distributed.strategy: fsdp`` the checkpoints are sharded
(:mod:`vgrpo.checkpoints.sharded`): every rank writes and reads its own shards.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

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
from vgrpo.logs import get_logger
from vgrpo.parallel.distributed import Distributed

__all__ = ["EVALUATION_FIELDS", "ResumableRun", "TrainingState", "adapter_hash", "training_hash"]

logger = get_logger(__name__)

EVALUATION_FIELDS = frozenset({"eval_prompts", "evaluation", "eval_every", "eval_at_start"})
"""Stage fields that decide what is measured, never what is trained: left out of the training fingerprint, so a
changed evaluation setting re-evaluates without retraining."""


def adapter_hash(lora_dir: Path) -> str:
    """SHA-256 (16 hex digits) of a LoRA directory's weights file, or of a whole pipeline's weights files (names and
    bytes; a full fine-tune's previous stage): the identity of a stage's starting weights."""
    if (lora_dir / LORA_FILE).is_file():
        return hashlib.sha256((lora_dir / LORA_FILE).read_bytes()).hexdigest()[:16]
    h = hashlib.sha256()
    for file in sorted(lora_dir.rglob("*.safetensors")):
        h.update(file.relative_to(lora_dir).as_posix().encode() + b"\0" + file.read_bytes())
    return h.hexdigest()[:16]


def training_hash(config: BaseModel) -> str:
    """Fingerprint of everything that decides the stage's steps (a checkpoint from other params is not resumed)."""
    # ``launch`` says how many processes share the batch, not which steps it takes: a checkpoint resumes on
    # another number of processes (tests/parallel/test_distributed.py).
    trained = config.model_dump(mode="json", exclude={*EVALUATION_FIELDS, "launch"})
    return hashlib.sha256(json.dumps(trained, sort_keys=True).encode()).hexdigest()[:16]


_REQUIRED: Any = object()
_JSON_TYPES = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _field(data: Mapping[str, Any], name: str, kind: type, default: Any = _REQUIRED) -> Any:
    """``data[name]``, checked to be exactly a ``kind`` (a JSON ``true`` is no integer, though Python's bool is an
    int); ``default`` when the key is absent, an error when there is none."""
    if name not in data:
        if default is _REQUIRED:
            raise ValueError(f"no field {name!r}")
        return default
    value = data[name]
    if type(value) is not kind:
        raise ValueError(f"field {name!r} is {_json_type(value)}, expected {_JSON_TYPES[kind]}")
    return value


def _records(data: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> tuple[dict[str, Any], ...]:
    """``data[name]`` as a list of JSON objects (history rows, evaluation tables, skip events)."""
    records = _field(data, name, list, default)
    for i, record in enumerate(records):
        if type(record) is not dict:
            raise ValueError(f"field {name!r}[{i}] is {_json_type(record)}, expected an object")
    return tuple(records)


@dataclass(frozen=True)
class TrainingState:
    """What a stage keeps in a checkpoint's ``state.json`` besides the tensors and the run's identity (which
    :class:`ResumableRun` stamps and checks): how far it got, what it measured and skipped on the way, and the
    caller's run state."""

    iteration: int
    """Iterations done: a resumed stage continues with this one."""
    init_lora: str
    """The starting adapter's path as the stage was given it, ``str()``-ed (``"None"`` without one); for a reader
    of the checkpoint, since the run is identified by the adapter's content (:func:`adapter_hash`)."""
    history: tuple[dict[str, float], ...]
    """One row of metrics per iteration done."""
    evaluations: tuple[dict[str, Any], ...]
    """Every evaluation table so far."""
    skipped: tuple[dict[str, Any], ...] = ()
    """One event per iteration skipped for a non-finite value (:mod:`vgrpo.training.guards`)."""
    consecutive_skips: int = 0
    """How many of the last iterations were skipped in a row (the count ``max_consecutive_skips`` bounds)."""
    run: Mapping[str, Any] = field(default_factory=dict)
    """JSON-able values the caller keeps with every checkpoint (a tracker's run id, to continue that run)."""
    hold: Mapping[str, Any] = field(default_factory=dict)
    """A holding stage's checks so far and their reference (:mod:`vgrpo.training.hold`); empty without ``hold``."""
    callbacks: Mapping[str, Any] = field(default_factory=dict)
    """The state of each stage callback that keeps one, by class name (:meth:`StageCallbacks.state`)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object :meth:`from_json` reads back."""
        return {
            "iteration": self.iteration,
            "init_lora": self.init_lora,
            "history": list(self.history),
            "evaluations": list(self.evaluations),
            "skipped": list(self.skipped),
            "consecutive_skips": self.consecutive_skips,
            "run": dict(self.run),
        } | (
            ({"hold": dict(self.hold)} if self.hold else {})  # a stage without hold writes what it wrote before
            | ({"callbacks": dict(self.callbacks)} if self.callbacks else {})
        )

    @classmethod
    def from_json(cls, data: Any) -> TrainingState:
        """The state in a decoded ``state.json`` (keys of the run's identity are left to :class:`ResumableRun`);
        a missing field or one of the wrong JSON type raises ``ValueError`` naming it. ``skipped``,
        ``consecutive_skips``, ``run``, ``hold`` and ``callbacks`` may be absent: checkpoints written before the stage
        kept them lack them."""
        if type(data) is not dict:
            raise ValueError(f"is {_json_type(data)}, expected an object")
        return cls(
            iteration=_field(data, "iteration", int),
            init_lora=_field(data, "init_lora", str),
            history=_records(data, "history"),
            evaluations=_records(data, "evaluations"),
            skipped=_records(data, "skipped", []),
            consecutive_skips=_field(data, "consecutive_skips", int, 0),
            run=_field(data, "run", dict, {}),
            hold=_field(data, "hold", dict, {}),
            callbacks=_field(data, "callbacks", dict, {}),
        )


def _read_state(checkpoint: Path) -> TrainingState:
    """The :class:`TrainingState` of a checkpoint directory; an unreadable ``state.json``, or one that lacks a field
    or holds a wrong type, raises :class:`CheckpointError` naming the file and the field."""
    file = checkpoint / "state.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: unreadable ({type(exc).__name__}: {exc})") from exc
    try:
        return TrainingState.from_json(data)
    except ValueError as exc:
        raise CheckpointError(f"{file}: {exc}") from exc


def _warn_set_aside(set_aside: list[str], resumed: tuple[Path, int] | None) -> None:
    """One WARNING per checkpoint set aside as corrupt (``set_aside``: what was wrong and where it was moved), saying
    what the stage resumes from instead: the iterations after it are lost and trained again, which the user must
    be told even at ``vgrpo train -q``."""
    if resumed is None:
        outcome = "the stage starts over from iteration 0 (no older checkpoint of this run loads)"
    else:
        outcome = f"the stage resumes from the older checkpoint {resumed[0]} (iteration {resumed[1]})"
    for what in set_aside:
        logger.warning("corrupt checkpoint set aside: %s; %s", what, outcome)


class ResumableRun:
    """The checkpoints of one run under ``root``: ``iter-N`` directories whose ``state.json`` carries the run's
    fingerprint and starting adapter hash; others (other params) are left alone. ``sharded``: every rank writes
    and reads its shards (:mod:`vgrpo.checkpoints.sharded`), else rank 0 writes whole tensors."""

    def __init__(self, root: Path, fingerprint: str, init_hash: str | None, keep: int, *, sharded: bool = False):
        self.root, self.fingerprint, self.init_hash, self.keep = root, fingerprint, init_hash, keep
        self.sharded = sharded

    def owns(self, checkpoint: Path) -> bool:
        try:
            state = json.loads((checkpoint / "state.json").read_text())
        except (OSError, ValueError):
            return True  # unreadable: let loading report it and set it aside
        if not isinstance(state, dict):
            return True  # not a state at all: likewise
        return bool(state.get("config_hash") == self.fingerprint and state.get("init_lora_hash") == self.init_hash)

    def owned(self) -> list[Path]:
        """This run's checkpoints, newest first."""
        return [c for c in checkpoints(self.root) if self.owns(c)]

    def newest(self) -> Path | None:
        return next(iter(self.owned()), None)

    def peek(self) -> TrainingState | None:
        """The state of this run's newest checkpoint whose ``state.json`` reads whole, without loading weights
        (``None`` when there is none): what a tracker reads to continue the run it logged to."""
        for checkpoint in self.owned():
            try:
                return _read_state(checkpoint)
            except CheckpointError:
                continue  # restore() sets it aside
        return None

    def _load(self, checkpoint: Path, live: Checkpointed, dist: Distributed) -> TrainingState:
        """Restore ``checkpoint`` into ``live``; its ``state.json`` is checked before any tensor is touched."""
        state = _read_state(checkpoint)
        if self.sharded:
            load_sharded_state(checkpoint, live, dist)
        else:
            load_training_state(checkpoint, live)
        return state

    def restore(self, live: Checkpointed, dist: Distributed) -> TrainingState | None:
        """Load the newest checkpoint of this run that loads whole (rank 0 chooses, setting corrupt ones aside:
        unreadable or mismatched tensors, a ``state.json`` that lacks a field); the other ranks load what it chose.
        Returns its state, or ``None`` to start from iteration 0. Each checkpoint set aside is logged as a WARNING
        naming the file, what was wrong, where it was moved and what the stage resumes from instead."""
        set_aside: list[str] = []  # rank 0's
        if self.sharded:  # every rank loads its shards, trying the checkpoints rank 0 lists in turn
            listed = self.owned() if dist.is_main else None
            for candidate in dist.broadcast_object(listed):
                try:
                    state = self._load(candidate, live, dist)
                except CheckpointError as exc:  # raised on every rank alike
                    if dist.is_main:
                        set_aside.append(f"{exc}; moved to {quarantine(candidate)}")
                    dist.barrier()
                    continue
                _warn_set_aside(set_aside, (candidate, state.iteration))
                return state
            _warn_set_aside(set_aside, None)
            return None
        found: tuple[Path, TrainingState] | None = None
        if dist.is_main:
            for candidate in self.owned():
                try:
                    found = candidate, self._load(candidate, live, dist)
                    break
                except CheckpointError as exc:
                    set_aside.append(f"{exc}; moved to {quarantine(candidate)}")
            _warn_set_aside(set_aside, None if found is None else (found[0], found[1].iteration))
        path = dist.broadcast_object(None if found is None else found[0])
        if path is None:
            return None
        if found is not None:
            return found[1]
        return self._load(path, live, dist)

    def save(self, state: TrainingState, live: Checkpointed, dist: Distributed | None = None) -> Path:
        """Write ``iter-<state.iteration>`` (atomically, stamped with this run's identity) and prune older ones.
        Sharded, every rank of ``dist`` calls it (and rank 0 prunes); else rank 0 alone."""
        path = self.root / f"iter-{state.iteration}"
        stamped = {**state.to_json(), "config_hash": self.fingerprint, "init_lora_hash": self.init_hash}
        if self.sharded:
            dist = dist if dist is not None else Distributed()
            save_sharded_state(path, live, stamped, dist)
            if not dist.is_main:
                return path
        else:
            save_training_state(path, live, stamped)
        prune_checkpoints(self.root, self.keep, same_run=self.owns)
        return path
