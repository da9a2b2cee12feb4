"""The one-line progress view of a training stage (stage k of n, iteration i of m, seconds per iteration, ETA, the
last rewards); the tqdm bar of pretraining and reward-model training is :mod:`vgrpo.progress_bar`.

The view is plain arithmetic and text (:class:`Progress`, :func:`seconds_per_iteration`, :func:`format_duration`),
so the stage loop (:class:`vgrpo.training.stage.ProgressView`), the curriculum's watcher (:mod:`flows.watch`) and
tests share one rendering. Nothing here imports torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Progress", "format_duration", "seconds_per_iteration"]

RATE_WINDOW = 5
"""Iterations the rate (and so the ETA) is the median of: the newest ones, so a slow first iteration (warm-up,
caches) stops counting once five others have run."""


def seconds_per_iteration(times: Sequence[float], window: int = RATE_WINDOW) -> float | None:
    """The median of the last ``window`` iteration times (``None`` before the first)."""
    recent = [t for t in times[-window:] if math.isfinite(t)]
    return statistics.median(recent) if recent else None


def format_duration(seconds: float | None) -> str:
    """``45s``, ``3m05s``, ``1h02m``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


@dataclass
class Progress:
    """Where a stage stands: ``done`` of ``iterations`` run, the seconds each of this start's iterations took and
    their rewards (``None`` for a skipped iteration).

    Attributes:
        stage: the stage's name.
        iterations: the stage's iterations.
        done: iterations finished (resumed ones included).
        stage_index: its 1-based position in a curriculum (0: not in one).
        stages: the curriculum's number of stages (0: not in one).
        times: seconds of each iteration run by this start.
        rewards: mean reward of each iteration run by this start.
        phase: what runs now when it is not an iteration (``evaluating``, ``exporting``, ``loading``).
    """

    stage: str
    iterations: int
    done: int = 0
    stage_index: int = 0
    stages: int = 0
    times: list[float] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    phase: str = ""

    def record(self, iteration: int, seconds: float | None, reward: float | None) -> None:
        """Iteration ``iteration`` (0-based) finished in ``seconds`` with mean ``reward``."""
        self.done = iteration + 1
        if seconds is not None:
            self.times.append(seconds)
        self.rewards.append(reward)
        self.phase = ""

    @property
    def rate(self) -> float | None:
        """Seconds per iteration (:func:`seconds_per_iteration`)."""
        return seconds_per_iteration(self.times)

    @property
    def eta_s(self) -> float | None:
        """Seconds until the stage's last iteration ends at the current rate."""
        rate = self.rate
        return None if rate is None else rate * max(self.iterations - self.done, 0)

    def line(self, last: int = 3) -> str:
        """One line: ``stage 2/5 s2-geneval | iteration 12/40 | 4.1 s/it | ETA 1m55s | reward 0.532 0.541``."""
        where = f"stage {self.stage_index}/{self.stages} {self.stage}" if self.stages else self.stage
        parts = [where, f"iteration {self.done}/{self.iterations}"]
        rate = self.rate
        if rate is not None:
            parts += [f"{rate:.1f} s/it", f"ETA {format_duration(self.eta_s)}"]
        shown = [("skipped" if r is None else f"{r:.3f}") for r in self.rewards[-last:]]
        if shown:
            parts.append("reward " + " ".join(shown))
        if self.phase:
            parts.append(self.phase)
        return " | ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "iterations": self.iterations,
            "done": self.done,
            "stage_index": self.stage_index,
            "stages": self.stages,
            "times": self.times[-2 * RATE_WINDOW :],
            "rewards": self.rewards[-2 * RATE_WINDOW :],
            "phase": self.phase,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Progress:
        return cls(**data)
