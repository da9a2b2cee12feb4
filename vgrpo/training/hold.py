"""Stages that hold what earlier stages gained (``hold:`` in a stage's params).

A stage that names rewards to hold evaluates them on validation prompts at its start (iteration 0) and every
``hold.every`` iterations (and after its last), and keeps the adapter of every check under
``work_dir/hold/iter-NNNNN``. A check *holds* when every held number is at least its reference value minus its
tolerance; the reference is the stage's starting weights (``reference: stage_start``, the check at iteration 0) or
the base model, the LoRA's deltas zeroed (``reference: base``). The stage exports the last checkpoint that holds (its
final weights when the last check holds); with ``stop_after`` it stops once that many checks in a row fail. When no
check holds (possible only against the base), it exports its starting weights, and says so.

This module holds the config and the pure bookkeeping (which numbers, which check holds, which one is kept);
:func:`vgrpo.training.stage.run_stage` runs the evaluations and the exports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

from vgrpo.config_base import MAX_GROUP_SIZE, MAX_ITERATIONS, MAX_PROMPTS, FrozenConfig

if TYPE_CHECKING:
    from vgrpo.rewards.config import RewardConfig

__all__ = ["HoldConfig", "HoldError", "check_holds", "held_values", "kept_check", "unknown_held_problem"]

HOLD_DIR = "hold"
"""Folder of ``work_dir`` where every check's adapter is kept (``iter-NNNNN``)."""


class HoldError(ValueError):
    """A held reward that the hold evaluation does not report (raised at the stage's first check, before any
    update)."""


class HoldConfig(FrozenConfig):
    """What a stage must hold, and how it checks (``hold:`` in a stage's params)."""

    rewards: dict[str, Annotated[float, Field(ge=0)]] = Field(
        min_length=1,
        description="Held numbers and their tolerances: a check holds when each number >= its reference - its "
        "tolerance. A name is an evaluation number (`ocr`, `world_pickscore`) or a reward's column "
        "(`geneval_strict`, `geneval_partial`).",
    )
    every: int = Field(ge=1, le=MAX_ITERATIONS, description="Iterations between checks (and one after the last).")
    reference: Literal["stage_start", "base"] = Field(
        "stage_start",
        description="The values held: the stage's starting weights (checked at iteration 0), or the base model "
        "(the LoRA's deltas zeroed; needs lora).",
    )
    prompts: str = Field(description="Prompt file of the checks: a validation split, never the test split.")
    max_prompts: int | None = Field(48, ge=1, le=MAX_PROMPTS, description="First N prompts of it; None = all.")
    group_size: int = Field(2, ge=1, le=MAX_GROUP_SIZE, description="Samples per prompt of a check.")
    seed: int = Field(1, description="Noise seed of the checks' samples (the test evaluation's is 0).")
    stop_after: int | None = Field(
        None,
        ge=1,
        le=MAX_ITERATIONS,
        description="Stop the stage after this many failed checks in a row; None = never.",
    )

    @model_validator(mode="after")
    def _check(self) -> HoldConfig:
        bad = [name for name, tolerance in self.rewards.items() if not math.isfinite(tolerance) or not name]
        if bad:
            raise ValueError(f"hold.rewards: {bad}: a name and a finite tolerance >= 0 each")
        return self


def unknown_held_problem(
    hold: HoldConfig, evaluation: Sequence[RewardConfig], training: Sequence[RewardConfig]
) -> str | None:
    """Why some of ``hold.rewards`` can never be read from a check, known from the params alone: the checks score the
    stage's ``evaluation.rewards`` (:func:`vgrpo.training.holding.hold_evaluator`), so a held name must be one of
    their keys, a headline column (``geneval_strict``), or ``KEY_...`` of one of them (a sub-score or a tag's
    number, which only a check's table shows: :func:`held_values` still reads it then); None when all can be."""
    keys = [reward.resolved_key for reward in evaluation]
    numbers = set(keys)
    for reward in evaluation:
        for column in reward.headline_columns():
            if not column.gain:  # a gain needs a baseline evaluation, which a check has not
                metric = column.metric.removeprefix("eval/")
                numbers |= {metric, metric.removeprefix(f"{reward.resolved_key}_")}
    unknown = [
        name for name in hold.rewards if name not in numbers and not name.startswith(tuple(f"{k}_" for k in keys))
    ]
    if not unknown:
        return None
    trained = [name for name in unknown if name in {reward.resolved_key for reward in training}]
    return (
        f"{', '.join(f'hold.rewards.{name}' for name in unknown)}: not computed by the hold checks, which score the "
        f"stage's evaluation.rewards ({', '.join(keys)}): their numbers are {', '.join(sorted(numbers))}, or "
        "KEY_NAME for a sub-score"
        + (
            f"; {', '.join(trained)} is trained on (rewards): add it to evaluation.rewards to hold it"
            if trained
            else ""
        )
    )


def held_values(flat: Mapping[str, float], keys: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    """Each held number of an evaluation's flat metrics (:func:`vgrpo.evaluation.tables.flat_metrics`):
    ``eval/NAME``, or ``eval/KEY_NAME`` for a reward ``KEY`` of ``keys`` (GenEval's ``geneval_strict`` is
    ``eval/geneval_geneval_strict``).

    Raises:
        HoldError: naming ``hold.rewards.NAME`` and the numbers the evaluation has.
    """
    out: dict[str, float] = {}
    for name in names:
        found = [k for k in (f"eval/{name}", *(f"eval/{key}_{name}" for key in keys)) if k in flat]
        if not found:
            known = sorted(k.removeprefix("eval/") for k in flat if not k.endswith(("_ci_low", "_ci_high")))
            raise HoldError(f"hold.rewards.{name}: not a number of the hold evaluation (its numbers: {known})")
        out[name] = flat[found[0]]
    return out


def check_holds(
    iteration: int, values: Mapping[str, float], reference: Mapping[str, float], tolerances: Mapping[str, float]
) -> dict[str, Any]:
    """One check as JSON: its values, whether it holds, and each number that fell below its floor
    (``reference - tolerance``) with the floor."""
    failed = {
        name: {"value": values[name], "floor": reference[name] - tolerance}
        for name, tolerance in tolerances.items()
        if values[name] < reference[name] - tolerance
    }
    return {"iteration": iteration, "values": dict(values), "holds": not failed, "failed": failed}


def kept_check(checks: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    """The iteration whose weights a stage exports, and why: the last check that holds; the start (iteration 0)
    when none does."""
    if not checks:
        raise ValueError("no hold checks")
    held = [c for c in checks if c["holds"]]
    last = checks[-1]
    if last["holds"]:
        return int(last["iteration"]), f"the last check (iteration {last['iteration']}) holds every held reward"
    if not held:
        last_one = f"the last, iteration {last['iteration']}: {_broken(last)}"
        return 0, f"no check holds ({last_one}): the stage's start is kept"
    kept = held[-1]
    first_failed = next(c for c in checks if c["iteration"] > kept["iteration"])
    return int(kept["iteration"]), (
        f"iteration {kept['iteration']} is the last check that holds; iteration {first_failed['iteration']} broke "
        f"the hold ({_broken(first_failed)})"
    )


def _broken(check: Mapping[str, Any]) -> str:
    return "; ".join(f"{n} {f['value']:.4g} < floor {f['floor']:.4g}" for n, f in check["failed"].items())
