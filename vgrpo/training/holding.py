"""A holding stage's runtime (:mod:`vgrpo.training.hold` holds its config and pure bookkeeping): the participant that
runs the checks and chooses the export (:class:`HoldCheck`), the evaluator of the checks, the base model's check and
the export of the kept checkpoint."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.algorithms.base import zero_lora_deltas
from vgrpo.atomic import atomic_dir
from vgrpo.config import StageConfig
from vgrpo.evaluation.evaluator import Evaluator
from vgrpo.evaluation.tables import flat_metrics
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import ParameterSnapshot, trainable_parameters
from vgrpo.training.callbacks import StageCallbacks
from vgrpo.training.control import KeptExport, StageControl
from vgrpo.training.hold import HOLD_DIR, check_holds, held_values, kept_check
from vgrpo.training.phases import StagePolicy, evaluate, export
from vgrpo.training.prompt_rows import checked_rows
from vgrpo.training.stage_evaluator import build_evaluator
from vgrpo.training.stage_result import StageResult

__all__ = ["HoldCheck", "evaluate_base", "export_kept", "hold_evaluator"]

Runner = Callable[..., Any]
"""A :class:`vgrpo.training.stage.PhaseRunner`: ``runner(phase, iteration, fn, *args)``."""


class HoldCheck(StageCallbacks):
    """A holding stage's participant: it checks the held rewards at the start and every ``hold.every`` iterations
    (and after the last), keeps each check's adapter, stops the stage after ``hold.stop_after`` failed checks in a
    row, and chooses the export (the last check that holds). Its state, the checks so far and their reference, is
    a checkpoint's ``hold``."""

    state_field = "hold"

    def __init__(
        self,
        config: StageConfig,
        work_dir: Path,
        stage: StagePolicy,
        checker: Evaluator,
        evaluating: Runner,
        phases: Runner,
        report: StageCallbacks,
        result: StageResult,
    ) -> None:
        assert config.hold is not None
        self.config, self.hold, self.dir = config, config.hold, work_dir / HOLD_DIR
        self.stage, self.checker, self.report, self.result = stage, checker, report, result
        self.evaluating, self.phases = evaluating, phases  # evaluating: a reward's failure names the stage
        self.reference: dict[str, float] | None = None
        self.checks: list[dict[str, Any]] = []

    def state(self) -> dict[str, Any]:
        return {"reference": self.reference, "checks": self.checks}

    def load_state(self, state: Any) -> None:
        reference = state.get("reference")
        self.reference = dict(reference) if reference is not None else None
        self.checks = [dict(c) for c in state.get("checks", [])]

    def on_stage_begin(self, start: int, control: StageControl) -> None:
        control.should_stop = control.should_stop or self.stopped()  # a stage resumed after its hold stopped it

    def on_verdict(self, done: int, control: StageControl) -> None:
        if done == 0 or done % self.hold.every == 0 or done == self.config.iterations:
            self.check(done)
            control.should_stop = control.should_stop or self.stopped()

    def on_stage_end(self, done: int, control: StageControl) -> None:
        self.result.hold = self.summary()
        kept, reason = self.result.hold["kept_iteration"], self.result.hold["reason"]
        control.export_from = KeptExport(kept, self.snapshot(kept), reason)

    def check(self, iteration: int) -> None:
        """Evaluate the held rewards (the base's first, once, with ``reference: base``), keep the adapter, report."""
        hold, names = self.hold, list(self.hold.rewards)
        if self.reference is None and hold.reference == "base":
            table, _ = self.evaluating("hold-base", iteration, evaluate_base, self.stage, self.checker)
            self.reference = held_values(flat_metrics(table), list(table["rewards"]), names)
        table, _ = self.evaluating("hold", iteration, evaluate, self.stage, self.checker, iteration)
        values = held_values(flat_metrics(table), list(table["rewards"]), names)
        if self.reference is None:  # reference: stage_start, the check at iteration 0
            self.reference = values
        check = check_holds(iteration, values, self.reference, hold.rewards)
        self.phases("hold-snapshot", iteration, export, self.stage, self.config, self.snapshot(iteration))
        self.checks.append(check)
        self.report.on_hold(check, dict(self.reference))

    def snapshot(self, iteration: int) -> Path:
        return self.dir / f"iter-{iteration:05d}"

    def failing(self) -> int:
        """Checks in a row, the newest last, that do not hold."""
        count = 0
        for check in reversed(self.checks):
            if check["holds"]:
                break
            count += 1
        return count

    def stopped(self) -> bool:
        return self.hold.stop_after is not None and self.failing() >= self.hold.stop_after

    def summary(self) -> dict[str, Any]:
        """What :attr:`vgrpo.training.stage_result.StageResult.hold` reports."""
        assert self.reference is not None
        kept, reason = kept_check(self.checks)
        last = int(self.checks[-1]["iteration"])
        return {
            "reference_kind": self.hold.reference,
            "reference": dict(self.reference),
            "tolerances": dict(self.hold.rewards),
            "checks": list(self.checks),
            "kept_iteration": kept,
            "reason": reason,
            "stopped_at": last if self.stopped() and last < self.config.iterations else None,
        }


def hold_evaluator(config: StageConfig, root: Path, shift: float | None, dist: Distributed) -> Evaluator:
    """The evaluator of the hold checks: the stage's evaluation rewards and sampling, on the first
    ``hold.max_prompts`` rows of ``hold.prompts`` x ``hold.group_size`` with ``hold.seed``, no grid."""
    hold = config.hold
    assert hold is not None
    evaluation = config.evaluation.model_copy(
        update={
            "max_prompts": hold.max_prompts,
            "group_size": hold.group_size,
            "seed": hold.seed,
            "grid_prompts": 0,
        }
    )
    rows = checked_rows(root / hold.prompts, evaluation.rewards)[: hold.max_prompts]
    checking = config.model_copy(update={"evaluation": evaluation})
    evaluator = build_evaluator(checking, rows, root, shift, dist)
    if evaluator is None:
        raise ValueError(f"hold.prompts: {hold.prompts} holds no prompt")
    return evaluator


def evaluate_base(stage: StagePolicy, evaluator: Evaluator) -> tuple[dict[str, Any], np.ndarray]:
    """The hold evaluation of the base model: the policy with its LoRA's deltas zeroed."""
    base = ParameterSnapshot(trainable_parameters(stage.policy))
    zero_lora_deltas(base, stage.policy)
    with base.swapped_in():
        return evaluator(stage.adapter, stage.policy, 0)


def export_kept(snapshot: Path, out_dir: Path) -> Path:
    """The kept check's adapter (written by the export phase when it was checked) copied to ``out_dir``
    atomically."""

    def copy(tmp: Path) -> None:
        shutil.copytree(snapshot, tmp, dirs_exist_ok=True)

    atomic_dir(out_dir, copy)
    return out_dir
