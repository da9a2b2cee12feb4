"""Freshly rendered (prompt, image) batches from the procedural world, for pretraining."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vgrpo.world.prompts import Pair, sample_metadata, scene_for
from vgrpo.world.render import render

__all__ = ["images_to_tensor", "tensor_to_images", "world_batch"]


def world_batch(
    rng: np.random.Generator, batch_size: int, tags: Sequence[str], allowed: list[Pair], resolution: int
) -> tuple[list[str], np.ndarray]:
    """``batch_size`` new prompts (tags drawn uniformly) with ground-truth renders ``(B, H, W, 3)`` uint8."""
    prompts, images = [], []
    for _ in range(batch_size):
        md = sample_metadata(rng, tags[int(rng.integers(len(tags)))], allowed)
        prompts.append(md["prompt"])
        images.append(render(scene_for(md, rng, allowed), resolution))
    return prompts, np.stack(images)


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(B, H, W, 3)`` -> float ``(B, 3, H, W)`` in [-1, 1] (the VAE's input range)."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def tensor_to_images(x: torch.Tensor) -> np.ndarray:
    """Inverse of :func:`images_to_tensor`, rounding and clamping to uint8."""
    x = ((x.detach().float().clamp(-1, 1) + 1) * 127.5).round()
    return x.permute(0, 2, 3, 1).to(torch.uint8).cpu().numpy()
