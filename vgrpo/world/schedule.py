"""The learning-rate schedule the world's supervised training loops share (base pretraining, the world CLIP and
preference models)."""

from __future__ import annotations

import math

__all__ = ["one_cycle"]


def one_cycle(step: int, total: int, warmup: int) -> float:
    """Linear warm-up then cosine decay to 0, as a multiplier of the peak learning rate."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
