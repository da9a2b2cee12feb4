"""What a stage's participants decide (:class:`StageControl`, after transformers' ``TrainerControl``): whether the
stage evaluates, checkpoints or stops after an iteration, and which weights it exports.

:func:`vgrpo.training.stage.run_stage` owns one control for the whole stage. Participants
(:class:`vgrpo.training.callbacks.StageCallbacks`: the cadences of :mod:`vgrpo.training.participants`, the hold of
:mod:`vgrpo.training.holding`, a user's own) set its flags in their steering hooks; the loop acts on them and clears
the per-iteration ones (``should_evaluate``, ``should_checkpoint``) before the next iteration's verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["KeptExport", "StageControl"]


@dataclass(frozen=True)
class KeptExport:
    """Weights kept on disk that a stage exports instead of those in memory (a hold's kept check)."""

    iteration: int
    """The iteration the kept weights are of."""
    adapter: Path
    """Where they were written when they were kept."""
    reason: str
    """Why these, for the log (:func:`vgrpo.training.hold.kept_check`)."""


@dataclass
class StageControl:
    """The participants' verdict; every rank takes the same one (a stop decided on one rank is reduced over all)."""

    should_evaluate: bool = False
    """Evaluate the policy in memory now (the stage's evaluator; none without evaluation prompts)."""
    should_checkpoint: bool = False
    """Write a resumable checkpoint now (a stopping stage writes one too, so a rerun resumes stopped)."""
    should_stop: bool = False
    """Train no further; sticky: once set, the stage goes on to its export."""
    export_from: KeptExport | None = None
    """Export these kept weights instead of the weights in memory (set at the stage's end)."""

    def next_iteration(self) -> None:
        """Clear what applied to the iteration just judged."""
        self.should_evaluate = self.should_checkpoint = False
