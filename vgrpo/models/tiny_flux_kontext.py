"""A tiny randomly initialised ``FluxKontextPipeline`` built from config (no hub), for tests of the FLUX.1-Kontext
family (:mod:`vgrpo.models.flux_kontext`); its own module because :mod:`vgrpo.models.tiny` is near the project's
350-line limit.

Kontext is FLUX.1-dev's architecture with a second image in the transformer's sequence: no component differs in
kind, so the tiny Kontext pipeline holds :func:`vgrpo.models.tiny.tiny_flux_pipeline`'s components (16 px images,
a 2x VAE to ``(4, 8, 8)`` latents, a guidance-embedding transformer, CLIP + T5 text encoders). Its random weights do
not edit anything; what the tests check is that the project feeds them as ``FluxKontextPipeline`` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.models.tiny import tiny_flux_pipeline

__all__ = ["tiny_flux_kontext_pipeline", "write_condition_image"]


def tiny_flux_kontext_pipeline(seed: int = 0, *, corpus: Iterable[str] | None = None) -> Any:
    """A ``FluxKontextPipeline`` over :func:`vgrpo.models.tiny.tiny_flux_pipeline`'s components (same ``seed``, and
    ``corpus`` when given); ``save_pretrained`` + ``FluxKontextPipeline.from_pretrained`` round-trip it."""
    from diffusers import FluxKontextPipeline

    flux = tiny_flux_pipeline(seed) if corpus is None else tiny_flux_pipeline(seed, corpus=corpus)
    return FluxKontextPipeline(**flux.components)


def write_condition_image(path: Path, seed: int, size: int = 16) -> Path:
    """A random RGB PNG of ``size x size`` pixels at ``path`` (a condition image for tests), from ``seed``."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path
