"""The ``vgrpo`` flow: a curriculum's stages in order, each from the previous stage's adapter, one MLflow
run per stage nested under the curriculum's run; with ``ablations``, the curriculum once per ablation params
file, each nested under one sweep run.

    prefect deployment run vgrpo/embedded-curriculum --watch     (with the server and `python -m flows.deploy`)

All params (of every ablation too) are validated before the first stage starts
(:func:`vgrpo.config.load_curriculum`); ``overrides`` (``-p overrides='{...}'``) apply to every stage, after the
params files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from tasks.stage import code_version, train_stage

__all__ = ["summary_table", "vgrpo"]


def _cell(metrics: dict[str, float], column: str) -> str:
    """``value [low, high]`` of a flat evaluation metric with its bootstrap interval, ``-`` when absent."""
    if column not in metrics:
        return "-"
    low, high = metrics.get(f"{column}_ci_low"), metrics.get(f"{column}_ci_high")
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    return f"{metrics[column]:.3f}{interval}"


def summary_table(stages: list[Any], results: list[dict[str, Any]]) -> str:
    """Each stage's final evaluation as a plain-text table: GenEval strict and partial, then each other
    evaluation reward's mean, each with its 95% bootstrap interval over prompts."""
    columns: list[str] = []
    for cfg in stages:
        for reward in cfg.evaluation.rewards:
            key = reward.key or reward.name
            names = [f"eval/{key}_geneval_strict", f"eval/{key}_geneval_partial"] if reward.name == "geneval" else [
                f"eval/{key}"]  # fmt: skip
            columns += [n for n in names if n not in columns]
    header = ["stage", *(c.removeprefix("eval/") + " [95% CI]" for c in columns)]
    rows = [[r["name"], *(_cell(r["final_eval"], c) for c in columns)] for r in results]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [header, *rows])


def _run_stages(
    stages: list[Any], run_dir: str, root: str, tracking_uri: str | None, parent: str | None, experiment: str
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for cfg in stages:
        previous = train_stage(
            cfg.model_dump(mode="json"),
            init_lora=previous["out_dir"] if previous else None,
            init_hash=previous["hash"] if previous else None,
            run_root=run_dir, root=root, tracking_uri=tracking_uri, parent_run_id=parent, experiment=experiment,
        )  # fmt: skip
        results.append(previous)
        print(f"stage {cfg.name}: {previous['final_eval']}")
    return results


@flow(name="vgrpo", log_prints=True)
def vgrpo(
    curriculum: str = "params/curricula/embedded.yaml",
    overrides: dict[str, Any] | None = None,
    ablations: list[str] | None = None,
    run_root: str = "runs/curriculum",
    root: str = ".",
) -> dict[str, Any]:
    """Run every stage of ``curriculum`` (once per file of ``ablations`` when given, each merged after the
    stage files); returns each stage's output, hash and final evaluation."""
    from vgrpo.config import ConfigError, load_curriculum

    variants: dict[str, list[str]] = {"": []}
    if ablations:
        variants = {Path(a).stem: [str(Path(root) / a)] for a in ablations}
        if len(variants) != len(ablations):
            raise ConfigError(f"ablations: two files share a name: {ablations}")
    loaded = {name: load_curriculum(Path(root) / curriculum, overrides, root=root, extra=extra)
              for name, extra in variants.items()}  # fmt: skip
    spec = next(iter(loaded.values()))[0]
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI")
    client = sweep = None
    tags = {"prefect.flow_run_id": str(flow_run.get_id()), "vgrpo.code_version": code_version()}
    if tracking_uri:
        from mlflow import MlflowClient

        from tasks.tracking import log_json, start_run

        client = MlflowClient(tracking_uri)
        if ablations:
            sweep = start_run(client, spec.name, f"{spec.name}-sweep-{flow_run.get_name() or 'local'}", tags=tags)
            log_json(client, sweep, {"ablations": ablations, "overrides": overrides or {}}, "sweep.json")
    out: dict[str, Any] = {"curriculum": spec.name}
    for variant, (spec, stages) in loaded.items():
        parent = None
        if client is not None:
            from tasks.tracking import log_json, start_run

            name = f"{spec.name}-{variant or flow_run.get_name() or 'local'}"
            parent = start_run(client, spec.name, name, parent_run_id=sweep,
                               tags={**tags, **({"vgrpo.ablation": variant} if variant else {})})  # fmt: skip
            log_json(client, parent, {"curriculum": spec.model_dump(mode="json"), "overrides": overrides or {},
                                      "ablation": variants[variant]}, "curriculum.json")  # fmt: skip
        run_dir = Path(root) / run_root / spec.name
        if variant:
            run_dir = run_dir / "ablations" / variant
        results = _run_stages(stages, str(run_dir), root, tracking_uri, parent, spec.name)
        print(f"{spec.name}{f' ({variant})' if variant else ''}, final evaluation of each stage:\n"
              f"{summary_table(stages, results)}")  # fmt: skip
        if client is not None and parent is not None:
            from tasks.tracking import end_run

            end_run(client, parent)
        if variant:
            out.setdefault("ablations", {})[variant] = results
        else:
            out["stages"] = results
    if client is not None and sweep is not None:
        from tasks.tracking import end_run

        end_run(client, sweep)
    return out
