"""Numerical guards: a non-finite reward, advantage, surrogate, loss or gradient stops the update, not the run.

:func:`vgrpo.training.iteration.train_iteration` checks each quantity before it can reach the weights and raises
:class:`NonFiniteError` naming it; the stage's :class:`SkipGuard` skips that iteration (no optimizer step is applied
after the check fails), records the event and stops with :class:`TrainingDiverged` after ``max_consecutive_skips``
bad iterations in a row, leaving its last checkpoint as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vgrpo.algorithms.base import Payload
from vgrpo.errors import NonFiniteError  # defined below the training loop: rewards subclass it
from vgrpo.logs import get_logger
from vgrpo.parallel.distributed import Distributed
from vgrpo.training.callbacks import StageCallbacks
from vgrpo.training.stage_result import StageResult, skipped_summary

__all__ = ["NonFiniteError", "SkipGuard", "TrainingDiverged", "check_finite", "check_prepared", "nonfinite_summary"]

logger = get_logger("vgrpo.training.stage")  # the stage's console line, whichever module words it


class TrainingDiverged(RuntimeError):
    """Too many consecutive iterations were skipped for non-finite values; the message names the quantities,
    the iterations and the last checkpoint, which is left intact."""


def nonfinite_summary(values: Tensor) -> dict[str, Any]:
    """Count, first sample indices (along dim 0) and kinds of the non-finite entries of ``values``."""
    bad = ~torch.isfinite(values.detach())
    rows = bad.reshape(bad.shape[0], -1).any(dim=1) if values.ndim > 1 else bad
    return {
        "count": int(bad.sum().item()),
        "of": int(values.numel()),
        "nan": int(torch.isnan(values.detach()).sum().item()),
        "indices": torch.nonzero(rows).flatten()[:16].tolist(),
    }


def check_prepared(payload: Payload, dist: Distributed) -> None:
    """Non-finite floating-point tensors among the payload ``prepare`` computed (old surrogates, old x-predictions,
    old velocities, reward weights). Each rank holds its own samples', so the verdict is reduced: every rank skips,
    or none does."""
    bad = {k: v for k, v in payload.tensors().items() if v.is_floating_point() and not bool(torch.isfinite(v).all())}
    if dist.any(bool(bad)):
        name = next(iter(bad), "prepared batch")
        details = nonfinite_summary(bad[name]) if bad else {"on": "another rank"}
        raise NonFiniteError(name, {**details, "rank": dist.rank})


def check_finite(quantity: str, values: Tensor, **context: Any) -> None:
    """Raise :class:`NonFiniteError` if ``values`` has a NaN or Inf."""
    if not bool(torch.isfinite(values.detach()).all()):
        raise NonFiniteError(quantity, {**nonfinite_summary(values), **context})


class SkipGuard(StageCallbacks):
    """The stage's record of each iteration's outcome: an iteration that met a non-finite value is skipped (its event
    in ``result.skipped``, a WARNING on the console), and ``limit`` skips in a row raise :class:`TrainingDiverged`.
    Its state, the skips in a row, is a checkpoint's ``consecutive_skips``."""

    state_field = "consecutive_skips"

    def __init__(
        self,
        stage: str,
        limit: int,
        result: StageResult,
        report: StageCallbacks,
        is_main: bool,
        newest: Callable[[], Path | None],
    ) -> None:
        self.stage, self.limit, self.result, self.report, self.is_main = stage, limit, result, report, is_main
        self.newest = newest  # the last checkpoint, named when the stage gives up
        self.consecutive = 0

    def state(self) -> int:
        return self.consecutive

    def load_state(self, state: Any) -> None:
        self.consecutive = int(state)

    def passed(self, metrics: dict[str, float], iteration: int, seconds: float) -> None:
        """An iteration that updated the weights: its metrics, logged."""
        self.consecutive = 0
        metrics = {**metrics, "guard/skipped": 0.0, "time/iteration_s": seconds}
        self.result.history.append(metrics)
        if self.is_main:
            self.report.on_log(metrics, iteration)

    def skipped(self, exc: NonFiniteError, iteration: int) -> None:
        """An iteration that applied no update: its event recorded and reported; :class:`TrainingDiverged` after
        ``limit`` in a row."""
        self.consecutive += 1
        event = {
            "iteration": iteration,
            "quantity": exc.quantity,
            "reward_errors": [],
            **exc.details,
            "consecutive": self.consecutive,
        }
        self.result.skipped.append(event)
        metrics = {
            "iteration": float(iteration),
            "guard/skipped": 1.0,
            "guard/consecutive_skips": float(self.consecutive),
        }
        self.result.history.append(metrics)
        if self.is_main:
            self.report.on_log(metrics, iteration)
            self.report.on_skip(event)
            logger.warning(  # on the console at any verbosity: these iterations train nothing
                "stage %s, iteration %d skipped (no update applied): non-finite %s, %s of %s values; "
                "%d in a row of max_consecutive_skips %d",
                self.stage,
                iteration,
                exc.quantity,
                event.get("count", "?"),
                event.get("of", "?"),
                self.consecutive,
                self.limit,
            )
        if self.consecutive >= self.limit:
            recent = self.result.skipped[-self.consecutive :]
            raise TrainingDiverged(
                f"stage {self.stage}: {self.consecutive} consecutive iterations skipped for non-finite values "
                f"({skipped_summary(recent)}); the last checkpoint, {self.newest() or 'none yet'}, is "
                "intact. Lower optim.lr, check the rewards, or raise max_consecutive_skips."
            ) from exc
