"""What a stage leaves (:class:`StageResult`) and how it fails on a reward (:class:`StageRewardFailed`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgrpo.rewards.base import NonFiniteRewardError, RewardFailed

__all__ = ["StageResult", "StageRewardFailed", "nonfinite_failure", "skipped_summary"]


@dataclass
class StageResult:
    """What a finished stage leaves: the exported weights and what was measured on the way."""

    out_dir: Path
    iterations: int
    history: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """One event per iteration skipped for a non-finite quantity (:mod:`vgrpo.training.guards`)."""
    hold: dict[str, Any] | None = None
    """With ``hold``: ``reference`` (the values held), ``tolerances``, ``checks`` (each check's iteration, values,
    ``holds`` and ``failed``), ``kept_iteration`` (the exported weights' iteration), ``reason`` and ``stopped_at``
    (the iteration the stage stopped early at, or ``None``)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds this start spent on each part of the stage (rank 0's clock): ``setup_s`` (prompts, model loading,
    restoring a checkpoint), ``iterations_s`` (every iteration run, skipped ones included), ``evaluation_s``
    (in-stage and final evaluations), ``checkpoint_s`` and ``export_s``."""


class StageRewardFailed(RewardFailed):
    """A reward failed while a stage scored an iteration's rollouts or evaluated (:class:`RewardFailed`): the one-line
    message adds the stage, the iteration and the last checkpoint, which is left intact and which the stage resumes
    from when rerun (nothing is written after the failure).

    Attributes:
        stage: the stage's name.
        iteration: the iteration that was being scored (0-based, as the progress lines count), or the iteration an
            evaluation was of.
        evaluation: whether the stage was evaluating.
        checkpoint: the newest checkpoint of the run, ``None`` when none was written yet.
    """

    def __init__(
        self, failed: RewardFailed, *, stage: str, iteration: int, evaluation: bool, checkpoint: Path | None
    ) -> None:
        self.stage, self.iteration, self.evaluation, self.checkpoint = stage, iteration, evaluation, checkpoint
        super().__init__(failed.reward, failed.problem, failed.source)

    def describe(self) -> str:
        where = f"evaluation at iteration {self.iteration}" if self.evaluation else f"iteration {self.iteration}"
        resume = (
            f"the last checkpoint, {self.checkpoint}, is intact and the stage resumes from it when rerun"
            if self.checkpoint is not None
            else "no checkpoint was written yet: a rerun starts the stage over"
        )
        return f"stage {self.stage}, {where}: {super().describe()}; {resume}"


def nonfinite_failure(exc: NonFiniteRewardError) -> RewardFailed:
    """A non-finite score where no iteration can be skipped (an evaluation), as a :class:`RewardFailed`."""
    details = exc.details
    return RewardFailed(
        exc.quantity.removeprefix("reward/"),
        f"returned {details.get('count', '?')} non-finite scores of {details.get('of', '?')} "
        f"(images {details.get('indices', [])[:10]}), expected finite numbers",
    )


def skipped_summary(events: list[dict[str, Any]]) -> str:
    """``QUANTITY at iterations [..]: C of N non-finite each`` per quantity of skip ``events``."""
    parts = []
    for quantity in sorted({e["quantity"] for e in events}):
        mine = [e for e in events if e["quantity"] == quantity]
        counts = [f"{e.get('count', '?')} of {e.get('of', '?')}" for e in mine]
        if len(set(counts)) == 1:
            told = f"{counts[0]} non-finite" + (" each" if len(counts) > 1 else "")
        else:
            told = f"{', '.join(counts)} non-finite"
        parts.append(f"{quantity} at iterations {[e['iteration'] for e in mine]}: {told}")
    return "; ".join(parts)
