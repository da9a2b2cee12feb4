"""Rewards of a user's module that misbehave at run time (tests/training/test_reward_failures.py names them in a
stage's ``rewards:`` as ``tests.rewards.misbehaving:FUNCTION``): each one a way a reward goes wrong while scoring."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vgrpo.rewards.base import Metadata, TransientRewardError


def _brightness(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1).mean(axis=1) / 255.0


def raises(images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> np.ndarray:
    """A bug of the user's: divides by the number of images it was told to skip."""
    skipped = 0
    return _brightness(images) / (len(images) // skipped)  # RAISES HERE


def wrong_count(images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> np.ndarray:
    """One score too few."""
    return _brightness(images)[:-1]


def strings(images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> list[str]:
    """Verdicts as words, not numbers."""
    return ["good" if b > 0.5 else "bad" for b in _brightness(images)]


def nothing(images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> None:
    """Forgets to return its scores."""
    _brightness(images)


def nan_scores(images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> np.ndarray:
    """NaN for every image."""
    return np.full(len(images), np.nan)


def broken_while_flagged(
    images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None, flag: str = ""
) -> np.ndarray:
    """Brightness, but raises while the file ``flag`` exists (a server down, a bug fixed later)."""
    if flag and Path(flag).exists():
        raise RuntimeError(f"broken while {Path(flag).name} exists")  # FLAGGED HERE
    return _brightness(images)


def unreachable(images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> np.ndarray:
    """A reward behind a server that could not be reached after its retries."""
    raise TransientRewardError(  # UNREACHABLE HERE
        "POST http://127.0.0.1:9/score failed after 3 attempt(s); last: ConnectionError"
    )
