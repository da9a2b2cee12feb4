"""The stage's built-in cadences (:class:`EvaluationCadence`, :class:`CheckpointCadence`, as transformers'
``DefaultFlowCallback``) and how every participant's state goes into a checkpoint and comes back
(:func:`checkpoint_states`, :func:`restore_states`). The skip guard is :class:`vgrpo.training.guards.SkipGuard`, the
hold :class:`vgrpo.training.holding.HoldCheck`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vgrpo.checkpoints.resume import TrainingState
from vgrpo.config import StageConfig
from vgrpo.training.callbacks import StageCallbacks
from vgrpo.training.control import StageControl

__all__ = ["CheckpointCadence", "EvaluationCadence", "checkpoint_states", "restore_states"]


class EvaluationCadence(StageCallbacks):
    """Evaluate every ``eval_every`` iterations (and at a fresh start with ``eval_at_start``); the last iteration's
    evaluation is the stage's final one, after its export."""

    def __init__(self, config: StageConfig) -> None:
        self.config = config

    def on_iteration_end(self, done: int, control: StageControl) -> None:
        every = self.config.eval_every
        if done == 0:
            control.should_evaluate = bool(every and self.config.eval_at_start)
        else:
            control.should_evaluate = bool(every and done % every == 0 and done < self.config.iterations)


class CheckpointCadence(StageCallbacks):
    """Checkpoint every ``checkpoint_every`` iterations and after the last (a stop checkpoints too:
    :func:`vgrpo.training.stage.run_stage`)."""

    def __init__(self, config: StageConfig) -> None:
        self.config = config

    def on_iteration_end(self, done: int, control: StageControl) -> None:
        every, last = self.config.checkpoint_every, self.config.iterations
        control.should_checkpoint = done > 0 and (done % every == 0 or done == last)


def checkpoint_states(participants: Sequence[StageCallbacks]) -> dict[str, Any]:
    """The :class:`TrainingState` fields holding the participants' states: a built-in's in its own field, the others'
    under ``callbacks`` by class name (absent when none has state, so such checkpoints are as before)."""
    fields: dict[str, Any] = {}
    named: dict[str, Any] = {}
    for participant in participants:
        state = participant.state()
        if participant.state_field is not None:
            fields[participant.state_field] = state
        elif state:
            name = type(participant).__name__
            if name in named:
                raise ValueError(f"two stage callbacks named {name} have state: a checkpoint tells them apart by name")
            named[name] = state
    return fields | ({"callbacks": named} if named else {})


def restore_states(participants: Sequence[StageCallbacks], resumed: TrainingState) -> None:
    """Give each participant back its state from the checkpoint a stage resumes from."""
    for participant in participants:
        if participant.state_field is not None:
            participant.load_state(getattr(resumed, participant.state_field))
        elif type(participant).__name__ in resumed.callbacks:
            participant.load_state(resumed.callbacks[type(participant).__name__])
