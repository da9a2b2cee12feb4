"""Checkpoints: resumable training state and LoRA weights in diffusers' format, safetensors only.

A training checkpoint is a directory written atomically (:func:`vgrpo.atomic.atomic_dir`):

* ``trainable.safetensors`` -- every trainable parameter of the transformer by name (the LoRA adapter, or
  all weights for full fine-tuning);
* ``optimizer.safetensors`` + ``optimizer.json`` -- the optimizer's tensors and its scalar state;
* ``snapshots.safetensors`` -- the algorithm's extra weight copies (:meth:`Algorithm.snapshots`);
* ``state.json`` -- the iteration, history and anything else the caller keeps, written last.

Nothing is unpickled when loading. Under FSDP every rank writes its own shards instead
(:mod:`vgrpo.checkpoints.sharded`). LoRA exports (:func:`save_lora`) are what
``StableDiffusion3Pipeline.load_lora_weights(dir)`` (or ``FluxPipeline``'s, for a FLUX transformer) reads in a
plain diffusers script.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from torch import nn

from vgrpo.atomic import atomic_dir
from vgrpo.errors import UserError
from vgrpo.models.registry import FAMILIES, UnknownFamilyError, family_for_transformer
from vgrpo.models.saving import save_pipeline
from vgrpo.policy import ParameterSnapshot

__all__ = [
    "MAX_LORA_SCALE",
    "PEFT_CONFIG_FILE",
    "PEFT_WEIGHTS_FILE",
    "CheckpointError",
    "Checkpointed",
    "canonicalize_safetensors_header",
    "checkpoints",
    "export_merged_pipeline",
    "latest_checkpoint",
    "load_lora_into",
    "load_training_state",
    "lora_scale_problem",
    "prune_checkpoints",
    "quarantine",
    "save_lora",
    "save_training_state",
]

LORA_FILE = "pytorch_lora_weights.safetensors"
PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
"""The same adapter in PEFT's format, beside :data:`LORA_FILE`: ``PeftModel.from_pretrained(transformer, dir)``."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is incomplete or does not fit the model; the message names the directory."""


def _trainable(module: nn.Module) -> dict[str, nn.Parameter]:
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


