"""A curriculum stage as Prefect tasks, and the same stage with its MLflow run for DVC.

* ``prepare-prompts``: the stage's prompt rows, cached on the prompt files' bytes and the filters.
* ``train-stage``: :meth:`vgrpo.trainer.Trainer.train` with each phase as its own task run (:mod:`tasks.phases`) and
  its MLflow run; on ``launch.processes`` processes under ``accelerate launch`` when it asks for more than one
  (:mod:`tasks.launch`), rank 0 alone tracking. Cached on the training fingerprint (never the evaluation settings
  nor ``launch``), the starting adapter's hash and the library's source; the flow refreshes the cache when the
  stage's output is gone or changed (:func:`output_is_intact`). A resumed stage continues the MLflow run its
  checkpoint names.
* ``evaluate``: the exported adapter under the stage's evaluation settings, cached on the adapter's hash and
  those settings: changing an evaluation setting re-evaluates and never retrains.

:func:`run_tracked_stage` is the same train-then-evaluate body without Prefect, for DVC's stages.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.context import TaskRunContext

if TYPE_CHECKING:
    from vgrpo.parallel.distributed import Distributed

__all__ = [
    "Tracking",
    "code_version",
    "dir_hash",
    "evaluate_stage",
    "output_is_intact",
    "prepare_prompts_task",
    "run_tracked_stage",
    "train_and_track",
    "train_stage",
]

LIBRARY = Path(__file__).resolve().parents[1] / "vgrpo"
MANIFEST = "export.json"  # beside the checkpoints: which training produced the stage's output, and its hash


@lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of the library's Python sources (what decides a stage's result besides its params)."""
    return dir_hash(LIBRARY, "*.py")


def dir_hash(path: Path, pattern: str = "*") -> str:
    """SHA-256 (16 hex digits) over the names and bytes of the files under ``path`` matching ``pattern``: the
    identity of a stage's output."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob(pattern) if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _file_hash(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


@dataclass(frozen=True)
class Tracking:
    """Where a stage's MLflow run goes: the store, the experiment, the parent run, the run's name and tags."""

    uri: str
    experiment: str
    run_name: str
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


# -- prepare prompts ---------------------------------------------------------------------------------------------


def _prompts_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    stage, root = parameters["stage"], Path(parameters["root"])
    files = [stage["prompts"], stage.get("eval_prompts")]
    selection = {k: stage.get(k) for k in ("prompt_tags", "prompt_tag_weights", "rewards")}
    selection["evaluation"] = {k: stage["evaluation"].get(k) for k in ("max_prompts", "rewards")}
    hashes = [_file_hash(root / f) if f else None for f in files]
    return "prompts-" + _digest(files, hashes, selection, code_version())


@task(name="prepare-prompts", cache_key_fn=_prompts_key, persist_result=True,
      task_run_name="{stage[name]}/prepare-prompts")  # fmt: skip
def prepare_prompts_task(stage: dict[str, Any], root: str) -> Any:
    """The stage's training and evaluation prompt rows (:func:`vgrpo.training.stage.prepare_prompts`)."""
    from vgrpo.config import StageConfig
    from vgrpo.training.phases import prepare_prompts

    return prepare_prompts(StageConfig.model_validate(stage), Path(root))


# -- train -----------------------------------------------------------------------------------------------------------


def _train_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    from vgrpo.checkpoints.resume import training_hash
    from vgrpo.config import StageConfig

    fingerprint = training_hash(StageConfig.model_validate(parameters["stage"]))
    return "train-stage-" + _digest(fingerprint, parameters["init_hash"], parameters["run_root"], code_version())


def output_is_intact(stage: dict[str, Any], run_root: str, init_hash: str | None) -> bool:
    """Whether the stage's output exists with the bytes the training that the cache would return wrote (its
    manifest names the fingerprint, the starting adapter and the output's hash)."""
    from vgrpo.checkpoints.resume import training_hash
    from vgrpo.config import StageConfig

    name = stage["name"]
    manifest, out_dir = Path(run_root) / "work" / name / MANIFEST, Path(run_root) / "stages" / name
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    same = recorded.get("fingerprint") == training_hash(StageConfig.model_validate(stage)) and recorded.get(
        "init_hash") == init_hash and recorded.get("code_version") == code_version()  # fmt: skip
    return bool(same and out_dir.is_dir() and dir_hash(out_dir) == recorded.get("hash"))


