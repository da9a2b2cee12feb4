"""The image sizes a pipeline can sample, read from its folder's config files without loading a weight, so that a
resolution it cannot take is refused when a run's inputs are checked, not when the model first meets it.

A side must be a multiple of the VAE's downsampling times the transformer's patch (SD3, FLUX.1 and Z-Image: 8 x 2 =
16 px; diffusers' ``vae_scale_factor`` is ``2 ** (len(vae.block_out_channels) - 1)``), and SD3's position embedding
holds ``pos_embed_max_size`` patches a side (diffusers ``PatchEmbed``; the SD3 family's checkpoints hold 192 or
384). Each family's registry entry reads its patch, default side and bound from the transformer's config
(:attr:`vgrpo.models.registry.ModelFamily.geometry`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgrpo.models.registry import UnknownFamilyError, family_for_pipeline

__all__ = ["PipelineGeometry", "read_geometry"]


@dataclass(frozen=True)
class PipelineGeometry:
    """What a pipeline folder's configs say about its image side."""

    pipeline: Path
    vae_scale_factor: int
    patch_size: int
    default_resolution: int
    max_resolution: int | None
    frames_factor: int | None = None

    def frames_problem(self, num_frames: int | None, key: str) -> str | None:
        """Why the params entry ``key`` (frames per video; None = the default) cannot be sampled; None if it can:
        an image family's pipeline takes none, a video family's ``frames_factor * k + 1``."""
        if num_frames is None:
            return None
        if self.frames_factor is None:
            return f"{key}: {self.pipeline} samples images; num_frames is for video families (remove it)"
        if (num_frames - 1) % self.frames_factor:
            low = num_frames - (num_frames - 1) % self.frames_factor
            return (
                f"{key}: {num_frames} frames is not {self.frames_factor}k + 1 ({self.pipeline}: the VAE's "
                f"{self.frames_factor}x in time); nearest: {low} or {low + self.frames_factor}"
            )
        return None

    @property
    def step(self) -> int:
        """Pixels one latent patch covers a side: every resolution is a multiple of it."""
        return self.vae_scale_factor * self.patch_size

    def resolution_problem(self, resolution: int | None, key: str) -> str | None:
        """Why the params entry ``key`` (an image side in pixels; None = the default) cannot be sampled; None if it
        can."""
        side = self.default_resolution if resolution is None else resolution
        if side % self.step:
            return (
                f"{key}: {side} px is not a multiple of {self.step} ({self.pipeline}: the VAE's "
                f"{self.vae_scale_factor}x downsampling x the transformer's {self.patch_size} x {self.patch_size} "
                f"patches); nearest: {max(self.step, side - side % self.step)} or {side - side % self.step + self.step}"
            )
        if self.max_resolution is not None and side > self.max_resolution:
            return (
                f"{key}: {side} px is larger than {self.max_resolution} px, the most {self.pipeline}'s transformer "
                "samples (its position embedding's pos_embed_max_size)"
            )
        return None


def _config(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_geometry(pipeline: Path) -> PipelineGeometry | None:
    """The geometry of the diffusers pipeline folder ``pipeline``; None when its ``model_index.json``, transformer or
    VAE config cannot be read (the preflight's pipeline check names what is wrong there)."""
    index = _config(pipeline / "model_index.json")
    transformer = _config(pipeline / "transformer" / "config.json")
    vae = _config(pipeline / "vae" / "config.json")
    if index is None or transformer is None or vae is None:
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
