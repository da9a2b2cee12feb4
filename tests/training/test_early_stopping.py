"""A user's participant through the public API (``Trainer(callbacks=[...])``): early stopping when a validation
reward stops improving, as ``docs/extending.md`` writes it. It stops a tiny stage, its state goes into the checkpoint
written at the stop, and a rerun resumes stopped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.tiny_world import tiny_stage_config, write_tiny_world
from vgrpo.evaluation.tables import flat_metrics
from vgrpo.trainer import Trainer
from vgrpo.training.callbacks import StageCallbacks
from vgrpo.training.control import StageControl


class EarlyStopping(StageCallbacks):
    """Stop once ``metric`` has not improved by ``min_delta`` for ``patience`` evaluations in a row."""

    def __init__(self, metric: str, patience: int, min_delta: float = 0.0) -> None:
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.best: float | None = None
        self.waited = 0

    def on_evaluate(self, table: dict[str, Any], images: np.ndarray, iteration: int) -> None:
        value = flat_metrics(table)[self.metric]
        if self.best is None or value > self.best + self.min_delta:
            self.best, self.waited = value, 0
        else:
            self.waited += 1

    def on_stage_begin(self, start: int, control: StageControl) -> None:
        control.should_stop = control.should_stop or self.waited >= self.patience  # resumed after it stopped

    def on_verdict(self, done: int, control: StageControl) -> None:
        control.should_stop = control.should_stop or self.waited >= self.patience

    def state(self) -> dict[str, Any]:
        return {"best": self.best, "waited": self.waited}

    def load_state(self, state: Any) -> None:
        self.best, self.waited = state["best"], state["waited"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("early"))


def _trainer(world: Path, stopping: EarlyStopping) -> Trainer:
    config = tiny_stage_config(iterations=4, eval_every=1, eval_at_start=True)
    return Trainer(config, work_dir=world / "run", pipeline=Path("base"), root=world, callbacks=[stopping])


def test_early_stopping_stops_a_stage_and_a_rerun_resumes_stopped(world: Path) -> None:
    # No evaluation improves on the start's by 10: the first one after it (iteration 1) uses up the patience.
    stopping = EarlyStopping("eval/geneval", patience=1, min_delta=10.0)
    result = _trainer(world, stopping).train(final_evaluation=False)
    assert len(result.history) == 1 and [e["iteration"] for e in result.evaluations] == [0, 1]
    assert sorted(p.name for p in (world / "run" / "checkpoints").iterdir()) == ["iter-1"]
    saved = json.loads((world / "run" / "checkpoints" / "iter-1" / "state.json").read_text())
    assert saved["callbacks"] == {"EarlyStopping": {"best": stopping.best, "waited": 1}}
    assert (world / "run" / "export").is_dir()

    rerun = _trainer(world, EarlyStopping("eval/geneval", patience=1, min_delta=10.0)).train(final_evaluation=False)
    assert rerun.resumed_from == 1 and len(rerun.history) == 1  # trains no further