@dataclass(frozen=True)
class Checkpointed:
    """What a training checkpoint saves and restores in place: the module's trainable parameters, the optimizer's
    state and the snapshots (the algorithm's weight copies and the policy EMA)."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    snapshots: Mapping[str, ParameterSnapshot]


def save_training_state(path: Path, live: Checkpointed, state: Mapping[str, Any]) -> None:
    """Write a resumable checkpoint directory at ``path`` atomically (module docstring): ``live``'s tensors and
    ``state``."""

    module, optimizer, snapshots = live.module, live.optimizer, live.snapshots

    def write(tmp: Path) -> None:
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in _trainable(module).items()}, tmp / "trainable.safetensors"
        )
        opt = optimizer.state_dict()
        tensors: dict[str, torch.Tensor] = {}
        scalars: dict[str, Any] = {"param_groups": opt["param_groups"], "state": {}}
        for pid, pstate in opt["state"].items():
            for key, value in pstate.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"{pid}/{key}"] = value.detach().contiguous().cpu()
                else:
                    scalars["state"].setdefault(str(pid), {})[key] = value
        save_file(tensors, tmp / "optimizer.safetensors")
        (tmp / "optimizer.json").write_text(json.dumps(scalars))
        snap = {f"{name}/{i}": v.contiguous().cpu() for name, s in snapshots.items() for i, v in enumerate(s.values)}
        save_file(snap, tmp / "snapshots.safetensors")
        (tmp / "state.json").write_text(json.dumps(dict(state), indent=2, sort_keys=True))

    atomic_dir(path, write)


def _read(path: Path, name: str, reader: Callable[[Path], Any]) -> Any:
    try:
        return reader(path / name)
    except Exception as exc:  # safetensors and json raise their own types for a truncated or garbled file
        raise CheckpointError(f"{path / name}: unreadable ({type(exc).__name__}: {exc})") from exc


def load_training_state(path: Path, live: Checkpointed) -> dict[str, Any]:
    """Restore a :func:`save_training_state` directory into ``live``'s module, optimizer and snapshots; returns its
    ``state``.

    Every file is read and checked against the model before anything is changed, so a corrupt checkpoint
    raises :class:`CheckpointError` (naming the file) and leaves the model, optimizer and snapshots as they were.
    """

    module, optimizer, snapshots = live.module, live.optimizer, live.snapshots
    names = ("trainable.safetensors", "optimizer.safetensors", "optimizer.json", "snapshots.safetensors", "state.json")
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {missing}")
    weights = _read(path, "trainable.safetensors", load_file)
    tensors = _read(path, "optimizer.safetensors", load_file)
    scalars = _read(path, "optimizer.json", lambda f: json.loads(f.read_text()))
    snap = _read(path, "snapshots.safetensors", load_file)
    state: dict[str, Any] = _read(path, "state.json", lambda f: json.loads(f.read_text()))
    params = _trainable(module)
    if set(weights) != set(params):
        diff = sorted(set(weights) ^ set(params))[:5]
        raise CheckpointError(f"{path}: trainable parameters do not match the model (e.g. {diff})")
    bad_shape = [n for n, p in params.items() if tuple(weights[n].shape) != tuple(p.shape)]
    if bad_shape:
        raise CheckpointError(f"{path}: trainable parameter shapes do not match the model (e.g. {bad_shape[:3]})")
    for name, s in snapshots.items():
        for i in range(len(s.values)):
            if f"{name}/{i}" not in snap:
                raise CheckpointError(f"{path}: snapshot {name}/{i!r} missing")
    opt_state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        pid, _, name = key.partition("/")
        opt_state.setdefault(int(pid), {})[name] = value
    for pid, values in scalars["state"].items():
        opt_state.setdefault(int(pid), {}).update(values)
    try:
        optimizer.load_state_dict({"state": opt_state, "param_groups": scalars["param_groups"]})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{path / 'optimizer.json'}: does not fit the optimizer ({exc})") from exc
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name].to(p.dtype))
        for name, s in snapshots.items():
            for i in range(len(s.values)):
                s.values[i].copy_(snap[f"{name}/{i}"])
    return state


def checkpoints(root: Path, prefix: str = "iter-") -> list[Path]:
    """Complete checkpoint directories under ``root``, newest (highest iteration) first; temporary and
    quarantined directories (names starting with ``.``) are not listed."""
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(prefix) and (p / "state.json").is_file()]
    return sorted(done, key=lambda p: int(p.name[len(prefix) :]), reverse=True)


def latest_checkpoint(root: Path, prefix: str = "iter-", accept: Callable[[Path], bool] | None = None) -> Path | None:
    """The complete checkpoint with the highest iteration under ``root`` that ``accept`` (default: any) accepts;
    temporary directories are ignored."""
    for path in checkpoints(root, prefix):
        if accept is None or accept(path):
            return path
    return None


def quarantine(path: Path) -> Path:
    """Rename a checkpoint that failed to load to ``.corrupt-<name>`` beside it (kept for inspection, never
    listed again); returns the new path."""
    target = path.with_name(f".corrupt-{path.name}")
    shutil.rmtree(target, ignore_errors=True)
    path.rename(target)
    return target


def prune_checkpoints(root: Path, keep: int, *, same_run: Callable[[Path], bool], prefix: str = "iter-") -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints that ``same_run`` accepts, and temporary directories left
    by killed writers; checkpoints of other runs (other params) are left alone. Returns what was deleted."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    removed = [p for p in checkpoints(root, prefix) if same_run(p)][keep:]
    if root.is_dir():
        hidden = [p for p in root.iterdir() if p.name.startswith(f".{prefix}")]  # atomic_dir's .NAME.tmp-PID
        leftovers = [p for p in hidden if ".tmp-" in p.name or ".old-" in p.name]
        removed += [p for p in leftovers if p.name.rsplit("-", 1)[-1] != str(os.getpid())]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def canonicalize_safetensors_header(path: Path) -> None:
    """Rewrite a safetensors file's JSON header with sorted keys, in place.

    safetensors writes ``__metadata__`` from a Rust hash map, whose order changes from process to process, so the
    same weights and metadata give different bytes; stage outputs are identified by their content hash. The data
    offsets in the header are relative to the end of the header, so only the header changes."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the 8-byte alignment safetensors itself pads to
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + size :])


def save_lora(transformer: nn.Module, out_dir: Path) -> None:
    """The transformer's LoRA adapter, atomically, in diffusers' format (``pytorch_lora_weights.safetensors``,
    written by the ``save_lora_weights`` of its family's pipeline class, the family found by the transformer's class:
    :func:`vgrpo.models.registry.family_for_transformer`) and beside it in PEFT's
    (``adapter_config.json`` + ``adapter_model.safetensors``, what ``PeftModel.save_pretrained`` writes), so
    ``pipe.load_lora_weights(out_dir)`` and ``PeftModel.from_pretrained(transformer, out_dir)`` both load it."""

    kind = type(transformer).__name__
    try:
        pipeline_class = family_for_transformer(kind).diffusers_pipeline()
    except UnknownFamilyError:
        supported = dict.fromkeys(f.transformer_class for f in FAMILIES.values())
        raise CheckpointError(f"no LoRA export for a {kind}; supported: {', '.join(supported)}") from None

    layers = get_peft_model_state_dict(transformer)
    if not layers:
        raise CheckpointError("the transformer has no LoRA adapter to save")

    # The adapter's rank and alpha travel in the file's metadata: without them diffusers loads with alpha = rank.
    peft_config = getattr(transformer, "peft_config", {}).get("default")
    metadata = peft_config.to_dict() if peft_config is not None else None
    if metadata is not None:  # peft keeps target_modules as a set: sort it, or the file's bytes vary by process
        metadata = {k: sorted(v) if isinstance(v, set) else v for k, v in metadata.items()}

    def write(tmp: Path) -> None:
        pipeline_class.save_lora_weights(
            tmp, transformer_lora_layers=layers, safe_serialization=True, transformer_lora_adapter_metadata=metadata
        )
        canonicalize_safetensors_header(tmp / LORA_FILE)
        if peft_config is not None:
            _write_peft_adapter(tmp, peft_config, layers)

    atomic_dir(out_dir, write)


