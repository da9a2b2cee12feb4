"""Numerical guards: a non-finite reward, advantage, surrogate, loss or gradient stops the update, not the run.

:func:`vgrpo.training.iteration.train_iteration` checks each quantity before it can reach the weights and raises
:class:`NonFiniteError` naming it; the stage loop (:func:`vgrpo.training.stage.run_stage`) skips that iteration (no
optimizer step is applied after the check fails), records the event and stops with :class:`TrainingDiverged`
after ``max_consecutive_skips`` bad iterations in a row, leaving its last checkpoint as it was.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vgrpo.errors import NonFiniteError  # defined below the training loop: rewards subclass it

__all__ = ["NonFiniteError", "TrainingDiverged", "check_finite", "nonfinite_summary"]


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


def check_finite(quantity: str, values: Tensor, **context: Any) -> None:
    """Raise :class:`NonFiniteError` if ``values`` has a NaN or Inf."""
    if not bool(torch.isfinite(values.detach()).all()):
        raise NonFiniteError(quantity, {**nonfinite_summary(values), **context})
