"""One curriculum stage as a short loop over named phases (:mod:`vgrpo.training.phases`):

    prepare_prompts -> setup_policy -> (resume) [-> hold check] -> per iteration: rollout -> score -> update
    [-> evaluate] [-> hold check] [-> checkpoint] -> export -> evaluate

A stage with ``hold`` (:mod:`vgrpo.training.hold`) checks its held rewards on validation prompts at its start and
every ``hold.every`` iterations, keeps every check's adapter, and exports the last one that holds.

A stage resumed from a checkpoint (:class:`vgrpo.checkpoints.resume.ResumableRun`) takes exactly the steps an
uninterrupted
run takes. The orchestration plugs in twice, and this module imports none of it: a :class:`StageCallbacks`
receives what happened (metrics, evaluations, skips, checkpoints), and a :class:`PhaseRunner` decides how each
phase runs (called directly by default; the Prefect layer runs each as a named task).

A reward that fails while scoring (it raises, or returns something that is not one number per image) stops the stage
with :class:`StageRewardFailed`: one line naming the reward, the iteration, what it returned or raised, and the last
checkpoint, left intact, which the stage resumes from when rerun. A NaN or Inf reward skips the iteration instead
(:mod:`vgrpo.training.guards`).

Sharded over processes (``dist``, :mod:`vgrpo.parallel.distributed`), every rank trains on its block of each
iteration's prompts, and rank 0 alone reports, evaluates, writes checkpoints and exports; every rank resumes
from the checkpoint rank 0 picked (``work_dir`` must be on a filesystem every node sees).
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO, TypeVar

import numpy as np

from vgrpo.algorithms.base import zero_lora_deltas
from vgrpo.atomic import atomic_dir, write_json_atomic
from vgrpo.checkpoints.resume import ResumableRun, TrainingState
from vgrpo.config import StageConfig
from vgrpo.config_batch import check_batch
from vgrpo.evaluation.evaluator import Evaluator, build_evaluator
from vgrpo.evaluation.tables import flat_metrics
from vgrpo.logs import get_logger
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import ParameterSnapshot, trainable_parameters
from vgrpo.progress_line import Progress
from vgrpo.rewards.base import NonFiniteRewardError, RewardFailed
from vgrpo.rewards.multi import MultiReward
from vgrpo.training.guards import NonFiniteError, TrainingDiverged
from vgrpo.training.hold import HOLD_DIR, check_holds, held_values, kept_check
from vgrpo.training.phases import (
    StagePolicy,
    evaluate,
    evaluate_adapter,
    export,
    rollout,
    score,
    setup_policy,
    update,
)
from vgrpo.training.prompt_rows import StagePrompts, checked_rows, prepare_prompts

__all__ = [
    "FanOut",
    "PhaseRunner",
    "ProgressView",
    "StageCallbacks",
    "StageResult",
    "StageRewardFailed",
    "call_directly",
    "run_stage",
]

T = TypeVar("T")

logger = get_logger(__name__)


class PhaseRunner(Protocol):
    """How a phase runs: ``runner(phase, iteration, fn, *args)`` returns ``fn(*args)``; an orchestrator wraps it
    (a named task, a span). ``iteration`` is ``None`` for once-per-stage phases."""

    def __call__(self, phase: str, iteration: int | None, fn: Callable[..., T], /, *args: Any) -> T: ...


def call_directly(phase: str, iteration: int | None, fn: Callable[..., T], /, *args: Any) -> T:
    return fn(*args)


class StageCallbacks:
    """What a stage reports as it runs, on rank 0 (as transformers' ``TrainerCallback``); override what you need."""

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


class FanOut(StageCallbacks):
    """Every report to each of ``callbacks`` in turn (a tracker and a progress view, a checkpoint upload)."""

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
    seconds per iteration, ETA, the last rewards), and why an iteration was skipped.

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
        out = self._out()
        out.write(
            ("\n" if out.isatty() else "")
            + f"{self.progress.stage} iteration {event['iteration']}: skipped, non-finite {event['quantity']} "
            f"({event.get('count', '?')} of {event.get('of', '?')}); no update applied\n"
        )
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


