"""One curriculum stage as a short loop over named phases (:mod:`vgrpo.training.phases`):

    prepare_prompts -> setup_policy -> (resume) [-> hold check] -> per iteration: rollout -> score -> update
    [-> evaluate] [-> hold check] [-> checkpoint] -> export -> evaluate

A stage with ``hold`` (:mod:`vgrpo.training.hold`) checks its held rewards on validation prompts at its start and
every ``hold.every`` iterations, keeps every check's adapter, and exports the last one that holds.

After each iteration the stage's participants (:class:`StageCallbacks`, as transformers' ``TrainerCallback``) give
their verdict on one :class:`vgrpo.training.control.StageControl`: evaluate, checkpoint, stop, and at the end which
weights to export. The built-in ones are the evaluation and checkpoint cadences
(:mod:`vgrpo.training.participants`), the skip guard (:class:`vgrpo.training.guards.SkipGuard`) and the hold
(:class:`vgrpo.training.holding.HoldCheck`); a user's callbacks come after them (``docs/extending.md``). Each
participant's state goes into every checkpoint, so a stage resumed from one
(:class:`vgrpo.checkpoints.resume.ResumableRun`) takes exactly the steps an uninterrupted run takes.

The orchestration plugs in twice, and this module imports none of it: a :class:`StageCallbacks` receives what
happened (metrics, evaluations, skips, checkpoints), and a :class:`PhaseRunner` decides how each phase runs (called
directly by default; the Prefect layer runs each as a named task).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from vgrpo.checkpoints.resume import ResumableRun, TrainingState, adapter_hash, training_hash
from vgrpo.config import StageConfig
from vgrpo.config_batch import check_batch
from vgrpo.logs import get_logger
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import trainable_parameters
from vgrpo.rewards.base import NonFiniteRewardError, RewardFailed
from vgrpo.rewards.multi import MultiReward
from vgrpo.training.callbacks import FanOut, ProgressView, StageCallbacks, callback_leaves
from vgrpo.training.control import StageControl
from vgrpo.training.guards import NonFiniteError, SkipGuard
from vgrpo.training.holding import HoldCheck, export_kept, hold_evaluator
from vgrpo.training.participants import CheckpointCadence, EvaluationCadence, checkpoint_states, restore_states
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
from vgrpo.training.stage_result import StageResult, StageRewardFailed, nonfinite_failure

__all__ = [
    "FanOut",
    "PhaseRunner",
    "ProgressView",
    "StageCallbacks",
    "StageControl",
    "StageOptions",
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


@dataclass(frozen=True)
class StageOptions:
    """How :func:`run_stage` runs besides what it trains and reports."""

    phases: PhaseRunner = call_directly
    """How each phase runs (the Prefect layer runs each as a named task)."""
    final_evaluation: bool = True
    """Evaluate the exported weights at the end (off when the caller evaluates them itself)."""
    run_state: Mapping[str, Any] | None = None
    """JSON-able values stored in every checkpoint (a tracker's run id, so a resumed stage continues its run)."""
    prompts: StagePrompts | None = None
    """The output of :func:`prepare_prompts` when the caller ran it already."""
    rewards: MultiReward | None = None
    """The training rewards as objects (default: built from ``config.rewards``)."""
    dist: Distributed | None = None
    """The processes sharing each iteration's batch (default: from the environment ``accelerate launch`` sets, else
    one process, on the GPU when there is one)."""


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
    options: StageOptions | None = None,
) -> StageResult:
    """Train one stage from ``pipeline_dir`` (+ ``init_lora``, the previous stage's adapter) and export its
    weights to ``out_dir``. Checkpoints go to ``work_dir/checkpoints``; a run finds the newest one written with the
    same training params and starting adapter and continues from it.

    Args:
        root: folder that relative prompt and model paths in ``config`` are resolved against.
        callbacks: what the stage reports (rank 0), and what steers it after the built-in participants (every rank):
            a :class:`StageCallbacks` overriding the hooks it needs, several in a :class:`FanOut` (default: none).
            After ``max_consecutive_skips`` skipped iterations in a row the stage raises
            :class:`vgrpo.training.guards.TrainingDiverged` and leaves its last checkpoint as it was.
        options: how it runs (:class:`StageOptions`: the phase runner, the final evaluation, the processes, ...).
    """
    options = options if options is not None else StageOptions()
    live = _LiveStage(config, root, pipeline_dir, work_dir, out_dir, init_lora, callbacks, options)
    live.setup()
    stage, phases, result, prompts = live.stage, options.phases, live.result, live.prompts
    guard = SkipGuard(
        config.name, config.max_consecutive_skips, result, live.report, live.dist.is_main, live.run.newest
    )
    participants: list[StageCallbacks] = [EvaluationCadence(config), CheckpointCadence(config), guard]
    if config.hold is not None:
        participants.append(live.hold_check())
    participants += callback_leaves(callbacks)
    control = live.begin(participants)
    done = result.resumed_from
    while done < config.iterations and not control.should_stop:
        started = time.perf_counter()
        try:
            rolled = phases("rollout", done, rollout, stage, config, prompts, done)
            scores = phases("score", done, score, stage, rolled)
            metrics = phases("update", done, update, stage, config, rolled, scores, done)
        except RewardFailed as exc:  # nothing of this iteration was applied or written; the last checkpoint stands
            raise live.failed(exc, done) from exc
        except NonFiniteError as exc:  # no update was applied after the check failed: skip the iteration
            guard.skipped(exc, done)
        else:
            guard.passed(metrics, done, time.perf_counter() - started)
        live.timings["iterations_s"] += time.perf_counter() - started
        done += 1
        live.verdict(participants, done, control)
        if control.should_checkpoint or control.should_stop:  # a stopped stage resumes stopped
            live.checkpoint(done, checkpoint_states(participants))
    for participant in participants:
        participant.on_stage_end(done, control)
    live.export(control)
    if options.final_evaluation:
        live.final_evaluation(control, done)
    return result


