"""The image sizes a pipeline can sample, read from its folder's config files without loading a weight, so that a
resolution it cannot take is refused when a run's inputs are checked, not when the model first meets it.

A side must be a multiple of the VAE's downsampling times the transformer's patch (SD3, FLUX.1 and Z-Image: 8 x 2 =
16 px; diffusers' ``vae_scale_factor`` is ``2 ** (len(vae.block_out_channels) - 1)``), and SD3's position embedding
holds ``pos_embed_max_size`` patches a side (diffusers ``PatchEmbed``; the SD3 family's checkpoints hold 192 or
384). Each family's adapter class reads its patch, default side and bound from the transformer's and VAE's configs
(:meth:`vgrpo.models.adapter.PipelineAdapter.geometry`, returning a :class:`FamilyGeometry`), and
:func:`vgrpo.models.folder.read_geometry` a folder's :class:`PipelineGeometry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FamilyGeometry", "PipelineGeometry", "image_vae_scale"]


@dataclass(frozen=True)
class FamilyGeometry:
    """Image sides a pipeline folder can sample, from its configs: every side a multiple of
    ``vae_scale_factor * patch_size`` pixels, at most ``max_resolution`` (None = no table bounds it)."""

    vae_scale_factor: int
    patch_size: int
    default_resolution: int
    max_resolution: int | None
    frames_factor: int | None = None
    """A video family's temporal downsampling (frames are ``frames_factor * k + 1``); None for an image family."""


def image_vae_scale(vae: Mapping[str, Any]) -> int:
    """The spatial downsampling of diffusers' ``AutoencoderKL`` pipelines: ``2 ** (len(block_out_channels) - 1)``."""
    return int(2 ** (len(vae["block_out_channels"]) - 1))


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
