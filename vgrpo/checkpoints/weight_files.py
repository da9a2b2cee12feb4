"""What a weights file, a model folder or a diffusers pipeline folder holds, checked without loading it: safetensors
headers parsed (a truncated or corrupt file is named with its path), torch checkpoints opened as zip archives and
never unpickled, configs parsed and never run. :mod:`vgrpo.training.preflight` runs these on every input of a run."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from safetensors import safe_open

from vgrpo.checkpoints.state import LORA_FILE
from vgrpo.models.folder import (
    INDEX_FILE,
    PipelineError,
    folder_family,
    is_pipeline_folder,
    read_config,
    read_index,
)
from vgrpo.models.registry import FAMILIES, UnknownFamilyError, family_for_pipeline, family_for_transformer

__all__ = [
    "PICKLE_SUFFIXES",
    "adapter_fit_problems",
    "adapter_problems",
    "family_problems",
    "folder_problems",
    "lora_target_problems",
    "pipeline_problems",
    "transformer_shapes",
    "weights_problem",
]

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
    try:
        index = read_index(path)
    except PipelineError as exc:
        return [str(exc)]
    index_file = path / INDEX_FILE
    cls = index.get("_class_name")
    try:
        required = family_for_pipeline(str(cls)).components
        out = []
    except UnknownFamilyError:
        required = ()
        known = sorted(f.pipeline_class for f in FAMILIES.values())
        out = [f"{index_file}: _class_name is {cls!r}, expected one of {known}"]
    named = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and v and v[0] is not None]
    null = [k for k in required if k not in named]
    out += [f"{index_file}: component {k!r} is missing or null" for k in null]
    missing = [k for k in named if not (path / k).is_dir()]
    if missing:
        out.append(f"{path}: " + "; ".join(f"component folder {k}/ is missing" for k in missing))
    for k in named:
        if k not in missing:
            out += folder_problems(path / k, safetensors_only=True)
    return out + family_problems(path, index)


def _config_class(folder: Path) -> str | None:
    """``_class_name`` of a diffusers model folder's ``config.json``; None without one (a scheduler's, a text encoder's
    from transformers) or when it does not read (:func:`folder_problems` names a bad file)."""
    config = read_config(folder)
    value = config.get("_class_name") if config is not None else None
    return value if isinstance(value, str) else None


def _family_of(transformer_class: str) -> str:
    try:
        return f" (the {family_for_transformer(transformer_class).name} family's)"
    except UnknownFamilyError:
        return ""


def family_problems(path: Path, index: dict[str, Any]) -> list[str]:
    """Whether a pipeline folder's components belong to the family of its pipeline class (``index``: its
    ``model_index.json``): the transformer ``model_index.json`` names and the one its ``config.json`` names are the
    family's transformer class, and each other diffusers model's ``config.json`` names the class ``model_index.json``
    gives it. diffusers builds each component as ``model_index.json`` says from whatever config the folder holds, so a
    mixed folder (a FLUX transformer in an SD3 folder) fails later, on a weight shape, without naming the folder."""
    try:
        entry = family_for_pipeline(str(index.get("_class_name")))
    except UnknownFamilyError:  # pipeline_problems names the class
        return []
    family = f"{entry.pipeline_class} (the {entry.name} family)"
    out = []
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or len(spec) != 2 or spec[0] != "diffusers":
            continue
        listed = str(spec[1])
        expected = entry.transformer_class if name == "transformer" else listed
        if listed != expected:
            out.append(
                f"{path / 'model_index.json'}: transformer is {listed}{_family_of(listed)}, but {family} "
                f"holds {expected}"
            )
        found = _config_class(path / name)
        if found is not None and found != expected:
            of = _family_of(found) if name == "transformer" else ""
            out.append(
                f"{path / name / 'config.json'}: _class_name is {found}{of}, but {family} takes {expected} as {name}"
            )
    return out


def adapter_problems(path: Path) -> list[str]:
    """A stage's starting weights: a LoRA directory (``save_lora``'s safetensors file), or after full fine-tuning
    a whole pipeline."""
    if is_pipeline_folder(path):  # a full fine-tune's output: a whole pipeline
        return pipeline_problems(path)
    if not path.is_dir():
        return [f"{path}: starting adapter directory not found"]
    problem = weights_problem(path / LORA_FILE)
    return [f"{path / LORA_FILE}: {problem} (not a LoRA directory written by save_lora?)"] if problem else []


def transformer_shapes(pipeline: Path) -> dict[str, list[int]] | None:
    """Tensor name -> shape of the pipeline's transformer, from its safetensors headers (no weight is read); None
    when a file does not open (:func:`pipeline_problems` names it)."""
    files = sorted((pipeline / "transformer").glob("*.safetensors"))
    if not files or any(weights_problem(f) for f in files):
        return None
    shapes: dict[str, list[int]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            shapes |= {name: list(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 -- not a dict
    return shapes


def _targets(module: str, target: str) -> bool:
    """Whether LoRA target name ``target`` selects layer ``module`` (peft's rule: the name, or its dotted tail)."""
    return module == target or module.endswith(f".{target}")


def _linear_layers(shapes: dict[str, list[int]]) -> dict[str, list[int]]:
    return {n.removesuffix(".weight"): s for n, s in shapes.items() if n.endswith(".weight") and len(s) == 2}


def lora_target_problems(targets: Sequence[str], shapes: dict[str, list[int]], pipeline: Path) -> list[str]:
    """``lora.target_modules`` entries that select no linear layer of the pipeline's transformer (``shapes``:
    :func:`transformer_shapes`)."""
    layers = _linear_layers(shapes)
    missing = [t for t in targets if not any(_targets(m, t) for m in layers)]
    if not missing:
        return []
    names = sorted({m.split(".attn.", 1)[1] for m in layers if ".attn." in m})
    entry = folder_family(pipeline)  # None: pipeline_problems names an unreadable index
    family = f"; the {entry.name} family's: {list(entry.lora_targets)}" if entry is not None else ""
    return [
        f"lora.target_modules: {missing} name no linear layer of {pipeline / 'transformer'} "
        f"(its attention layers: {names[:12]}{family})"
    ]


def _lora_header(file: Path) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """The shapes in a LoRA file and the peft settings in its metadata (``transformer.`` prefixes removed)."""
    with safe_open(str(file), framework="pt") as f:
        shapes = {name.removeprefix("transformer."): list(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
        metadata = f.metadata() or {}
    try:
        settings = json.loads(metadata.get("lora_adapter_metadata", "{}"))
    except ValueError:
        settings = {}
    return shapes, {k.removeprefix("transformer."): v for k, v in settings.items()} if isinstance(
        settings, dict
    ) else {}


def adapter_fit_problems(
    path: Path,
    *,
    shapes: dict[str, list[int]] | None,
    rank: int | None = None,
    alpha: int | None = None,
    targets: Sequence[str] | None = None,
) -> list[str]:
    """Whether the LoRA directory ``path`` (already found to open) is the adapter a stage builds or a merge
    expects: its rank and alpha, the layers it trains against ``lora.target_modules``, and each layer's shape
    against the pipeline's transformer (``shapes``); a check is skipped when its argument is None. Loading one
    that differs fails on a size mismatch or, for layers only one side names, silently starts them afresh."""
    file = path / LORA_FILE
    tensors, settings = _lora_header(file)
    layers: dict[str, dict[str, list[int]]] = {}
    for name, shape in tensors.items():
        for part in ("lora_A", "lora_B"):
            if f".{part}." in name:
                layers.setdefault(name.split(f".{part}.", 1)[0], {})[part] = shape
    if not layers:
        return [f"{file}: holds no LoRA layers (lora_A / lora_B weights)"]
    out = []
    ranks = sorted({s["lora_A"][0] for s in layers.values() if "lora_A" in s})
    if rank is not None and ranks != [rank]:
        out.append(f"{path}: an adapter of rank {', '.join(map(str, ranks))}, but lora.rank is {rank}")
    if alpha is not None and "lora_alpha" in settings and settings["lora_alpha"] != alpha:
        out.append(f"{path}: an adapter of alpha {settings['lora_alpha']}, but lora.alpha is {alpha}")
    if targets is not None:
        extra = sorted(m for m in layers if not any(_targets(m, t) for t in targets))
        if extra:
            out.append(f"{path}: trains layers that lora.target_modules {list(targets)} does not name: {extra[:3]}")
        unused = [t for t in targets if not any(_targets(m, t) for m in layers)]
        if unused:
            out.append(f"{path}: trains no layer of lora.target_modules {unused} (they would start afresh)")
    if shapes is not None:
        base = _linear_layers(shapes)
        unfit = []
        for module, pair in sorted(layers.items()):
            if "lora_A" not in pair or "lora_B" not in pair:
                unfit.append(f"{module} (lora_A or lora_B missing)")
            elif module not in base:
                unfit.append(f"{module} (no such layer)")
            elif [pair["lora_B"][0], pair["lora_A"][1]] != base[module]:
                unfit.append(f"{module} ({pair['lora_B'][0]} x {pair['lora_A'][1]}, the layer is {base[module]})")
        if unfit:
            out.append(f"{path}: does not fit the pipeline's transformer: {unfit[:3]}")
    return out
