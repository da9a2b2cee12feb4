"""The ``vgrpo`` flow: a curriculum's stages in order, each from the previous stage's adapter, one MLflow
run per stage nested under the curriculum's run.

    prefect deployment run vgrpo/embedded-curriculum --watch     (with the server and `python -m flows.deploy`)

All params are validated before the first stage starts (:func:`vgrpo.config.load_curriculum`); ``overrides``
(``-p overrides='{...}'``) apply to every stage.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from tasks.stage import code_version, train_stage

__all__ = ["vgrpo"]


@flow(name="vgrpo", log_prints=True)
def vgrpo(
    curriculum: str = "params/curricula/embedded.yaml",
    overrides: dict[str, Any] | None = None,
    run_root: str = "runs/curriculum",
    root: str = ".",
) -> dict[str, Any]:
    """Run every stage of ``curriculum``; returns each stage's output, hash and final evaluation."""
    from vgrpo.config import load_curriculum

    spec, stages = load_curriculum(Path(root) / curriculum, overrides, root=root)
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI")
    client = parent = None
    if tracking_uri:
        from mlflow import MlflowClient

        from tasks.tracking import log_json, start_run

        client = MlflowClient(tracking_uri)
        tags = {"prefect.flow_run_id": str(flow_run.get_id()), "vgrpo.code_version": code_version()}
        parent = start_run(client, spec.name, f"{spec.name}-{flow_run.get_name() or 'local'}", tags=tags)
        log_json(client, parent, {"curriculum": spec.model_dump(mode="json"), "overrides": overrides or {}},
                 "curriculum.json")  # fmt: skip
    results: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    run_dir = str(Path(root) / run_root / spec.name)
    for cfg in stages:
        previous = train_stage(
            cfg.model_dump(mode="json"),
            init_lora=previous["out_dir"] if previous else None,
            init_hash=previous["hash"] if previous else None,
            run_root=run_dir, root=root, tracking_uri=tracking_uri, parent_run_id=parent, experiment=spec.name,
        )  # fmt: skip
        results.append(previous)
        print(f"stage {cfg.name}: {previous['final_eval']}")
    if client is not None and parent is not None:
        from tasks.tracking import end_run

        end_run(client, parent)
    return {"curriculum": spec.name, "stages": results}
