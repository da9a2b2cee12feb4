"""The train-stage task: one curriculum stage (:func:`vgrpo.stage.run_stage`) with its MLflow run.

Inputs are the stage's validated params (plain JSON), the previous stage's adapter as a path plus its content
hash, and folders. The cache key is the hash of all of that and of the library's source, so re-running a
curriculum after a crash returns finished stages from the cache, resumes the stage in progress from its last
checkpoint (:func:`vgrpo.stage.run_stage` does that), and any change of code or params re-runs what it affects.
"""

from __future__ import annotations

import hashlib
import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from prefect import task
from prefect.context import TaskRunContext

__all__ = ["code_version", "dir_hash", "run_tracked_stage", "train_stage"]

LIBRARY = Path(__file__).resolve().parents[1] / "vgrpo"


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


def _cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    keyed = {k: parameters[k] for k in ("stage", "init_hash", "run_root")}
    blob = json.dumps(keyed, sort_keys=True) + code_version()
    return "train-stage-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


@task(name="train-stage", cache_key_fn=_cache_key, persist_result=True, retries=0)
def train_stage(
    stage: dict[str, Any],
    init_lora: str | None,
    init_hash: str | None,
    run_root: str,
    root: str = ".",
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    experiment: str = "vgrpo",
) -> dict[str, Any]:
    """Train one stage; returns its output directory, content hash, final evaluation and MLflow run id.

    ``init_hash`` (the previous adapter's :func:`dir_hash`) is not read here: it is part of the cache key. No
    retries: a failure inside a stage is a bug or bad input, and the stage resumes from its checkpoint when the
    flow runs again."""
    return run_tracked_stage(stage, init_lora, run_root, root, tracking_uri, parent_run_id, experiment)


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
    """:func:`vgrpo.stage.run_stage` with its MLflow run (when ``tracking_uri`` is given): the body of
    :func:`train_stage`, also called by DVC's stages (:mod:`tasks.dvc_stage`). The adapter goes to
    ``run_root/stages/<name>``, resumable checkpoints to ``run_root/work/<name>``."""
    from vgrpo.config import StageConfig
    from vgrpo.evaluation import flat_metrics, grid_image, grid_of
    from vgrpo.progress import progress_bar
    from vgrpo.stage import run_stage

    cfg = StageConfig.model_validate(stage)
    out_dir = Path(run_root) / "stages" / cfg.name
    client = run_id = None
    if tracking_uri is not None:
        from mlflow import MlflowClient

        from tasks.tracking import log_image, log_json, log_metrics, log_params, start_run

        client = MlflowClient(tracking_uri)
        all_tags = {"vgrpo.stage": cfg.name, "vgrpo.code_version": code_version(), **(tags or {})}
        run_id = start_run(client, experiment, cfg.name, parent_run_id=parent_run_id, tags=all_tags)
        log_params(client, run_id, stage)

    bar: Any = None

    def log(metrics: dict[str, float], iteration: int) -> None:
        nonlocal bar
        if bar is None:  # created at the first iteration run, so a resumed stage starts the bar where it resumed
            bar = progress_bar(cfg.iterations, cfg.name, initial=iteration)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics.get('reward/total_mean', float('nan')):.3f}", refresh=False)
        if client is not None and run_id is not None:
            log_metrics(client, run_id, metrics, step=iteration)

    def on_eval(table: dict[str, Any], images: Any, iteration: int) -> None:
        if client is not None and run_id is not None:
            log_metrics(client, run_id, flat_metrics(table), step=iteration)
            log_json(client, run_id, table, f"eval/iter-{iteration:05d}.json")
            log_image(client, run_id, grid_image(**grid_of(table, images, 8)), f"eval/iter-{iteration:05d}.png")

    def on_skip(event: dict[str, Any]) -> None:  # an iteration skipped for a NaN/Inf: what, where, how many
        if client is not None and run_id is not None:
            log_json(client, run_id, event, f"guard/iter-{event['iteration']:05d}.json")
            client.set_tag(run_id, "vgrpo.guard.last_skip", f"iteration {event['iteration']}: {event['quantity']}")

    started = time.perf_counter()
    try:
        result = run_stage(cfg, pipeline_dir=Path(cfg.pipeline), work_dir=Path(run_root) / "work" / cfg.name,
                           out_dir=out_dir, init_lora=Path(init_lora) if init_lora else None, root=Path(root),
                           log=log, on_eval=on_eval, on_skip=on_skip)  # fmt: skip
    except BaseException:
        if bar is not None:
            bar.close()
        if client is not None and run_id is not None:
            from tasks.tracking import end_run

            end_run(client, run_id, "FAILED")  # the stage resumes from its checkpoint, in a new run
        raise
    if bar is not None:
        bar.close()
    final = flat_metrics(result.evaluations[-1]) if result.evaluations else {}
    out_hash = dir_hash(out_dir)
    if client is not None and run_id is not None:
        from tasks.tracking import end_run

        client.set_tag(run_id, "vgrpo.output", str(out_dir.resolve()))  # the adapter, by reference and hash
        client.set_tag(run_id, "vgrpo.output_hash", out_hash)
        client.set_tag(run_id, "vgrpo.resumed_from", str(result.resumed_from))
        client.set_tag(run_id, "vgrpo.skipped_iterations", str(len(result.skipped)))
        end_run(client, run_id)
    return {"name": cfg.name, "out_dir": str(out_dir), "hash": out_hash, "final_eval": final, "run_id": run_id,
            "resumed_from": result.resumed_from, "wall_s": time.perf_counter() - started,
            "history": result.history,
            "evaluations": [{"iteration": e["iteration"], **flat_metrics(e)} for e in result.evaluations]}  # fmt: skip
