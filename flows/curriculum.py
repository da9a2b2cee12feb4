"""The curriculum flow: a curriculum's stages in order, each from the previous stage's adapter.

Per stage the flow runs ``prepare-prompts`` (cached on the prompt files), ``train-stage`` (cached on the training
params and starting adapter; every phase of every iteration is its own task run, ``s2-geneval/rollout-0042``)
and ``evaluate`` (cached on the adapter and the evaluation settings), then publishes a table artifact of the
evaluation, the sample grid and a link to the stage's MLflow run. With ``ablation``, the curriculum is one cell of
an ablation sweep (:mod:`flows.sweep`): that params file is merged after each stage's files.

    prefect deployment run vgrpo/embedded-curriculum --watch     (with a server and `python -m flows.deploy`)

``until`` (``-p until=s2-geneval``) stops after that stage; a later run goes on from the stages done (its cache, or
on another machine the shared store).

The params are validated, and every input they name checked (:func:`load_cells`), before the first stage starts
and before any MLflow run opens; ``overrides`` (``-p overrides='{...}'``) apply to every stage, after the params
files. MLflow logging is on when ``MLFLOW_TRACKING_URI`` is set.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

from mlflow import MlflowClient
from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from flows.artifacts import publish_stage, publish_summary, summary_table
from flows.devices import device_slot, local_devices
from flows.recovery import CURRICULUM_FLOW_NAME, check_attempts
from flows.time_split import flow_split, format_split, stage_times
from flows.watch import write_stage_state
from tasks.callbacks import log_evaluation
from tasks.outcome import StageOutcome
from tasks.stage import code_version, output_is_intact
from tasks.stage_layout import check_project_root, checked_relative
from tasks.stage_store import restore_stage, run_key
from tasks.stage_tasks import evaluate_task, prepare_prompts_task, train_task
from tasks.store import Store, check_results_stay_local
from tasks.tracking import Tracking, end_run, log_json, log_metrics, log_params, start_run
from vgrpo.atomic import write_json_atomic
from vgrpo.config import CurriculumConfig, StageConfig, load_curriculum, read_params
from vgrpo.errors import ConfigError
from vgrpo.outputs import Output
from vgrpo.training.preflight import check_or_raise
from vgrpo.training.prompt_rows import StagePrompts

__all__ = ["Cell", "check_flow_paths", "curriculum_flow", "load_cells", "run_curriculum", "run_tags"]

Cell = tuple[CurriculumConfig, list[StageConfig]]
"""A curriculum as one run trains it: its spec and its validated stages."""


def load_cells(
    curriculum: str, overrides: dict[str, Any] | None, ablations: Sequence[str], root: str, run_root: str
) -> dict[str, Cell]:
    """Each cell of a run, by its variant name (an ablation file's stem; ``""`` without ablations): the
    curriculum with that file merged after each stage's files. Every stage of every cell is validated and every
    input it names checked (:func:`vgrpo.training.preflight.check_or_raise`) before anything runs."""
    variants: dict[str, str | None] = {Path(a).stem: a for a in ablations}
    if len(variants) != len(ablations):
        raise ConfigError(f"ablations: two files share a name: {list(ablations)}")
    cells = {
        name: load_curriculum(Path(root) / curriculum, overrides, root=root, extra=[str(Path(root) / f)] if f else [])
        for name, f in (variants or {"": None}).items()
    }
    stages = [s for _, stages in cells.values() for s in stages]
    written = [Output("run_root", Path(root) / run_root, replaced=False)]
    check_or_raise(stages, root, checkpoint_dir=Path(root) / run_root, outputs=written)
    return cells


def check_flow_paths(root: str, run_root: str, curriculum: str, ablations: Sequence[str]) -> None:
    """A flow run's parameters that become paths, checked before anything runs: ``root`` an existing folder, the
    others without a ``..`` part (a relative one then lies inside ``root``; an absolute one is an explicit choice,
    as a CLI's ``--out``). What a run replaces or deletes lies under ``run_root/stages/<stage>`` and
    ``run_root/work/<stage>``, stage names being plain folder names. A :class:`ConfigError` naming the parameter."""
    check_project_root(root)
    checked_relative("run_root", run_root, absolute=True)
    checked_relative("curriculum", curriculum, absolute=True)
    for a in ablations:
        checked_relative("ablations", a, absolute=True)


def run_tags(variant: str = "") -> dict[str, str]:
    """MLflow tags of every run this flow run opens: the flow run, the code's hash, the ablation."""
    tags = {"prefect.flow_run_id": str(flow_run.get_id()), "vgrpo.code_version": code_version()}
    return {**tags, "vgrpo.ablation": variant} if variant else tags


def _stage_record(tracking: Tracking | None, trained: StageOutcome, cfg: StageConfig) -> str | None:
    """The MLflow run that holds a stage's final evaluation in this flow run: the training run when the stage
    trained here, else a new run marking the cache hit and pointing at the run that trained it."""
    if tracking is None:
        return None
    if trained.flow_run_id == str(flow_run.get_id()):
        return trained.run_id
    client = MlflowClient(tracking.uri)
    tags = {
        **tracking.tags,
        "vgrpo.training.stage": trained.name,
        "vgrpo.cached": "true",
        "vgrpo.trained_in_run": str(trained.run_id),
        "vgrpo.output": trained.out_dir,
        "vgrpo.output_hash": trained.hash,
        "vgrpo.model_uri": str(trained.model_uri),
    }
    run_id = start_run(client, tracking.experiment, tracking.run_name, tracking.parent_run_id, tags=tags)
    log_params(client, run_id, cfg.model_dump(mode="json"))
    end_run(client, run_id)
    return run_id


def run_curriculum(
    stages: Sequence[StageConfig],
    run_dir: Path,
    root: str,
    tracking_uri: str | None,
    experiment: str,
    parent: str | None,
    variant: str = "",
    times: list[dict[str, float]] | None = None,
) -> list[StageOutcome]:
    """Every stage in order through the cached tasks; returns each stage's outcome with its final evaluation.
    Where the run stands goes to ``run_dir/progress.json`` (:func:`flows.watch.write_stage_state`), and each
    stage's seconds by part (:func:`flows.time_split.stage_times`) to ``times`` when given."""
    logger = get_run_logger()
    store = Store.from_env()
    results: list[StageOutcome] = []
    previous: StageOutcome | None = None
    names = [cfg.name for cfg in stages]
    for index, cfg in enumerate(stages):
        write_stage_state(run_dir, names, index, "preparing prompts")
        clock = time.perf_counter()
        init_lora, init_hash = (previous.out_dir, previous.hash) if previous else (None, None)
        tracking = None
        if tracking_uri:
            run_name = f"{variant}/{cfg.name}" if variant else cfg.name
            tracking = Tracking(tracking_uri, experiment, run_name, parent, run_tags(variant))
        prompts = prepare_prompts_task(cfg, root)
        prompts_s, clock = time.perf_counter() - clock, time.perf_counter()
        intact = output_is_intact(cfg, str(run_dir), init_hash)
        # Another machine may have finished this stage: its manifest, and the adapter it names by content hash.
        if not intact and store is not None and restore_stage(store, run_dir, cfg.name, root):
            logger.info("stage %s: its output from the store (%s)", cfg.name, store.url)
            intact = output_is_intact(cfg, str(run_dir), init_hash)
        if not intact:
            logger.info("stage %s: no intact output under %s; training (or resuming) it", cfg.name, run_dir)
        quoted = cast(StagePrompts, quote(prompts))  # Prefect would otherwise walk every row of it
        write_stage_state(run_dir, names, index, "training" if not intact else "cached")
        clock = time.perf_counter()
        trained = train_task.with_options(refresh_cache=not intact)(
            cfg, init_lora, init_hash, str(run_dir), root, tracking, quoted
        )
        train_s, clock = time.perf_counter() - clock, time.perf_counter()
        write_stage_state(run_dir, names, index, "evaluating")
        evaluation = evaluate_task(cfg, trained.out_dir, trained.hash, root)
        evaluate_s = time.perf_counter() - clock
        timings = trained.timings if trained.flow_run_id == str(flow_run.get_id()) else {}  # not a cache hit
        if times is not None:
            times.append(stage_times(timings, prompts_s, train_s, evaluate_s))
        record = _stage_record(tracking, trained, cfg)
        if tracking is not None and record is not None:
            log_evaluation(tracking.uri, record, evaluation, cfg.iterations)
        outcome = trained.evaluated(evaluation, cfg.iterations).replace(record_run_id=record)
        publish_stage(cfg, outcome, evaluation, tracking_uri, variant)
        headline = {k: round(v, 4) for k, v in outcome.final_eval.items() if not k.endswith(("_ci_low", "_ci_high"))}
        logger.info("stage %s: %s", cfg.name, headline)
        results.append(outcome)
        previous = trained
    write_stage_state(run_dir, names, len(names) - 1, "done")
    return results


def _parent_run(
    tracking_uri: str,
    spec: CurriculumConfig,
    variant: str,
    ablation_file: str | None,
    overrides: dict[str, Any],
    sweep: str | None,
    root: str,
) -> str:
    """The curriculum's MLflow run, with the params that vary between runs (the ablation's entries, overrides)."""
    client = MlflowClient(tracking_uri)
    ablation = read_params(Path(root) / ablation_file) if ablation_file else {}
    name = variant or str(flow_run.get_name() or "local")
    parent = start_run(client, spec.name, name, parent_run_id=sweep, tags=run_tags(variant))
    varying = {"curriculum": spec.name, "variant": variant or "-", "ablation": ablation or {}, "overrides": overrides}
    log_params(client, parent, varying, artifact_file="varying_params.json")
    written = {"curriculum": spec.model_dump(mode="json"), "overrides": overrides, "ablation": ablation_file}
    log_json(client, parent, written, "curriculum.json")
    return parent


def _roll_up(tracking_uri: str, parent: str, results: list[StageOutcome]) -> None:
    """Each stage's final numbers on the curriculum's run (``<stage>/eval/...``), and the last stage's as
    ``final/eval/...``, so the runs table compares curricula and ablations at the top level."""
    client = MlflowClient(tracking_uri)
    metrics = {f"{r.name}/{k}": v for r in results for k, v in r.final_eval.items()}
    if results:
        metrics.update({f"final/{k}": v for k, v in results[-1].final_eval.items()})
    log_metrics(client, parent, metrics, step=0)
    end_run(client, parent)


def run_cell(
    cell: Cell,
    variant: str,
    ablation: str | None,
    overrides: dict[str, Any],
    run_root: str,
    root: str,
    sweep_run_id: str | None,
) -> dict[str, Any]:
    """One validated curriculum (``variant`` a sweep's cell, ``""`` the curriculum alone) under its MLflow run;
    returns what the flow returns."""
    spec, stages = cell
    started = time.perf_counter()
    run_dir = Path(root) / run_root / spec.name
    if variant:
        run_dir = run_dir / "ablations" / variant
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI")
    parent = None
    if tracking_uri:
        parent = _parent_run(tracking_uri, spec, variant, ablation, overrides, sweep_run_id, root)
    try:
        # A sweep's cell holds a slot of the sweep's devices; every run holds this machine's devices it trains on.
        per_machine = max(cfg.launch.processes_per_machine for cfg in stages)
        with device_slot() if variant else nullcontext(), local_devices(per_machine):
            times: list[dict[str, float]] = []
            results = run_curriculum(stages, run_dir, root, tracking_uri, spec.name, parent, variant, times)
    except BaseException:
        if tracking_uri and parent:
            end_run(MlflowClient(tracking_uri), parent, "FAILED")
        raise
    table = summary_table(stages, results)
    summary = publish_summary(spec.name, variant, stages, results, run_dir, table)
    store = Store.from_env()
    if store is not None:  # a sweep's run may read it on another machine
        store.put_json(f"{run_key(run_dir, root)}/results.json", summary)
    named = f"{spec.name} ({variant})" if variant else spec.name
    get_run_logger().info("%s, final evaluation of each stage:\n%s", named, table)
    if tracking_uri and parent:
        _roll_up(tracking_uri, parent, results)
    split = flow_split(times, time.perf_counter() - started)
    by_stage = dict(zip([cfg.name for cfg in stages], times, strict=True))
    write_json_atomic(run_dir / "time_split.json", {"split": split, "stages": by_stage})
    get_run_logger().info("%s, wall time by part:\n%s", named, format_split(split))
    return {"curriculum": spec.name, "variant": variant, "stages": [r.to_json() for r in results], "run_id": parent}


@flow(name=CURRICULUM_FLOW_NAME, log_prints=True)
def curriculum_flow(
    curriculum: str = "params/curricula/embedded.yaml",
    overrides: dict[str, Any] | None = None,
    ablation: str | None = None,
    run_root: str = "runs/curriculum",
    root: str = ".",
    sweep_run_id: str | None = None,
    until: str | None = None,
) -> dict[str, Any]:
    """Run every stage of ``curriculum`` (with ``ablation``: one cell of a sweep, that file merged after each
    stage's files), or those up to the stage named ``until``. Returns each stage's outcome (output, hash, MLflow
    runs, final evaluation) as JSON."""
    check_attempts()
    check_results_stay_local(Store.from_env())
    check_flow_paths(root, run_root, curriculum, [ablation] if ablation else [])
    cells = load_cells(curriculum, overrides, [ablation] if ablation else [], root, run_root)
    ((variant, (spec, stages)),) = cells.items()
    if until is not None:
        names = [cfg.name for cfg in stages]
        if until not in names:
            raise ConfigError(f"until: {until!r} is not a stage of {spec.name}: {names}")
        stages = stages[: names.index(until) + 1]
    return run_cell((spec, stages), variant, ablation, overrides or {}, run_root, root, sweep_run_id)
