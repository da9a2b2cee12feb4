"""The progress bar of long CPU jobs (pretraining, reward-model training, curriculum stages)."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

__all__ = ["progress_bar"]


def progress_bar(total: int, desc: str, initial: int = 0) -> Any:
    """A tqdm bar that redraws at most every 2 s (long CPU runs write logs, not animations)."""

    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, mininterval=2.0)
