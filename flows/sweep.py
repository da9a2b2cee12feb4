"""An ablation sweep: the curriculum once per ablation params file, each cell its own flow run.

Started from a deployment (``prefect deployment run vgrpo/ablation-sweep``), the sweep submits one run of the
same deployment per cell and waits for them: whatever serves or works the deployment runs the cells, several at
once, and a global concurrency limit (:data:`DEVICE_LIMIT`, ``devices`` slots: one per GPU) caps how many
train at the same time. Called as a plain flow, the cells run one after another as subflows. Every cell's
curriculum run is nested under one sweep run in MLflow.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import get_client, get_run_logger
from prefect.runtime import flow_run

__all__ = ["DEVICE_LIMIT", "device_slot", "run_sweep"]

DEVICE_LIMIT = "vgrpo-devices"
POLL_S = 2.0


@contextmanager
def device_slot() -> Iterator[None]:
    """Hold one slot of :data:`DEVICE_LIMIT` while a cell trains (no limit when the limit does not exist, as in
    a cell run outside a sweep)."""
    from prefect.concurrency.sync import concurrency

    with concurrency(DEVICE_LIMIT, occupy=1, strict=False):
        yield


def _set_device_limit(devices: int) -> None:
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(DEVICE_LIMIT, devices)


def _wait(run_ids: list[UUID]) -> dict[UUID, Any]:
    """Poll the cells' flow runs until every one is final; returns their last states."""
    with get_client(sync_client=True) as client:
        while True:
            runs = {rid: client.read_flow_run(rid) for rid in run_ids}
            if all(r.state is not None and r.state.is_final() for r in runs.values()):
                return {rid: r.state for rid, r in runs.items()}
            time.sleep(POLL_S)


def run_sweep(
    name: str, curriculum: str, ablations: list[str], overrides: dict[str, Any], run_root: str, root: str,
    devices: int, tracking_uri: str | None,
) -> dict[str, Any]:  # fmt: skip
    """Run the cells (each file of ``ablations`` merged after every stage's params) under one MLflow sweep run;
    returns each cell's stage results, read from the ``results.json`` each cell writes."""
    logger = get_run_logger()
    sweep = None
    if tracking_uri:
        from mlflow import MlflowClient

        from flows.curriculum import run_tags
        from tasks.tracking import log_json, log_params, start_run

        client = MlflowClient(tracking_uri)
        sweep = start_run(client, name, f"sweep/{flow_run.get_name() or 'local'}", tags=run_tags())
        log_params(client, sweep, {"ablations": [Path(a).stem for a in ablations], "devices": devices,
                                   "overrides": overrides}, artifact_file="sweep.json")  # fmt: skip
        log_json(client, sweep, {"ablations": ablations, "overrides": overrides}, "ablations.json")
    cell = {"curriculum": curriculum, "overrides": overrides, "run_root": run_root, "root": root,
            "sweep_run_id": sweep, "ablations": None}  # fmt: skip
    from prefect.runtime import deployment as current_deployment

    deployment = current_deployment.get_id()
    failed: list[str] = []
    if deployment is not None:
        from prefect.deployments import run_deployment

        _set_device_limit(devices)
        runs = {a: run_deployment(UUID(deployment), parameters={**cell, "ablation": a}, timeout=0,
                                  flow_run_name=f"cell-{Path(a).stem}") for a in ablations}  # fmt: skip
        logger.info("submitted %d cells (at most %d training at once): %s", len(runs), devices,
                    {Path(a).stem: r.name for a, r in runs.items()})  # fmt: skip
        states = _wait([r.id for r in runs.values()])
        failed = [a for a, r in runs.items() if not states[r.id].is_completed()]
    else:
        from flows.curriculum import vgrpo

        for a in ablations:
            try:
                vgrpo(**{**cell, "ablation": a, "devices": devices})
            except Exception as exc:  # the other cells still run; the sweep fails at the end
                logger.error("cell %s failed: %s", a, exc)
                failed.append(a)
    out: dict[str, Any] = {"curriculum": name, "ablations": {}, "run_id": sweep}
    for a in ablations:
        results = Path(root) / run_root / name / "ablations" / Path(a).stem / "results.json"
        if a not in failed and results.is_file():
            out["ablations"][Path(a).stem] = json.loads(results.read_text())
    if tracking_uri and sweep:
        from mlflow import MlflowClient

        from tasks.tracking import end_run

        end_run(MlflowClient(tracking_uri), sweep, "FAILED" if failed else "FINISHED")
    if failed:
        raise RuntimeError(f"sweep {name}: cells failed: {failed}")
    return out
