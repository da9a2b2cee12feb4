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

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from vgrpo.checkpoints.resume import ResumableRun, TrainingState, adapter_hash, training_hash
from vgrpo.config import StageConfig
from vgrpo.config_batch import check_batch
from vgrpo.evaluation.tables import flat_metrics
from vgrpo.logs import get_logger
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import trainable_parameters
from vgrpo.rewards.base import NonFiniteRewardError, RewardFailed
from vgrpo.rewards.multi import MultiReward
from vgrpo.training.callbacks import FanOut, ProgressView, StageCallbacks
from vgrpo.training.guards import NonFiniteError, TrainingDiverged
from vgrpo.training.hold import check_holds, held_values
from vgrpo.training.holding import Holding, evaluate_base, export_kept, hold_evaluator
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
from vgrpo.training.prompt_rows import StagePrompts, prepare_prompts
from vgrpo.training.stage_evaluator import build_evaluator
from vgrpo.training.stage_result import StageResult, StageRewardFailed, nonfinite_failure, skipped_summary

__all__ = [
    "FanOut",
    "PhaseRunner",
    "ProgressView",
    "StageCallbacks",
    "StageResult",
    "StageRewardFailed",
    "call_directly",
    "run_stage",
    "stage_checkpoints",
]

T = TypeVar("T")

logger = get_logger(__name__)


class PhaseRunner(Protocol):
    """How a phase runs: ``runner(phase, iteration, fn, *args)`` returns ``fn(*args)``; an orchestrator wraps it
    (a named task, a span). ``iteration`` is ``None`` for once-per-stage phases."""

    def __call__(self, phase: str, iteration: int | None, fn: Callable[..., T], /, *args: Any) -> T: ...


def stage_checkpoints(config: StageConfig, work_dir: Path, init_lora: Path | None) -> ResumableRun:
    """The stage's checkpoints under ``work_dir/checkpoints``: those of its training fingerprint and starting
    adapter, ``keep_checkpoints`` of them kept, sharded under FSDP."""
    return ResumableRun(
        work_dir / "checkpoints",
        training_hash(config),
        adapter_hash(init_lora) if init_lora is not None else None,
        config.keep_checkpoints,
        sharded=config.distributed.strategy == "fsdp",
    )


def call_directly(phase: str, iteration: int | None, fn: Callable[..., T], /, *args: Any) -> T:
    return fn(*args)


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
    run = stage_checkpoints(config, work_dir, init)
    result = StageResult(out_dir=out_dir, iterations=config.iterations, timings=timings)
    resumed = run.restore(stage.checkpointed(), dist)
    consecutive_skips = 0
    if resumed is not None:
        result.history, result.evaluations = list(resumed.history), list(resumed.evaluations)
        result.skipped, result.resumed_from = list(resumed.skipped), resumed.iteration
        consecutive_skips = resumed.consecutive_skips
        logger.info("stage %s: resumed from the checkpoint of iteration %d", config.name, resumed.iteration)
    hold = config.hold
    holding = Holding(config, work_dir, dict(resumed.hold) if resumed is not None else {})
    checker = hold_evaluator(config, root, stage.shift, dist) if hold is not None else None
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
            raise failed(nonfinite_failure(exc), iteration, evaluation=True) from exc
        result.evaluations.append(table)
        timings["evaluation_s"] += time.perf_counter() - evaluation_started
        if dist.is_main:  # sharded, every rank evaluates (vgrpo.training.stage_evaluator.build_evaluator)
            report.on_evaluate(table, images, iteration)

    def run_hold_check(iteration: int) -> None:
        assert hold is not None and checker is not None
        try:
            if holding.reference is None and hold.reference == "base":
                table, _ = phases("hold-base", iteration, evaluate_base, stage, checker)
                holding.reference = held_values(flat_metrics(table), list(table["rewards"]), list(hold.rewards))
            table, _ = phases("hold", iteration, evaluate, stage, checker, iteration)
        except RewardFailed as exc:
            raise failed(exc, iteration, evaluation=True) from exc
        except NonFiniteRewardError as exc:
            raise failed(nonfinite_failure(exc), iteration, evaluation=True) from exc
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
                logger.warning(  # on the console at any verbosity: these iterations train nothing
                    "stage %s, iteration %d skipped (no update applied): non-finite %s, %s of %s values; "
                    "%d in a row of max_consecutive_skips %d",
                    config.name,
                    iteration,
                    exc.quantity,
                    event.get("count", "?"),
                    event.get("of", "?"),
                    consecutive_skips,
                    config.max_consecutive_skips,
                )
            if consecutive_skips >= config.max_consecutive_skips:
                recent = result.skipped[-consecutive_skips:]
                raise TrainingDiverged(
                    f"stage {config.name}: {consecutive_skips} consecutive iterations skipped for non-finite values "
                    f"({skipped_summary(recent)}); the last checkpoint, {run.newest() or 'none yet'}, is "
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
        phases("export", None, export_kept, holding.snapshot(result.hold["kept_iteration"]), out_dir)
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
