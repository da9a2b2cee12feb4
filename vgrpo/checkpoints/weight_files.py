"""What a weights file, a model folder or a diffusers pipeline folder holds, checked without loading it: safetensors
headers parsed (a truncated or corrupt file is named with its path), torch checkpoints opened as zip archives and
never unpickled, configs parsed and never run. :mod:`vgrpo.training.preflight` runs these on every input of a run."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from safetensors import safe_open

from vgrpo.checkpoints.state import LORA_FILE
from vgrpo.models.pipeline import PIPELINE_COMPONENTS

__all__ = ["PICKLE_SUFFIXES", "adapter_problems", "folder_problems", "pipeline_problems", "weights_problem"]

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
"""torch.save files: checked as zip archives, never unpickled."""


def _torch_archive_problem(path: Path) -> str | None:
    with path.open("rb") as f:
        head = f.read(2)
    if head == b"PK":  # torch.save's zip format: its directory is at the end, so a truncated file does not open
        with zipfile.ZipFile(path) as archive:
            if not any(name.endswith("data.pkl") for name in archive.namelist()):
                return "a zip archive without data.pkl, not a torch checkpoint"
        return None
    if head[:1] == b"\x80":  # torch's legacy format, a bare pickle stream: nothing to check without unpickling it
        return None
    return "neither a torch zip archive nor a pickle stream"


def weights_problem(path: Path) -> str | None:
    """What is wrong with one weights (or model config) file, read without unpickling or running anything; None
    when it opens."""
    if not path.is_file():
        return "not found"
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt"):  # parses the header and checks it covers the file exactly
                pass
        elif path.name.endswith(".safetensors.index.json"):
            shards = sorted(set(json.loads(path.read_text(encoding="utf-8"))["weight_map"].values()))
            missing = [s for s in shards if not (path.parent / s).is_file()]
            if missing:
                return f"names shards that are missing: {missing}"
        elif path.suffix in PICKLE_SUFFIXES:
            return _torch_archive_problem(path)
        elif path.suffix == ".py":
            compile(path.read_text(encoding="utf-8"), str(path), "exec")  # an mmdet config: syntax only, never run
        elif path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
    except Exception as exc:  # each reader raises its own type (SafetensorError, BadZipFile, SyntaxError, ...)
        return f"does not open ({type(exc).__name__}: {exc})"
    return None


def _is_weights(path: Path) -> bool:
    return path.suffix in (".safetensors", *PICKLE_SUFFIXES) or path.name.endswith(".safetensors.index.json")


def folder_problems(folder: Path, *, safetensors_only: bool) -> list[str]:
    """Every weights file under ``folder`` that does not open (:func:`weights_problem`), and a folder without
    weights; with ``safetensors_only`` (what the pipeline loader reads), pickle weights without safetensors."""
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and _is_weights(p)]
    readable = [p for p in files if p.suffix == ".safetensors" or p.suffix == ".json" or not safetensors_only]
    if files and not readable:
        return [f"{folder}: holds only pickle weights ({files[0].name}); the loader reads safetensors"]
    if not files and not safetensors_only:
        return [f"{folder}: holds no weights file (*.safetensors)"]
    return [f"{p}: {problem}" for p in readable if (problem := weights_problem(p))]


def pipeline_problems(path: Path) -> list[str]:
    """A diffusers pipeline directory: ``model_index.json``, its class, a folder for every component it names, and
    every component's safetensors files."""
    if not path.is_dir():
        return [f"{path}: pipeline directory not found"]
    index_file = path / "model_index.json"
    if not index_file.is_file():
        return [f"{path}: no model_index.json (not a diffusers pipeline directory)"]
    try:
        index: dict[str, Any] = json.loads(index_file.read_text(encoding="utf-8"))
    except ValueError as exc:
        return [f"{index_file}: not valid JSON: {exc}"]
    cls = index.get("_class_name")
    out = (
        []
        if cls in PIPELINE_COMPONENTS
        else [f"{index_file}: _class_name is {cls!r}, expected one of {sorted(PIPELINE_COMPONENTS)}"]
    )
    named = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and v and v[0] is not None]
    null = [k for k in PIPELINE_COMPONENTS.get(str(cls), ()) if k not in named]
    out += [f"{index_file}: component {k!r} is missing or null" for k in null]
    missing = [k for k in named if not (path / k).is_dir()]
    if missing:
        out.append(f"{path}: " + "; ".join(f"component folder {k}/ is missing" for k in missing))
    for k in named:
        if k not in missing:
            out += folder_problems(path / k, safetensors_only=True)
    return out


def adapter_problems(path: Path) -> list[str]:
    """A stage's starting weights: a LoRA directory (``save_lora``'s safetensors file), or after full fine-tuning
    a whole pipeline."""
    if (path / "model_index.json").is_file():  # a full fine-tune's output: a whole pipeline
        return pipeline_problems(path)
    if not path.is_dir():
        return [f"{path}: starting adapter directory not found"]
    problem = weights_problem(path / LORA_FILE)
    return [f"{path / LORA_FILE}: {problem} (not a LoRA directory written by save_lora?)"] if problem else []
