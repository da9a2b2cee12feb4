"""A curriculum stage as the pipeline runs it, without Prefect: train with its MLflow run, evaluate the export.

* :func:`train`: :meth:`vgrpo.trainer.Trainer.train` with the stage's MLflow run (continued when its checkpoint
  names one); on ``launch.processes`` processes under ``accelerate launch`` when it asks for more than one
  (:mod:`tasks.launch`), rank 0 alone tracking. It leaves a manifest beside the checkpoints (the training
  fingerprint, the starting adapter, the code and the output's hash), so :func:`output_is_intact` tells whether
  a cached result still describes what is on disk.
* :func:`evaluate`: the exported weights under the stage's evaluation settings, and the captioned sample grid.
* :func:`run_tracked_stage`: both, for DVC's stages (:mod:`tasks.dvc_stage`).

The Prefect flow runs the same bodies as cached tasks (:mod:`tasks.stage_tasks`), each phase a task run.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from tasks.callbacks import FanOut, StageTracker, log_evaluation
from tasks.launch import StartMachines, launch_stage
from tasks.outcome import StageEvaluation, StageOutcome
from tasks.stage_layout import MANIFEST, dir_hash, stage_dirs
from tasks.stage_store import CheckpointUpload, publish_stage, restore_checkpoints
from tasks.store import Store
from tasks.tracking import Tracking
from vgrpo.atomic import write_json_atomic
from vgrpo.checkpoints.resume import training_hash
from vgrpo.config import StageConfig
from vgrpo.evaluation.grids import grid_of, write_grid
from vgrpo.evaluation.tables import flat_metrics
from vgrpo.parallel.distributed import Distributed
from vgrpo.trainer import Trainer
from vgrpo.training.prompt_rows import StagePrompts
from vgrpo.training.stage import PhaseRunner, StageCallbacks, call_directly, stage_checkpoints

__all__ = [
    "MANIFEST",
    "PROGRESS_FILE",
    "code_version",
    "dir_hash",
    "evaluate",
    "grid_path",
    "output_is_intact",
    "run_tracked_stage",
    "stage_dirs",
    "train",
    "train_and_track",
]

PROGRESS_FILE = "progress.json"
"""In a stage's work folder: its live progress (:class:`vgrpo.progress_line.Progress` as JSON), read by
:mod:`flows.watch`."""

CODE = tuple(Path(__file__).resolve().parents[1] / name for name in ("vgrpo", "tasks"))
"""The code that decides a stage's result and its shape: the library and these task bodies."""


@lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of the Python sources of :data:`CODE` (what decides a stage's result besides its params)."""
    return hashlib.sha256("".join(dir_hash(path, "*.py") for path in CODE).encode()).hexdigest()[:16]


def output_is_intact(cfg: StageConfig, run_root: str, init_hash: str | None) -> bool:
    """Whether the stage's output exists with the bytes the training that the cache would return wrote (its
    manifest names the fingerprint, the starting adapter, the code and the output's hash)."""
    out_dir, work_dir = stage_dirs(run_root, cfg.name)
    try:
        recorded = json.loads((work_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    expected = {"fingerprint": training_hash(cfg), "init_hash": init_hash, "code_version": code_version()}
    same = all(recorded.get(key) == value for key, value in expected.items())
    return bool(same and out_dir.is_dir() and dir_hash(out_dir) == recorded.get("hash"))


def train(
    cfg: StageConfig,
    init_lora: str | None,
    run_root: str,
    root: str,
    tracking: Tracking | None,
    phases: PhaseRunner = call_directly,
    prompts: StagePrompts | None = None,
    log: Callable[[str], None] = print,
    start_machines: StartMachines | None = None,
) -> StageOutcome:
    """Train one stage with its MLflow run (continued when its checkpoint names one). When the stage's
    ``launch`` asks for more than one process, ``accelerate launch`` runs it (:mod:`tasks.launch`; each output
    line goes to ``log``, and ``phases`` and ``prompts`` are not used: the processes call the phases directly);
    on several machines, ``start_machines`` starts the others' processes."""
    store = Store.from_env()
    if store is not None:  # another machine may have checkpointed this stage: resume from its newest
        fetched = restore_checkpoints(store, run_root, cfg.name, root)
        if fetched:
            log(f"{cfg.name}: checkpoints {', '.join(fetched)} from the store ({store.url})")
    if cfg.launch.launched:
        started = time.perf_counter()
        launched = launch_stage(cfg, init_lora, run_root, root, tracking, log, start_machines)
        return launched.replace(wall_s=time.perf_counter() - started)  # with the processes' start
    trained = train_and_track(cfg, init_lora, run_root, root, tracking, phases, prompts)
    assert trained is not None  # one process is rank 0
    return trained


def train_and_track(
    cfg: StageConfig,
    init_lora: str | None,
    run_root: str,
    root: str,
    tracking: Tracking | None,
    phases: PhaseRunner = call_directly,
    prompts: StagePrompts | None = None,
    dist: Distributed | None = None,
) -> StageOutcome | None:
    """The body of :func:`train` on one process: this process alone, or one rank of a launched stage
    (:mod:`tasks.launched_stage`). Rank 0 opens (or continues) the MLflow run, reports, writes the manifest and
    returns the outcome; every other rank trains its share silently and returns ``None``."""
    out_dir, work_dir = stage_dirs(run_root, cfg.name)
    init = Path(root) / init_lora if init_lora else None
    tracker = None
    if dist is None or dist.is_main:
        previous = stage_checkpoints(cfg, work_dir, init).peek()
        run_id = previous.run.get("mlflow_run_id") if previous else None
        tracker = StageTracker.open(cfg, tracking, run_id, state_file=work_dir / PROGRESS_FILE)
    store = Store.from_env()
    callbacks: StageCallbacks | None = tracker
    if store is not None and tracker is not None:
        callbacks = FanOut(tracker, CheckpointUpload(store, run_root, cfg.name, root))
    started = time.perf_counter()
    try:
        trainer = Trainer(
            cfg,
            work_dir=work_dir,
            out_dir=out_dir,
            init_lora=Path(init_lora) if init_lora else None,
            root=Path(root),
            callbacks=callbacks,
            phases=phases,
            dist=dist,
        )
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
    manifest = {"fingerprint": training_hash(cfg), "init_hash": init_hash, "code_version": code_version()}
    write_json_atomic(work_dir / MANIFEST, {**manifest, "hash": out_hash})
    if store is not None:  # the adapter by its hash, then the manifest naming it: what other machines restore
        publish_stage(store, run_root, cfg.name, root)
    tracker.finish_training(
        out_dir, out_hash, result.resumed_from, len(result.skipped), base=Path(root) / cfg.pipeline, hold=result.hold
    )
    return StageOutcome(
        name=cfg.name,
        out_dir=str(out_dir),
        hash=out_hash,
        run_id=tracker.run_id,
        model_uri=tracker.model_uri,
        resumed_from=result.resumed_from,
        wall_s=time.perf_counter() - started,
        history=tuple(result.history),
        skipped=len(result.skipped),
        evaluations=tuple({"iteration": e.get("iteration"), **flat_metrics(e)} for e in result.evaluations),
        hold=result.hold,
        timings=dict(result.timings),
    )


def evaluate(cfg: StageConfig, out_dir: str, root: str, grid: Path | None) -> StageEvaluation:
    """The final evaluation of a stage's exported weights; writes the captioned sample grid to ``grid``."""
    work_dir = Path(out_dir).parent.parent / "work" / cfg.name  # the layout train gives a run
    evaluated = Trainer(cfg, work_dir=work_dir, out_dir=Path(out_dir), root=Path(root)).evaluate()
    if evaluated is None:
        return StageEvaluation()
    table, images = evaluated
    if grid is not None and cfg.evaluation.grid_prompts:
        write_grid(grid, **grid_of(table, images, cfg.evaluation.grid_prompts))
    return StageEvaluation(table, flat_metrics(table), str(grid) if grid is not None else None)


def grid_path(run_root: str | Path, name: str, adapter_hash: str) -> Path:
    """Where the final evaluation of a stage's output ``adapter_hash`` draws its sample grid."""
    return Path(run_root) / "eval" / f"{name}-{adapter_hash}.png"


def run_tracked_stage(
    cfg: StageConfig,
    init_lora: str | None,
    run_root: str,
    root: str = ".",
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    experiment: str = "vgrpo",
    tags: dict[str, str] | None = None,
    start_machines: StartMachines | None = None,
) -> StageOutcome:
    """Train and evaluate one stage with its MLflow run (when ``tracking_uri`` is given), phases called directly:
    the body of DVC's stages (:mod:`tasks.dvc_stage`) and of a scheduler's machine 0 (:mod:`tasks.cluster_stage`).
    The adapter goes to ``run_root/stages/<name>``, resumable checkpoints to ``run_root/work/<name>``. A stage whose
    ``launch`` asks for more than one process trains under ``accelerate launch`` (its rank-0 output on stdout) and
    is evaluated here; on several machines, ``start_machines`` as :func:`train`'s."""
    tracking = None
    if tracking_uri is not None:
        tracking = Tracking(tracking_uri, experiment, cfg.name, parent_run_id, dict(tags or {}))
    trained = train(cfg, init_lora, run_root, root, tracking, start_machines=start_machines)
    evaluation = evaluate(cfg, trained.out_dir, root, grid_path(run_root, cfg.name, trained.hash))
    if tracking is not None and trained.run_id is not None and evaluation.table is not None:
        log_evaluation(tracking.uri, trained.run_id, evaluation, cfg.iterations)
    return trained.evaluated(evaluation, cfg.iterations)
