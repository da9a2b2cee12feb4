"""Freshly rendered (prompt, image) batches from the procedural world, for pretraining."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vgrpo.world.prompts import Pair, sample_metadata, scene_for
from vgrpo.world.render import render

__all__ = ["world_batch"]


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
