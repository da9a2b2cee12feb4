"""Loading a diffusers pipeline directory of a registered family, and the adapter and velocity model for it.

The same code loads a real SD3.5-Medium, FLUX.1 or Z-Image directory and the embedded default
(:mod:`vgrpo.models.embedded`). :func:`build_adapter` takes the family's :class:`vgrpo.models.adapter.PipelineAdapter`
(prompt conditioning, latent size, latent <-> image conversion) and velocity wrapper are the family's adapter class
and its ``velocity`` (:mod:`vgrpo.models.registry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import StableDiffusion3Pipeline
from torch import nn

from vgrpo.errors import ConfigError
from vgrpo.models.adapter import PipelineAdapter
from vgrpo.models.config import PrecisionConfig
from vgrpo.models.folder import INDEX_FILE, PipelineError, read_index
from vgrpo.models.registry import FAMILIES, UnknownFamilyError, family_for_pipeline, family_of
from vgrpo.models.saving import is_absent_t5

__all__ = [
    "PipelineError",
    "build_adapter",
    "load_pipeline",
    "load_sd3_pipeline",
    "place_pipeline",
]


def _check_pipeline_dir(path: Path, expected: Sequence[str] | None = None) -> dict[str, Any]:
    """``model_index.json`` of ``path`` after checking its class is one of ``expected`` (None: a family's) and its
    family's components exist."""
    index = read_index(path)
    index_file = path / INDEX_FILE
    cls = index.get("_class_name")
    try:
        entry = family_for_pipeline(str(cls))
    except UnknownFamilyError as exc:
        known = [f.pipeline_class for f in FAMILIES.values()] if expected is None else expected
        raise PipelineError(f"{index_file}: _class_name is {cls!r}, expected {' or '.join(known)}") from exc
    if expected is not None and cls not in expected:
        raise PipelineError(f"{index_file}: _class_name is {cls!r}, expected {' or '.join(expected)}")
    for name in entry.components:
        spec = index.get(name)
        if not spec or spec[0] is None:
            raise PipelineError(f"{index_file}: component {name!r} is missing or null")
        if not (path / name).is_dir():
            raise PipelineError(f"{path}: component folder {name}/ is missing")
    return index


def _component_dtypes(dtype: torch.dtype, frozen: torch.dtype | None) -> torch.dtype | dict[str, torch.dtype]:
    """diffusers' ``dtype`` argument: one dtype, or the transformer's and everything else's (``default``)."""
    return dtype if frozen is None or frozen == dtype else {"transformer": dtype, "default": frozen}


def load_pipeline(
    path: str | Path, *, dtype: torch.dtype = torch.float32, frozen_dtype: torch.dtype | None = None
) -> Any:
    """A pipeline of a registered family (:mod:`vgrpo.models.registry`) from a local directory (never the hub), by
    its ``model_index.json`` ``_class_name``.

    Args:
        dtype: the transformer's weights dtype.
        frozen_dtype: the text encoders' and VAE's, loaded so (not cast after loading: T5-XXL alone is 19 GB in
            float32); None = ``dtype``.

    Raises:
        PipelineError: naming the path and the missing component, or the unsupported class.
    """
    root = Path(path)
    index = _check_pipeline_dir(root)
    if index["_class_name"] == "StableDiffusion3Pipeline":
        return load_sd3_pipeline(root, dtype=dtype, frozen_dtype=frozen_dtype)

    pipeline_class = family_for_pipeline(index["_class_name"]).diffusers_pipeline()
    pipe = pipeline_class.from_pretrained(
        root, local_files_only=True, use_safetensors=True, dtype=_component_dtypes(dtype, frozen_dtype)
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def load_sd3_pipeline(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    frozen_dtype: torch.dtype | None = None,
    load_t5: bool = True,
) -> Any:
    """``StableDiffusion3Pipeline.from_pretrained`` from a local directory (never the hub).

    Args:
        path: a diffusers SD3 pipeline directory (SD3.5-M, or the embedded default).
        dtype: the transformer's weights dtype.
        frozen_dtype: the text encoders' and VAE's; None = ``dtype``.
        load_t5: load ``text_encoder_3`` when the directory has one; False skips it (zeros stand in for
            its tokens, as diffusers does for pipelines without T5). The all-zero stand-in that
            :func:`vgrpo.models.saving.save_pipeline` writes for a pipeline without T5 is never loaded.

    Raises:
        PipelineError: naming the path and the missing component.
    """

    root = Path(path)
    index = _check_pipeline_dir(root, ("StableDiffusion3Pipeline",))
    has_t5 = bool(index.get("text_encoder_3")) and index["text_encoder_3"][0] is not None
    has_t5 = has_t5 and not is_absent_t5(root / "text_encoder_3")
    extra: dict[str, Any] = {} if (has_t5 and load_t5) else {"text_encoder_3": None, "tokenizer_3": None}
    if has_t5 and load_t5 and not (root / "text_encoder_3").is_dir():
        raise PipelineError(f"{root}: component folder text_encoder_3/ is missing (or pass load_t5=False)")
    pipe = StableDiffusion3Pipeline.from_pretrained(
        root, local_files_only=True, use_safetensors=True, dtype=_component_dtypes(dtype, frozen_dtype), **extra
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def place_pipeline(pipe: Any, device: torch.device | str, *, text_encoders: str = "device") -> Any:
    """Move ``pipe``'s modules to ``device``, except its text encoders with ``text_encoders="cpu"`` (they stay
    on the CPU and encode there; ``device`` and ``drop_after_encoding`` put them on ``device``)."""
    for name, module in pipe.components.items():
        if isinstance(module, nn.Module):
            module.to("cpu" if text_encoders == "cpu" and name.startswith("text_encoder") else device)
    return pipe


def build_adapter(
    pipe: Any,
    *,
    resolution: int | None = None,
    precision: PrecisionConfig | None = None,
    num_frames: int | None = None,
) -> tuple[PipelineAdapter, nn.Module]:
    """The adapter and the velocity model (the policy, wrapping ``pipe.transformer`` itself, so LoRA added to
    the transformer before or after is trained) for a pipeline from :func:`load_pipeline`.

    Args:
        resolution: image side in pixels; None = the pipeline's default.
        precision: the prompt cache's budget and the text encoders' placement (None = the defaults).
        num_frames: frames per video of a video family (None = its default); an image family refuses it.

    Raises:
        ConfigError: ``num_frames`` for an image family.
    """

    precision = precision if precision is not None else PrecisionConfig()
    options: dict[str, Any] = {
        "resolution": resolution,
        "prompt_cache_bytes": int(precision.prompt_cache_mb * 2**20),
        "text_encoders": precision.text_encoders,
    }
    entry = family_of(pipe)
    if num_frames is not None:
        if not entry.video:
            raise ConfigError(f"rollout.num_frames is for video families; {entry.name!r} samples images: remove it")
        options["num_frames"] = num_frames
    return entry(pipe, **options), entry.velocity(pipe.transformer)