class _LiveStage:
    """What :func:`run_stage`'s steps share: the policy, its evaluator and checkpoints, the result, the reports."""

    def __init__(
        self,
        config: StageConfig,
        root: Path,
        pipeline_dir: Path,
        work_dir: Path,
        out_dir: Path,
        init_lora: Path | None,
        callbacks: StageCallbacks | None,
        options: StageOptions,
    ) -> None:
        self.config, self.root, self.pipeline_dir = config, root, pipeline_dir
        self.work_dir, self.out_dir, self.init_lora = work_dir, out_dir, init_lora
        self.options, self.phases = options, options.phases
        self.dist = options.dist if options.dist is not None else Distributed.from_environment()
        self.report = callbacks if callbacks is not None else StageCallbacks()
        self.timings = dict.fromkeys(("setup_s", "iterations_s", "evaluation_s", "checkpoint_s", "export_s"), 0.0)
        self.result = StageResult(out_dir=out_dir, iterations=config.iterations, timings=self.timings)

    def setup(self) -> None:
        """The prompts, the policy and its evaluator, and the newest checkpoint of the run, loaded."""
        config, dist, root, phases = self.config, self.dist, self.root, self.phases
        started = time.perf_counter()
        check_batch(config.batch_prompts, config.rollout.group_size, config.optim.minibatches, dist.world_size)
        prompts = self.options.prompts
        self.prompts = (
            prompts if prompts is not None else phases("prepare-prompts", None, prepare_prompts, config, root)
        )
        init = root / self.init_lora if self.init_lora is not None else None
        pipeline = root / self.pipeline_dir
        self.stage = phases("setup-policy", None, setup_policy, config, pipeline, init, dist, self.options.rewards)
        # precision.text_encoders: drop_after_encoding encodes every prompt of the stage now, then frees the encoders
        rows = [*self.prompts.train, *self.prompts.replay, *(self.prompts.evaluation or [])]
        self.stage.adapter.encode_ahead([str(r["prompt"]) for r in rows])
        self.evaluator = build_evaluator(config, self.prompts.evaluation, root, self.stage.shift, dist)
        self.run = stage_checkpoints(config, self.work_dir, init)
        self.resumed = self.run.restore(self.stage.checkpointed(), dist)
        if self.resumed is not None:
            resumed, result = self.resumed, self.result
            result.history, result.evaluations = list(resumed.history), list(resumed.evaluations)
            result.skipped, result.resumed_from = list(resumed.skipped), resumed.iteration
            logger.info("stage %s: resumed from the checkpoint of iteration %d", config.name, resumed.iteration)
        self.setup_started = started

    def hold_check(self) -> HoldCheck:
        checker = hold_evaluator(self.config, self.root, self.stage.shift, self.dist)
        return HoldCheck(
            self.config, self.work_dir, self.stage, checker, self.evaluating, self.phases, self.report, self.result
        )

    def begin(self, participants: list[StageCallbacks]) -> StageControl:
        """The participants' states restored and their verdict on the start (a fresh stage's: after its evaluation
        and checks at iteration 0)."""
        if self.resumed is not None:
            restore_states(participants, self.resumed)
        self.dist.broadcast_parameters(
            trainable_parameters(self.stage.policy)
        )  # as DDP: every rank starts from rank 0's
        self.timings["setup_s"] = time.perf_counter() - self.setup_started
        control = StageControl()
        for participant in participants:
            participant.on_stage_begin(self.result.resumed_from, control)
        control.should_stop = self.dist.any(control.should_stop)
        if self.result.resumed_from == 0:
            self.verdict(participants, 0, control)
        return control

    def verdict(self, participants: list[StageCallbacks], done: int, control: StageControl) -> None:
        """The participants' verdict after ``done`` iterations, with the evaluation they ask for in between."""
        control.next_iteration()
        for participant in participants:
            participant.on_iteration_end(done, control)
        if control.should_evaluate:
            self.evaluate(done)
        for participant in participants:
            participant.on_verdict(done, control)
        control.should_stop = self.dist.any(control.should_stop)  # a user's callback may decide on rank 0 alone

    def failed(self, exc: RewardFailed, iteration: int, evaluation: bool = False) -> StageRewardFailed:
        return StageRewardFailed(
            exc, stage=self.config.name, iteration=iteration, evaluation=evaluation, checkpoint=self.run.newest()
        )

    def evaluating(self, phase: str, iteration: int, fn: Callable[..., T], /, *args: Any) -> T:
        """``phases(phase, iteration, fn, *args)`` of an evaluation: a reward that fails stops the stage, named."""
        try:
            return self.phases(phase, iteration, fn, *args)
        except RewardFailed as exc:
            raise self.failed(exc, iteration, evaluation=True) from exc
        except NonFiniteRewardError as exc:  # nothing to skip in an evaluation
            raise self.failed(nonfinite_failure(exc), iteration, evaluation=True) from exc

    def evaluate(self, iteration: int) -> None:
        if self.evaluator is None:  # the other ranks go on to wait in the next collective (within the group's timeout)
            return
        started = time.perf_counter()
        table, images = self.evaluating("evaluate", iteration, evaluate, self.stage, self.evaluator, iteration)
        self.result.evaluations.append(table)
        self.timings["evaluation_s"] += time.perf_counter() - started
        if self.dist.is_main:  # sharded, every rank evaluates (vgrpo.training.stage_evaluator.build_evaluator)
            self.report.on_evaluate(table, images, iteration)

    def checkpoint(self, done: int, states: Mapping[str, Any]) -> None:
        """``iter-<done>``, with the participants' ``states`` (:func:`checkpoint_states`), on every rank of a
        sharded checkpoint (each writes its shards), else on rank 0."""
        result, dist = self.result, self.dist
        if dist.is_main or self.run.sharded:
            state = TrainingState(
                iteration=done,
                init_lora=str(self.init_lora),
                history=tuple(result.history),
                evaluations=tuple(result.evaluations),
                skipped=tuple(result.skipped),
                run=dict(self.options.run_state or {}),
                **states,
            )
            started = time.perf_counter()
            path = self.phases("checkpoint", done, _save, self.run, state, self.stage)
            self.timings["checkpoint_s"] += time.perf_counter() - started
            if dist.is_main:
                self.report.on_checkpoint(path, done)
        dist.barrier()  # the checkpoint is whole before any rank goes on

    def export(self, control: StageControl) -> None:
        """The weights in memory, or those the participants kept (``control.export_from``), to ``out_dir``."""
        started, name, out_dir, kept = time.perf_counter(), self.config.name, self.out_dir, control.export_from
        if kept is None:
            self.phases("export", None, export, self.stage, self.config, out_dir)
            logger.info("stage %s: exported to %s after %d iterations", name, out_dir, self.config.iterations)
        else:
            self.phases("export", None, export_kept, kept.adapter, out_dir)
            if self.result.hold is not None:
                self.report.on_kept(self.result.hold)
            logger.info("stage %s: exported iteration %s to %s (%s)", name, kept.iteration, out_dir, kept.reason)
        self.timings["export_s"] = time.perf_counter() - started

    def final_evaluation(self, control: StageControl, done: int) -> None:
        """The exported weights' evaluation at the stage's last iteration: of the policy in memory when that is what
        was exported, else of the export, loaded."""
        config, result, kept = self.config, self.result, control.export_from
        ended = result.evaluations and result.evaluations[-1].get("iteration") == config.iterations
        in_memory = kept is None or kept.iteration == done == config.iterations
        if in_memory and not ended:
            self.evaluate(config.iterations)
        elif not in_memory:  # the export is an earlier checkpoint than the weights in memory
            root = self.root
            evaluated = evaluate_adapter(config, root / self.pipeline_dir, self.out_dir, root, config.iterations)
            if evaluated is not None:
                result.evaluations.append(evaluated[0])
                self.report.on_evaluate(evaluated[0], evaluated[1], config.iterations)


def _save(run: ResumableRun, state: TrainingState, stage: StagePolicy) -> Path:
    return run.save(state, stage.checkpointed(), stage.dist)