def _write_peft_adapter(directory: Path, peft_config: Any, layers: Mapping[str, torch.Tensor]) -> None:
    """PEFT's files for ``layers`` (:func:`peft.utils.get_peft_model_state_dict`'s keys): its config, and the weights
    under ``base_model.model.``, the prefix ``PeftModel.save_pretrained`` writes and ``from_pretrained`` expects."""
    config = peft_config.to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}  # sets: bytes vary by process
    (directory / PEFT_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = {f"base_model.model.{name}": t.detach().contiguous() for name, t in layers.items()}
    save_file(weights, str(directory / PEFT_WEIGHTS_FILE), metadata={"format": "pt"})
    canonicalize_safetensors_header(directory / PEFT_WEIGHTS_FILE)


def load_lora_into(transformer: nn.Module, lora_dir: Path) -> None:
    """Load a :func:`save_lora` directory into the transformer's existing (trainable) LoRA adapter, so a stage
    continues training the previous stage's adapter."""

    file = lora_dir / LORA_FILE
    if not file.is_file():
        raise CheckpointError(f"{lora_dir}: no {LORA_FILE} (not a LoRA directory written by save_lora)")
    state = {k.removeprefix("transformer."): v for k, v in load_file(file).items()}
    result = set_peft_model_state_dict(transformer, state)
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora" in k]
    if unexpected:
        raise CheckpointError(f"{lora_dir}: LoRA weights do not fit the adapter (e.g. {unexpected[:3]})")


MAX_LORA_SCALE = 16.0
"""Largest ``|lora_scale|`` a merge takes: 1 is the adapter as trained, 0 the base, a negative scale subtracts it;
beyond a few the merged weights leave the range the model was trained in."""


def lora_scale_problem(lora_scale: float) -> str | None:
    """Why ``lora_scale`` is no LoRA scale to merge at: not a finite number, or beyond :data:`MAX_LORA_SCALE`."""
    if not isinstance(lora_scale, (int, float)) or isinstance(lora_scale, bool) or not math.isfinite(lora_scale):
        return f"LoRA scale {lora_scale!r}: not a finite number"
    if abs(lora_scale) > MAX_LORA_SCALE:
        return f"LoRA scale {lora_scale}: |scale| is at most {MAX_LORA_SCALE:g} (1 = the adapter as trained)"
    return None


def export_merged_pipeline(pipe: Any, lora_dir: Path, out_dir: Path, *, lora_scale: float = 1.0) -> None:
    """Merge a :func:`save_lora` adapter into ``pipe``'s transformer and write the whole pipeline to ``out_dir``
    (:func:`vgrpo.models.saving.save_pipeline`: ``save_pretrained``, safetensors, atomically): a plain diffusers
    pipeline with no LoRA left that ``from_pretrained`` loads without arguments, for serving or for the next run's
    base. ``pipe`` is changed in place.

    Uses the pipeline's own LoRA loader (``load_lora_weights`` -> ``fuse_lora`` -> ``unload_lora_weights``), so
    it is the merge a diffusers user would do by hand. The merged weights are checked to be finite before anything
    is written, so a NaN in the adapter (or an overflow) never reaches ``out_dir``.

    Raises:
        CheckpointError: a scale that is not finite or beyond :data:`MAX_LORA_SCALE`, a folder without the LoRA
            file, or merged weights with NaN or Inf (naming the first tensors).
    """
    problem = lora_scale_problem(lora_scale)
    if problem:
        raise CheckpointError(problem)
    if not (lora_dir / LORA_FILE).is_file():
        raise CheckpointError(f"{lora_dir}: no {LORA_FILE} (not a LoRA directory written by save_lora)")
    pipe.load_lora_weights(lora_dir)
    pipe.fuse_lora(lora_scale=lora_scale)
    pipe.unload_lora_weights()  # drops the (now fused) adapter layers; the merged weights stay
    bad = [name for name, tensor in pipe.transformer.state_dict().items() if not bool(torch.isfinite(tensor).all())]
    if bad:
        raise CheckpointError(
            f"{lora_dir} merged at scale {lora_scale:g} gives non-finite weights in {len(bad)} tensors "
            f"(first: {bad[:3]}); nothing was written"
        )
    save_pipeline(pipe, out_dir)