def _train(stage: dict[str, Any], init_lora: str | None, run_root: str, root: str, tracking: Tracking | None,
           phases: Any, prompts: Any, log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Train one stage with its MLflow run (continued when its checkpoint names one); returns the output
    directory, its content hash, the run id and the training history. When the stage's ``launch`` asks for more
    than one process, ``accelerate launch`` runs it (:mod:`tasks.launch`; each output line goes to ``log``, and
    ``phases`` and ``prompts`` are not used: the processes call the phases directly)."""
    from vgrpo.config import StageConfig

    if StageConfig.model_validate(stage).launch.launched:
        from tasks.launch import launch_stage

        started = time.perf_counter()
        launched = launch_stage(stage, init_lora, run_root, root, tracking, log)
        return {**launched, "wall_s": time.perf_counter() - started}  # with the processes' start
    trained = train_and_track(stage, init_lora, run_root, root, tracking, phases, prompts)
    assert trained is not None  # one process is rank 0
    return trained


def train_and_track(stage: dict[str, Any], init_lora: str | None, run_root: str, root: str, tracking: Tracking | None,
                    phases: Any, prompts: Any, dist: Distributed | None = None) -> dict[str, Any] | None:  # fmt: skip
    """The body of :func:`_train` on one process: this process alone, or one rank of a launched stage
    (:mod:`tasks.launched_stage`). Rank 0 opens (or continues) the MLflow run, reports, writes the manifest and
    returns the result; every other rank trains its share silently and returns ``None``."""
    from tasks.callbacks import StageTracker
    from vgrpo.atomic import write_json_atomic
    from vgrpo.checkpoints.resume import ResumableRun, training_hash
    from vgrpo.config import StageConfig
    from vgrpo.trainer import Trainer
    from vgrpo.training.stage import call_directly

    cfg = StageConfig.model_validate(stage)
    out_dir, work_dir = Path(run_root) / "stages" / cfg.name, Path(run_root) / "work" / cfg.name
    init = Path(root) / init_lora if init_lora else None
    tracker = None
    if dist is None or dist.is_main:
        previous = ResumableRun.for_stage(cfg, work_dir, init).peek()
        tracker = StageTracker.open(cfg, stage, tracking, (previous or {}).get("run", {}).get("mlflow_run_id"))
    started = time.perf_counter()
    try:
        trainer = Trainer(cfg, work_dir=work_dir, out_dir=out_dir, init_lora=Path(init_lora) if init_lora else None,
                          root=Path(root), callbacks=tracker, phases=phases or call_directly, dist=dist)  # fmt: skip
        run_state = {"mlflow_run_id": tracker.run_id} if tracker is not None and tracker.run_id else None
        result = trainer.train(final_evaluation=False, prompts=prompts, run_state=run_state)
    except BaseException:
        if tracker is not None:
            tracker.close("FAILED")  # the stage resumes from its checkpoint, in this same run
        raise
    if tracker is None:
        return None
    out_hash = dir_hash(out_dir)
    init_hash = dir_hash(init) if init is not None else None
    write_json_atomic(work_dir / MANIFEST, {"fingerprint": training_hash(cfg), "init_hash": init_hash,
                                            "code_version": code_version(), "hash": out_hash})  # fmt: skip
    tracker.finish_training(out_dir, out_hash, result.resumed_from, len(result.skipped),
                            base=Path(root) / cfg.pipeline)  # fmt: skip
    return {"name": cfg.name, "out_dir": str(out_dir), "hash": out_hash, "run_id": tracker.run_id,
            "model_uri": tracker.model_uri, "resumed_from": result.resumed_from,
            "wall_s": time.perf_counter() - started, "history": result.history, "skipped": len(result.skipped),
            "evaluations": [_flat(e) for e in result.evaluations]}  # fmt: skip


@task(name="train-stage", cache_key_fn=_train_key, persist_result=True, retries=0,
      task_run_name="{stage[name]}/train")  # fmt: skip
def train_stage(
    stage: dict[str, Any],
    init_lora: str | None,
    init_hash: str | None,
    run_root: str,
    root: str = ".",
    tracking: Tracking | None = None,
    prompts: Any = None,
) -> dict[str, Any]:
    """Train one stage, each phase a task run (a launched stage: the processes' rank-0 output in this task's log);
    ``init_hash`` (the previous adapter's :func:`dir_hash`) is read only by the cache key. No retries: a failure
    inside a stage is a bug or bad input (transient reward faults are retried by the score phase), and the stage
    resumes from its checkpoint when the flow runs again."""
    from prefect import get_run_logger
    from prefect.runtime import flow_run

    from tasks.phases import PrefectPhases

    out = _train(stage, init_lora, run_root, root, tracking, PrefectPhases(stage["name"]), prompts,
                 log=get_run_logger().info)  # fmt: skip
    return {**out, "flow_run_id": str(flow_run.get_id())}


# -- evaluate ----------------------------------------------------------------------------------------------------------


def _flat(table: dict[str, Any]) -> dict[str, Any]:
    from vgrpo.evaluation.tables import flat_metrics

    return {"iteration": table.get("iteration"), **flat_metrics(table)}


def _eval_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    stage, root = parameters["stage"], Path(parameters["root"])
    prompts = _file_hash(root / stage["eval_prompts"]) if stage.get("eval_prompts") else None
    evaluated = {k: v for k, v in stage.items() if k != "launch"}  # the final evaluation runs in this process
    return "evaluate-" + _digest(evaluated, parameters["out_dir"], parameters["adapter_hash"], prompts, code_version())


def _evaluate(stage: dict[str, Any], out_dir: str, root: str, grid: Path | None) -> dict[str, Any]:
    """The final evaluation of a stage's exported weights; writes the captioned sample grid to ``grid``."""
    from vgrpo.config import StageConfig
    from vgrpo.evaluation.grids import grid_of, write_grid
    from vgrpo.evaluation.tables import flat_metrics
    from vgrpo.trainer import Trainer

    cfg = StageConfig.model_validate(stage)
    work_dir = Path(out_dir).parent.parent / "work" / cfg.name  # the layout _train gives a run
    evaluated = Trainer(cfg, work_dir=work_dir, out_dir=Path(out_dir), root=Path(root)).evaluate()
    if evaluated is None:
        return {"table": None, "final_eval": {}, "grid": None}
    table, images = evaluated
    if grid is not None and cfg.evaluation.grid_prompts:
        write_grid(grid, **grid_of(table, images, cfg.evaluation.grid_prompts))
    return {"table": table, "final_eval": flat_metrics(table), "grid": str(grid) if grid is not None else None}


@task(name="evaluate", cache_key_fn=_eval_key, persist_result=True, task_run_name="{stage[name]}/evaluate")
def evaluate_stage(stage: dict[str, Any], out_dir: str, adapter_hash: str, root: str = ".") -> dict[str, Any]:
    """Evaluate the exported adapter (``adapter_hash`` is read only by the cache key); the grid goes beside it."""
    grid = Path(out_dir).parent.parent / "eval" / f"{stage['name']}-{adapter_hash}.png"
    return _evaluate(stage, out_dir, root, grid)


# -- the same without Prefect (DVC) ----------------------------------------------------------------------------------


def run_tracked_stage(
    stage: dict[str, Any],
    init_lora: str | None,
    run_root: str,
    root: str = ".",
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    experiment: str = "vgrpo",
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Train and evaluate one stage with its MLflow run (when ``tracking_uri`` is given), phases called directly:
    the body of DVC's stages (:mod:`tasks.dvc_stage`). The adapter goes to ``run_root/stages/<name>``, resumable
    checkpoints to ``run_root/work/<name>``. A stage whose ``launch`` asks for more than one process trains under
    ``accelerate launch`` (its rank-0 output on stdout) and is evaluated here."""
    from tasks.callbacks import log_evaluation

    name = stage["name"]
    tracking = None
    if tracking_uri is not None:
        tracking = Tracking(tracking_uri, experiment, name, parent_run_id, dict(tags or {}))
    trained = _train(stage, init_lora, run_root, root, tracking, None, None)
    evaluated = _evaluate(stage, trained["out_dir"], root, Path(run_root) / "eval" / f"{name}-{trained['hash']}.png")
    if tracking is not None and evaluated["table"] is not None:
        log_evaluation(tracking.uri, trained["run_id"], evaluated, int(stage["iterations"]))
    final = evaluated["final_eval"]
    evaluations = trained["evaluations"] + ([{"iteration": stage["iterations"], **final}] if final else [])
    return {**trained, "final_eval": final, "evaluations": evaluations}
