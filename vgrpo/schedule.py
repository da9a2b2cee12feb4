"""What the supervised training loops share (pretraining the base, training the world reward models): the
learning-rate schedule and the progress bar."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["one_cycle", "progress_bar"]


def one_cycle(step: int, total: int, warmup: int) -> float:
    """Linear warm-up then cosine decay to 0, as a multiplier of the peak learning rate."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def progress_bar(total: int, desc: str, initial: int = 0) -> Any:
    """A tqdm bar that redraws at most every 2 s (long CPU runs write logs, not animations)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, mininterval=2.0)
