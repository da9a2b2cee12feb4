"""The ``vgrpo`` flow: a curriculum's stages in order, each from the previous stage's adapter.

Per stage the flow runs ``prepare-prompts`` (cached on the prompt files), ``train-stage`` (cached on the training
params and starting adapter; every phase of every iteration is its own task run, ``s2-geneval/rollout-0042``)
and ``evaluate`` (cached on the adapter and the evaluation settings), then publishes a table artifact of the
evaluation, the sample grid and a link to the stage's MLflow run. With ``ablations``, the curriculum runs once
per ablation params file, each cell its own flow run (:mod:`flows.sweep`).

    prefect deployment run vgrpo/embedded-curriculum --watch     (with a server and `python -m flows.deploy`)

All params (of every ablation too) are validated, and every input they name checked
(:func:`vgrpo.config.load_curriculum`, :func:`vgrpo.training.preflight.preflight`), before the first stage starts and
before
any MLflow run opens; ``overrides`` (``-p overrides='{...}'``) apply to every stage, after the
params files. MLflow logging is on when ``MLFLOW_TRACKING_URI`` is set.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from flows.artifacts import publish_stage, publish_summary, summary_table
from tasks.stage import Tracking, code_version, evaluate_stage, output_is_intact, prepare_prompts_task, train_stage

__all__ = ["run_curriculum", "run_tags", "vgrpo"]


def run_tags(variant: str = "") -> dict[str, str]:
    """MLflow tags of every run this flow run opens: the flow run, the library's source hash, the ablation."""
    return {"prefect.flow_run_id": str(flow_run.get_id()), "vgrpo.code_version": code_version(),
            **({"vgrpo.ablation": variant} if variant else {})}  # fmt: skip


def _stage_record(tracking: Tracking | None, trained: dict[str, Any], params: dict[str, Any]) -> str | None:
    """The MLflow run that holds a stage's final evaluation in this flow run: the training run when the stage
    trained here, else a new run marking the cache hit and pointing at the run that trained it."""
    if tracking is None:
        return None
    if trained["flow_run_id"] == str(flow_run.get_id()):
        return str(trained["run_id"])
    from mlflow import MlflowClient

    from tasks.tracking import end_run, log_params, start_run

    client = MlflowClient(tracking.uri)
    tags = {**tracking.tags, "vgrpo.training.stage": trained["name"], "vgrpo.cached": "true",
            "vgrpo.trained_in_run": str(trained["run_id"]), "vgrpo.output": trained["out_dir"],
            "vgrpo.output_hash": trained["hash"], "vgrpo.model_uri": str(trained.get("model_uri"))}  # fmt: skip
    run_id = start_run(client, tracking.experiment, tracking.run_name, tracking.parent_run_id, tags=tags)
    log_params(client, run_id, params)
    end_run(client, run_id)
    return run_id


def run_curriculum(
    stages: list[Any], run_dir: Path, root: str, tracking_uri: str | None, experiment: str, parent: str | None,
    variant: str = "",
) -> list[dict[str, Any]]:  # fmt: skip
    """Every stage in order through the cached tasks; returns each stage's output, hash, run and final evaluation."""
    from tasks.callbacks import log_evaluation

    logger = get_run_logger()
    results: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for cfg in stages:
        params = cfg.model_dump(mode="json")
        init_lora, init_hash = (previous["out_dir"], previous["hash"]) if previous else (None, None)
        tracking = None
        if tracking_uri:
            tags = run_tags(variant)
            run_name = f"{variant}/{cfg.name}" if variant else cfg.name
            tracking = Tracking(tracking_uri, experiment, run_name, parent, tags)
        prompts = prepare_prompts_task(params, root)  # quoted below: Prefect would walk every row of it
        intact = output_is_intact(params, str(run_dir), init_hash)
        if not intact:
            logger.info("stage %s: no intact output under %s; training (or resuming) it", cfg.name, run_dir)
        trained = train_stage.with_options(refresh_cache=not intact)(
            params, init_lora, init_hash, str(run_dir), root, tracking, quote(prompts))  # fmt: skip
        evaluated = evaluate_stage(params, trained["out_dir"], trained["hash"], root)
        record = _stage_record(tracking, trained, params)
        if tracking is not None and record is not None and evaluated["table"] is not None:
            log_evaluation(tracking.uri, record, evaluated, cfg.iterations)
        result = {**trained, "record_run_id": record, "final_eval": evaluated["final_eval"]}
        publish_stage(cfg, result, evaluated, tracking_uri, variant)
        logger.info("stage %s: %s", cfg.name, {k: round(v, 4) for k, v in evaluated["final_eval"].items()
                                                if not k.endswith(("_ci_low", "_ci_high"))})  # fmt: skip
        results.append(result)
        previous = trained
    return results


