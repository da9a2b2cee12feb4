"""A diffusers pipeline folder read without loading a weight: its ``model_index.json`` (the one reader of it: the
loader, the geometry, the weight-file checks and the preflight all come here) and its components' ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vgrpo.errors import UserError
from vgrpo.models.config import LoraConfig
from vgrpo.models.geometry import PipelineGeometry
from vgrpo.models.registry import UnknownFamilyError, family_for_pipeline

if TYPE_CHECKING:
    from vgrpo.models.registry import Family

__all__ = [
    "INDEX_FILE",
    "PipelineError",
    "folder_family",
    "folder_lora_targets",
    "is_pipeline_folder",
    "read_config",
    "read_geometry",
    "read_index",
]

INDEX_FILE = "model_index.json"
"""What makes a folder a diffusers pipeline: its class and its components."""


class PipelineError(UserError, ValueError):
    """A pipeline directory is missing or incomplete; the message names the path and the component."""


def is_pipeline_folder(path: Path) -> bool:
    """Whether ``path`` holds a ``model_index.json`` (a whole pipeline, not a LoRA directory)."""
    return (path / INDEX_FILE).is_file()


def read_index(path: Path) -> dict[str, Any]:
    """``path``'s ``model_index.json``.

    Raises:
        PipelineError: the folder or its index is missing, or the index is not a JSON object.
    """
    if not path.is_dir():
        raise PipelineError(f"{path}: pipeline directory not found")
    index_file = path / INDEX_FILE
    if not index_file.is_file():
        raise PipelineError(f"{path}: no {INDEX_FILE} (not a diffusers pipeline directory)")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise PipelineError(f"{index_file}: not valid JSON: {exc}") from exc
    if not isinstance(index, dict):
        raise PipelineError(f"{index_file}: not valid JSON: a {type(index).__name__}, not an object")
    return index


def read_config(component: Path) -> dict[str, Any] | None:
    """A component folder's ``config.json``; None without one, or when it does not read as a JSON object (the
    weight-file checks name a bad file)."""
    try:
        data = json.loads((component / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_family(path: Path) -> Family | None:
    """The family of the pipeline folder ``path`` (by its index's ``_class_name``); None when the index does not
    read or names no family (the preflight's pipeline check says which)."""
    try:
        return family_for_pipeline(str(read_index(path).get("_class_name")))
    except (PipelineError, OSError, UnknownFamilyError):
        return None


def folder_lora_targets(lora: LoraConfig, path: Path) -> tuple[str, ...]:
    """The module names ``lora`` adapts on the pipeline folder ``path``: :meth:`LoraConfig.targets` of its family
    (``lora.target_modules`` as given when the folder names no family)."""
    entry = folder_family(path)
    return lora.target_modules if entry is None else lora.targets(entry.lora_targets)


def read_geometry(pipeline: Path) -> PipelineGeometry | None:
    """The geometry of the diffusers pipeline folder ``pipeline``; None when its ``model_index.json``, transformer or
    VAE config cannot be read (the preflight's pipeline check names what is wrong there)."""
    try:
        index = read_index(pipeline)
    except (PipelineError, OSError):
        return None
    transformer = read_config(pipeline / "transformer")
    vae = read_config(pipeline / "vae")
    if transformer is None or vae is None:
        return None
    try:
        sides = family_for_pipeline(str(index.get("_class_name"))).geometry(transformer, vae)
        return PipelineGeometry(
            pipeline,
            sides.vae_scale_factor,
            sides.patch_size,
            sides.default_resolution,
            sides.max_resolution,
            sides.frames_factor,
        )
    except (KeyError, TypeError, ValueError, IndexError, UnknownFamilyError):
        return None