def _nonfinite_failure(exc: NonFiniteRewardError) -> RewardFailed:
    """A non-finite score where no iteration can be skipped (an evaluation), as a :class:`RewardFailed`."""
    details = exc.details
    return RewardFailed(
        exc.quantity.removeprefix("reward/"),
        f"returned {details.get('count', '?')} non-finite scores of {details.get('of', '?')} "
        f"(images {details.get('indices', [])[:10]}), expected finite numbers",
    )


def _skipped_summary(events: list[dict[str, Any]]) -> str:
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


# -- the loop ----------------------------------------------------------------------------------------------------------


def run_stage(
    config: StageConfig,
    *,
    pipeline_dir: Path,
    work_dir: Path,
    out_dir: Path,
    init_lora: Path | None = None,
    root: Path = Path("."),
    callbacks: StageCallbacks | None = None,
    phases: PhaseRunner = call_directly,
    final_evaluation: bool = True,
    run_state: Mapping[str, Any] | None = None,
    prompts: StagePrompts | None = None,
    rewards: MultiReward | None = None,
    dist: Distributed | None = None,
) -> StageResult:
    """Train one stage from ``pipeline_dir`` (+ ``init_lora``, the previous stage's adapter) and export its
    weights to ``out_dir``. Checkpoints go to ``work_dir/checkpoints``; a run finds the newest one written with the
    same training params and starting adapter and continues from it.

    Args:
        root: folder that relative prompt and model paths in ``config`` are resolved against.
        callbacks: what the stage reports (rank 0): a :class:`StageCallbacks` subclass overriding the events it
            needs (default: none). After ``max_consecutive_skips`` skipped iterations in a row the stage raises
            :class:`vgrpo.training.guards.TrainingDiverged` and leaves its last checkpoint as it was.
        phases: how each phase runs (:data:`PhaseRunner`).
        final_evaluation: evaluate the exported weights at the end (off when the caller evaluates them itself).
        run_state: JSON-able values stored in every checkpoint (a tracker's run id, so a resumed stage continues
            its run).
        prompts: the output of :func:`prepare_prompts` when the caller ran it already.
        rewards: the training rewards as objects (default: built from ``config.rewards``).
        dist: the processes sharing each iteration's batch (default: from the environment ``accelerate launch``
            sets, else one process, on the GPU when there is one).
    """
    dist = dist if dist is not None else Distributed.from_environment()
    setup_started = time.perf_counter()
    timings = dict.fromkeys(("setup_s", "iterations_s", "evaluation_s", "checkpoint_s", "export_s"), 0.0)
    report = callbacks if callbacks is not None else StageCallbacks()
    check_batch(
        config.rollout.prompts_per_iteration, config.rollout.group_size, config.optim.minibatches, dist.world_size
    )
    if prompts is None:
        prompts = phases("prepare-prompts", None, prepare_prompts, config, root)
    init = root / init_lora if init_lora is not None else None
    stage = phases("setup-policy", None, setup_policy, config, root / pipeline_dir, init, dist, rewards)
    # precision.text_encoders: drop_after_encoding encodes every prompt of the stage now, then frees the encoders
    stage.adapter.encode_ahead([str(r["prompt"]) for r in [*prompts.train, *(prompts.evaluation or [])]])
    evaluator = build_evaluator(config, prompts.evaluation, root, stage.shift, dist)
    run = ResumableRun.for_stage(config, work_dir, init)
    result = StageResult(out_dir=out_dir, iterations=config.iterations, timings=timings)
    resumed = run.restore(stage.checkpointed(), dist)
    consecutive_skips = 0
    if resumed is not None:
        result.history, result.evaluations = list(resumed.history), list(resumed.evaluations)
        result.skipped, result.resumed_from = list(resumed.skipped), resumed.iteration
        consecutive_skips = resumed.consecutive_skips
        logger.info("stage %s: resumed from the checkpoint of iteration %d", config.name, resumed.iteration)
    hold = config.hold
    holding = _Holding(config, work_dir, dict(resumed.hold) if resumed is not None else {})
    hold_evaluator = _hold_evaluator(config, root, stage.shift, dist) if hold is not None else None
    dist.broadcast_parameters(trainable_parameters(stage.policy))  # as DDP: every rank starts from rank 0's
    timings["setup_s"] = time.perf_counter() - setup_started

    def failed(exc: RewardFailed, iteration: int, evaluation: bool = False) -> StageRewardFailed:
        return StageRewardFailed(
            exc, stage=config.name, iteration=iteration, evaluation=evaluation, checkpoint=run.newest()
        )

    def run_evaluation(iteration: int) -> None:
        if evaluator is None:  # the other ranks go on to wait in the next collective (within the group's timeout)
            return
        evaluation_started = time.perf_counter()
        try:
            table, images = phases("evaluate", iteration, evaluate, stage, evaluator, iteration)
        except RewardFailed as exc:
            raise failed(exc, iteration, evaluation=True) from exc
        except NonFiniteRewardError as exc:  # nothing to skip in an evaluation
            raise failed(_nonfinite_failure(exc), iteration, evaluation=True) from exc
        result.evaluations.append(table)
        timings["evaluation_s"] += time.perf_counter() - evaluation_started
        if dist.is_main:  # sharded, every rank evaluates (vgrpo.evaluation.evaluator.build_evaluator)
            report.on_evaluate(table, images, iteration)

    def run_hold_check(iteration: int) -> None:
        assert hold is not None and hold_evaluator is not None
        try:
            if holding.reference is None and hold.reference == "base":
                table, _ = phases("hold-base", iteration, _evaluate_base, stage, hold_evaluator)
                holding.reference = held_values(flat_metrics(table), list(table["rewards"]), list(hold.rewards))
            table, _ = phases("hold", iteration, evaluate, stage, hold_evaluator, iteration)
        except RewardFailed as exc:
            raise failed(exc, iteration, evaluation=True) from exc
        except NonFiniteRewardError as exc:
            raise failed(_nonfinite_failure(exc), iteration, evaluation=True) from exc
        values = held_values(flat_metrics(table), list(table["rewards"]), list(hold.rewards))
        if holding.reference is None:  # reference: stage_start, the check at iteration 0
            holding.reference = values
        check = check_holds(iteration, values, holding.reference, hold.rewards)
        phases("hold-snapshot", iteration, export, stage, config, holding.snapshot(iteration))
        holding.checks.append(check)
        report.on_hold(check, dict(holding.reference))

    if result.resumed_from == 0 and config.eval_every and config.eval_at_start:
        run_evaluation(0)
    if hold is not None and result.resumed_from == 0:
        run_hold_check(0)
    for iteration in range(result.resumed_from, config.iterations):
        if holding.stopped():  # a stage resumed after its hold stopped it trains no further
            break
        started = time.perf_counter()
        try:
            rolled = phases("rollout", iteration, rollout, stage, config, prompts.train, iteration)
            scores = phases("score", iteration, score, stage, rolled)
            metrics = phases("update", iteration, update, stage, config, rolled, scores, iteration)
        except RewardFailed as exc:  # nothing of this iteration was applied or written; the last checkpoint stands
            raise failed(exc, iteration) from exc
        except NonFiniteError as exc:  # no update was applied after the check failed: skip the iteration
            consecutive_skips += 1
            event = {
                "iteration": iteration,
                "quantity": exc.quantity,
                "reward_errors": [],
                **exc.details,
                "consecutive": consecutive_skips,
            }
            result.skipped.append(event)
            metrics = {
                "iteration": float(iteration),
                "guard/skipped": 1.0,
                "guard/consecutive_skips": float(consecutive_skips),
            }
            result.history.append(metrics)
            if dist.is_main:
                report.on_log(metrics, iteration)
                report.on_skip(event)
            if consecutive_skips >= config.max_consecutive_skips:
                recent = result.skipped[-consecutive_skips:]
                raise TrainingDiverged(
                    f"stage {config.name}: {consecutive_skips} consecutive iterations skipped for non-finite values "
                    f"({_skipped_summary(recent)}); the last checkpoint, {run.newest() or 'none yet'}, is "
                    "intact. Lower optim.lr, check the rewards, or raise max_consecutive_skips."
                ) from exc
        else:
            consecutive_skips = 0
            metrics = {**metrics, "guard/skipped": 0.0, "time/iteration_s": time.perf_counter() - started}
            result.history.append(metrics)
            if dist.is_main:
                report.on_log(metrics, iteration)
        timings["iterations_s"] += time.perf_counter() - started
        done = iteration + 1
        if config.eval_every and done % config.eval_every == 0 and done < config.iterations:
            run_evaluation(done)
        if hold is not None and (done % hold.every == 0 or done == config.iterations):
            run_hold_check(done)
        stopping = holding.stopped()
        if done % config.checkpoint_every == 0 or done == config.iterations or stopping:
            if dist.is_main or run.sharded:  # every rank writes its shards of a sharded checkpoint
                state = TrainingState(
                    iteration=done,
                    init_lora=str(init_lora),
                    history=tuple(result.history),
                    evaluations=tuple(result.evaluations),
                    skipped=tuple(result.skipped),
                    consecutive_skips=consecutive_skips,
                    run=dict(run_state or {}),
                    hold=holding.to_json(),
                )
                checkpoint_started = time.perf_counter()
                path = phases("checkpoint", done, _save, run, state, stage)
                timings["checkpoint_s"] += time.perf_counter() - checkpoint_started
                if dist.is_main:
                    report.on_checkpoint(path, done)
            dist.barrier()  # the checkpoint is whole before any rank goes on
        if stopping:
            break
    export_started = time.perf_counter()
    if hold is None:
        phases("export", None, export, stage, config, out_dir)
        logger.info("stage %s: exported to %s after %d iterations", config.name, out_dir, config.iterations)
    else:
        result.hold = holding.summary()
        phases("export", None, _export_kept, holding.snapshot(result.hold["kept_iteration"]), out_dir)
        report.on_kept(result.hold)
        logger.info(
            "stage %s: exported iteration %s to %s (%s)",
            config.name,
            result.hold["kept_iteration"],
            out_dir,
            result.hold["reason"],
        )
    timings["export_s"] = time.perf_counter() - export_started
    ended = result.evaluations and result.evaluations[-1].get("iteration") == config.iterations
    last_trained = holding.checks[-1]["iteration"] if holding.checks else config.iterations
    kept_final = result.hold is None or (result.hold["kept_iteration"] == last_trained == config.iterations)
    if final_evaluation and kept_final and not ended:
        run_evaluation(config.iterations)
    elif final_evaluation and not kept_final:  # the export is an earlier checkpoint than the weights in memory
        evaluated = evaluate_adapter(config, root / pipeline_dir, out_dir, root, config.iterations)
        if evaluated is not None:
            result.evaluations.append(evaluated[0])
            report.on_evaluate(evaluated[0], evaluated[1], config.iterations)
    return result


def _save(run: ResumableRun, state: TrainingState, stage: StagePolicy) -> Path:
    return run.save(state, stage.checkpointed(), stage.dist)


# -- holding what earlier stages gained (vgrpo.training.hold) ----------------------------------------------------------


class _Holding:
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


def _hold_evaluator(config: StageConfig, root: Path, shift: float | None, dist: Distributed) -> Evaluator:
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


def _evaluate_base(stage: StagePolicy, evaluator: Evaluator) -> tuple[dict[str, Any], np.ndarray]:
    """The hold evaluation of the base model: the policy with its LoRA's deltas zeroed."""
    base = ParameterSnapshot(trainable_parameters(stage.policy))
    zero_lora_deltas(base, stage.policy)
    with base.swapped_in():
        return evaluator(stage.adapter, stage.policy, 0)


def _export_kept(snapshot: Path, out_dir: Path) -> Path:
    """The kept check's adapter (written by the export phase when it was checked) copied to ``out_dir``
    atomically."""

    def copy(tmp: Path) -> None:
        shutil.copytree(snapshot, tmp, dirs_exist_ok=True)

    atomic_dir(out_dir, copy)
    return out_dir