def _parent_run(tracking_uri: str, spec: Any, variant: str, ablation_file: str | None, overrides: dict[str, Any],
                sweep: str | None, root: str) -> str:  # fmt: skip
    """The curriculum's MLflow run, with the params that vary between runs (the ablation's entries, overrides)."""
    from mlflow import MlflowClient

    from tasks.tracking import log_json, log_params, start_run

    client = MlflowClient(tracking_uri)
    ablation = yaml.safe_load((Path(root) / ablation_file).read_text()) if ablation_file else {}
    tags = run_tags(variant)
    name = variant or str(flow_run.get_name() or "local")
    parent = start_run(client, spec.name, name, parent_run_id=sweep, tags=tags)
    log_params(client, parent, {"curriculum": spec.name, "variant": variant or "-", "ablation": ablation or {},
                                "overrides": overrides}, artifact_file="varying_params.json")  # fmt: skip
    log_json(client, parent, {"curriculum": spec.model_dump(mode="json"), "overrides": overrides,
                              "ablation": ablation_file}, "curriculum.json")  # fmt: skip
    return parent


def _roll_up(tracking_uri: str, parent: str, results: list[dict[str, Any]]) -> None:
    """Each stage's final numbers on the curriculum's run (``<stage>/eval/...``), and the last stage's as
    ``final/eval/...``, so the runs table compares curricula and ablations at the top level."""
    from mlflow import MlflowClient

    from tasks.tracking import end_run, log_metrics

    client = MlflowClient(tracking_uri)
    metrics = {f"{r['name']}/{k}": v for r in results for k, v in r["final_eval"].items()}
    if results:
        metrics.update({f"final/{k}": v for k, v in results[-1]["final_eval"].items()})
    log_metrics(client, parent, metrics, step=0)
    end_run(client, parent)


@flow(name="vgrpo", log_prints=True)
def vgrpo(
    curriculum: str = "params/curricula/embedded.yaml",
    overrides: dict[str, Any] | None = None,
    ablations: list[str] | None = None,
    ablation: str | None = None,
    run_root: str = "runs/curriculum",
    root: str = ".",
    devices: int = 1,
    sweep_run_id: str | None = None,
) -> dict[str, Any]:
    """Run every stage of ``curriculum``; with ``ablations``, once per file, each cell its own flow run (at most
    ``devices`` at once); with ``ablation``, one cell (that file merged after each stage's files). Returns each
    stage's output, hash, MLflow run and final evaluation."""
    from vgrpo.config import load_curriculum
    from vgrpo.errors import ConfigError

    if ablations and ablation:
        raise ConfigError("give ablations (a sweep) or ablation (one cell), not both")
    files = ablations or ([ablation] if ablation else [])
    variants = {Path(a).stem: a for a in files}
    if len(variants) != len(files):
        raise ConfigError(f"ablations: two files share a name: {files}")
    loaded = {name: load_curriculum(Path(root) / curriculum, overrides, root=root,
                                    extra=[str(Path(root) / f)] if f else [])
              for name, f in (variants or {"": None}).items()}  # fmt: skip
    from vgrpo.training.preflight import check_or_raise  # every input of every stage (and cell), before any MLflow run

    check_or_raise([s for _, cell in loaded.values() for s in cell], root, checkpoint_dir=Path(root) / run_root)
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if ablations:
        from flows.sweep import run_sweep

        spec = next(iter(loaded.values()))[0]
        return run_sweep(spec.name, curriculum, ablations, overrides or {}, run_root, root, devices, tracking_uri)
    (variant, (spec, stages)), = loaded.items()  # fmt: skip
    run_dir = Path(root) / run_root / spec.name
    if variant:
        run_dir = run_dir / "ablations" / variant
    parent = _parent_run(tracking_uri, spec, variant, ablation, overrides or {}, sweep_run_id, root) if (
        tracking_uri) else None  # fmt: skip
    from flows.sweep import device_slot

    try:
        with device_slot() if variant else nullcontext():  # a sweep's cell holds a device while it trains
            results = run_curriculum(stages, run_dir, root, tracking_uri, spec.name, parent, variant)
    except BaseException:
        if tracking_uri and parent:
            from mlflow import MlflowClient

            from tasks.tracking import end_run

            end_run(MlflowClient(tracking_uri), parent, "FAILED")
        raise
    table = summary_table(stages, results)
    publish_summary(spec.name, variant, stages, results, run_dir, table)
    get_run_logger().info("%s%s, final evaluation of each stage:\n%s", spec.name,
                          f" ({variant})" if variant else "", table)  # fmt: skip
    if tracking_uri and parent:
        _roll_up(tracking_uri, parent, results)
    return {"curriculum": spec.name, "variant": variant, "stages": results, "run_id": parent}
