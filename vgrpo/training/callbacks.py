"""What a stage reports and who listens or steers (:func:`vgrpo.training.stage.run_stage` calls them): the events
and the steering hooks (:class:`StageCallbacks`), several callbacks at once (:class:`FanOut`) and the live progress
line (:class:`ProgressView`)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, TextIO

import numpy as np

from vgrpo.atomic import write_json_atomic
from vgrpo.progress_line import Progress
from vgrpo.training.control import StageControl

__all__ = ["FanOut", "ProgressView", "StageCallbacks", "callback_leaves"]


class StageCallbacks:
    """What a stage reports as it runs, and how it steers it (as transformers' ``TrainerCallback``); override what
    you need.

    The ``on_*`` events below report, on rank 0. The steering hooks (:meth:`on_stage_begin`, :meth:`on_iteration_end`,
    :meth:`on_verdict`, :meth:`on_stage_end`) are called on every rank, in the order the callbacks were given, with
    the stage's :class:`vgrpo.training.control.StageControl`; a stop set on rank 0 alone stops every rank. A
    callback with :meth:`state` has it saved in every checkpoint and given back by :meth:`load_state` when the stage
    resumes, so a resumed stage decides as an uninterrupted one (``docs/extending.md``: early stopping).
    """

    state_field: ClassVar[str | None] = None
    """The built-in participants' field of :class:`vgrpo.checkpoints.resume.TrainingState` (their state predates
    this API); anyone else's state is saved under its class's name."""

    def on_log(self, metrics: dict[str, float], iteration: int) -> None:
        """Each iteration's flat metrics: rewards, every sub-score, surrogate CV, ratio and clip statistics, KL,
        grad norm, seconds per phase."""

    def on_evaluate(self, table: dict[str, Any], images: np.ndarray, iteration: int) -> None:
        """Each evaluation table and its images."""

    def on_skip(self, event: dict[str, Any]) -> None:
        """An iteration skipped for a NaN or Inf (reward, advantage, surrogate, loss or gradient: which, how many,
        where)."""

    def on_checkpoint(self, path: Path, iteration: int) -> None:
        """A resumable checkpoint was written."""

    def on_hold(self, check: dict[str, Any], reference: dict[str, float]) -> None:
        """A hold check (:mod:`vgrpo.training.hold`): its iteration, values, whether it holds, what fell below its
        floor; ``reference`` the values held."""

    def on_kept(self, hold: dict[str, Any]) -> None:
        """A holding stage chose its export: ``hold`` as :attr:`StageResult.hold`."""

    # -- steering (every rank) --

    def on_stage_begin(self, start: int, control: StageControl) -> None:
        """The stage trains from iteration ``start`` (a resumed stage: its checkpoint's, after :meth:`load_state`):
        set ``control.should_stop`` when the state says the stage had stopped."""

    def on_iteration_end(self, done: int, control: StageControl) -> None:
        """``done`` iterations are trained (0: a fresh stage's start), nothing evaluated yet: ask for an evaluation
        (``should_evaluate``) or a checkpoint (``should_checkpoint``)."""

    def on_verdict(self, done: int, control: StageControl) -> None:
        """After the evaluation asked for (reported by :meth:`on_evaluate` first): ``should_stop`` to train no
        further (the stage then checkpoints, unless ``done`` is 0, and exports)."""

    def on_stage_end(self, done: int, control: StageControl) -> None:
        """Training ended after ``done`` iterations: choose the export (``control.export_from``)."""

    def state(self) -> Any:
        """What to save with every checkpoint (JSON-able; falsy: nothing)."""
        return {}

    def load_state(self, state: Any) -> None:
        """Take back what :meth:`state` saved in the checkpoint a stage resumes from."""


def callback_leaves(callbacks: StageCallbacks | None) -> list[StageCallbacks]:
    """The callbacks a :class:`FanOut` holds, nested ones included, in order: the stage's participants."""
    if callbacks is None:
        return []
    if isinstance(callbacks, FanOut):
        return [leaf for c in callbacks.callbacks for leaf in callback_leaves(c)]
    return [callbacks]


class FanOut(StageCallbacks):
    """Every report to each of ``callbacks`` in turn (a tracker and a progress view, a checkpoint upload); the stage
    steers through each of them itself (:func:`callback_leaves`)."""

    def __init__(self, *callbacks: StageCallbacks) -> None:
        self.callbacks = callbacks

    def on_log(self, metrics: dict[str, float], iteration: int) -> None:
        for c in self.callbacks:
            c.on_log(metrics, iteration)

    def on_evaluate(self, table: dict[str, Any], images: np.ndarray, iteration: int) -> None:
        for c in self.callbacks:
            c.on_evaluate(table, images, iteration)

    def on_skip(self, event: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_skip(event)

    def on_checkpoint(self, path: Path, iteration: int) -> None:
        for c in self.callbacks:
            c.on_checkpoint(path, iteration)

    def on_hold(self, check: dict[str, Any], reference: dict[str, float]) -> None:
        for c in self.callbacks:
            c.on_hold(check, reference)

    def on_kept(self, hold: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_kept(hold)


class ProgressView(StageCallbacks):
    """The stage's live progress as one line (:class:`vgrpo.progress_line.Progress`: stage k of n, iteration i of m,
    seconds per iteration, ETA, the last rewards); why an iteration was skipped is the stage's WARNING log.

    On a terminal the line is redrawn in place; elsewhere (a log file) a new line is written at most every
    ``every_s`` seconds and at the stage's last iteration, so a long stage leaves a few dozen lines. With
    ``state_file`` each update is also written there as JSON (atomically), for a watcher in another process
    (:mod:`flows.watch`).
    """

    def __init__(
        self,
        name: str,
        iterations: int,
        *,
        stage_index: int = 0,
        stages: int = 0,
        stream: TextIO | None = None,
        every_s: float = 30.0,
        state_file: Path | None = None,
    ) -> None:
        self.progress = Progress(name, iterations, stage_index=stage_index, stages=stages)
        self.stream, self.every_s, self.state_file = stream, every_s, state_file
        self._last_written = -math.inf

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def on_log(self, metrics: dict[str, float], iteration: int) -> None:
        skipped = bool(metrics.get("guard/skipped"))
        reward = None if skipped else metrics.get("reward/total_mean", float("nan"))
        self.progress.record(iteration, None if skipped else metrics.get("time/iteration_s"), reward)
        self.show()

    def show(self) -> None:
        """Draw (or, off a terminal, write when due) the current line, and update ``state_file``."""
        if self.state_file is not None:
            write_json_atomic(self.state_file, self.progress.to_json())
        out, now = self._out(), time.monotonic()
        last = self.progress.done >= self.progress.iterations
        if out.isatty():
            out.write("\r" + self.progress.line() + "\x1b[K" + ("\n" if last else ""))
        elif last or now - self._last_written >= self.every_s:
            out.write(self.progress.line() + "\n")
            self._last_written = now
        out.flush()

    def on_skip(self, event: dict[str, Any]) -> None:
        """Ends the line a terminal redraws in place, so that the stage's WARNING about the skip (the one line that
        says why, on the console at any verbosity) starts a line of its own."""
        out = self._out()
        if out.isatty():
            out.write("\n")
            out.flush()

    def _note(self, text: str) -> None:
        """A line of its own beside the progress line (which a terminal redraws in place)."""
        out = self._out()
        out.write(("\n" if out.isatty() else "") + text + "\n")
        out.flush()

    def on_hold(self, check: dict[str, Any], reference: dict[str, float]) -> None:
        values = ", ".join(f"{k} {v:.4g} (ref {reference[k]:.4g})" for k, v in check["values"].items())
        verdict = "holds" if check["holds"] else "BROKEN"
        self._note(f"{self.progress.stage} hold check at {check['iteration']}: {verdict}: {values}")

    def on_kept(self, hold: dict[str, Any]) -> None:
        self._note(f"{self.progress.stage}: exports iteration {hold['kept_iteration']}: {hold['reason']}")
