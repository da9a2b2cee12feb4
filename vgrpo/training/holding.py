"""A holding stage's runtime (:mod:`vgrpo.training.hold` holds its config and pure bookkeeping): its checks so far,
the evaluator of the checks, the base model's check and the export of the kept checkpoint."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.algorithms.base import zero_lora_deltas
from vgrpo.atomic import atomic_dir
from vgrpo.config import StageConfig
from vgrpo.evaluation.evaluator import Evaluator
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import ParameterSnapshot, trainable_parameters
from vgrpo.training.hold import HOLD_DIR, kept_check
from vgrpo.training.phases import StagePolicy
from vgrpo.training.prompt_rows import checked_rows
from vgrpo.training.stage_evaluator import build_evaluator

__all__ = ["Holding", "evaluate_base", "export_kept", "hold_evaluator"]


class Holding:
    """A holding stage's checks so far, their reference and where each check's adapter is kept (empty and inert
    for a stage without ``hold``)."""

    def __init__(self, config: StageConfig, work_dir: Path, restored: Mapping[str, Any]) -> None:
        self.config, self.dir = config, work_dir / HOLD_DIR
        reference = restored.get("reference")
        self.reference: dict[str, float] | None = dict(reference) if reference is not None else None
        self.checks: list[dict[str, Any]] = [dict(c) for c in restored.get("checks", [])]

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
        hold = self.config.hold
        return hold is not None and hold.stop_after is not None and self.failing() >= hold.stop_after

    def to_json(self) -> dict[str, Any]:
        return {} if self.config.hold is None else {"reference": self.reference, "checks": self.checks}

    def summary(self) -> dict[str, Any]:
        hold = self.config.hold
        assert hold is not None and self.reference is not None
        kept, reason = kept_check(self.checks)
        last = int(self.checks[-1]["iteration"])
        return {
            "reference_kind": hold.reference,
            "reference": dict(self.reference),
            "tolerances": dict(hold.rewards),
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
