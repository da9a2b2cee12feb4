"""The ablation sweep flow: the curriculum once per ablation params file, each cell a run of the curriculum flow
(:mod:`flows.curriculum`).

Started from a deployment (``prefect deployment run vgrpo-sweep/ablation-sweep``), the sweep submits one run of the
cells' deployment (:data:`CELL_DEPLOYMENT`, the curriculum flow) per cell and waits for them: whatever serves or
works that deployment runs the cells, several at once, and a global concurrency limit (:mod:`flows.devices`,
``devices`` slots: one per GPU) caps how many train at the same time. Called as a plain flow, the cells run one
after another as subflows. Every cell's curriculum run is nested under one sweep run in MLflow.

Every cell is validated, and every input it names checked, before the first cell starts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from mlflow import MlflowClient
from prefect import flow, get_client, get_run_logger
from prefect.client.schemas.objects import FlowRun, State
from prefect.deployments import run_deployment
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run

from flows.curriculum import check_flow_paths, curriculum_flow, load_cells, run_tags
from flows.devices import set_device_limit
from flows.recovery import SWEEP_FLOW_NAME, check_attempts
from tasks.stage_store import run_key
from tasks.store import Store
from tasks.tracking import end_run, log_json, log_params, start_run
from vgrpo.errors import ConfigError

__all__ = ["CELL_DEPLOYMENT", "ablation_sweep"]

CELL_DEPLOYMENT = "vgrpo/ablation-cell"
"""The deployment of the curriculum flow that runs a sweep's cells (:mod:`flows.deploy`)."""

POLL_S = 2.0

RETRY_WAIT_S = 60.0
"""Seconds a crashed cell may stay ``Crashed`` before the sweep counts it failed: the pool's recovery automation
(:mod:`flows.recovery`) schedules it again within seconds, and it then runs on another worker."""


def _wait(run_ids: list[UUID]) -> dict[UUID, State[Any]]:
    """Poll the cells' flow runs until every one is final; returns their last states. A crashed cell is final
    only once it has stayed crashed for :data:`RETRY_WAIT_S` (not retried)."""
    crashed_since: dict[UUID, float] = {}
    with get_client(sync_client=True) as client:
        while True:
            runs = {rid: client.read_flow_run(rid) for rid in run_ids}
            now = time.monotonic()
            for rid, r in runs.items():
                if r.state is not None and r.state.is_crashed():
                    crashed_since.setdefault(rid, now)
                else:
                    crashed_since.pop(rid, None)

            retried = {rid for rid, since in crashed_since.items() if now - since < RETRY_WAIT_S}
            if all(r.state is not None and r.state.is_final() and rid not in retried for rid, r in runs.items()):
                return {rid: r.state for rid, r in runs.items() if r.state is not None}
            time.sleep(POLL_S)


def _sweep_run(tracking_uri: str, name: str, ablations: list[str], devices: int, overrides: dict[str, Any]) -> str:
    """The sweep's MLflow run: the cells' names, the devices and the overrides."""
    client = MlflowClient(tracking_uri)
    sweep = start_run(client, name, f"sweep/{flow_run.get_name() or 'local'}", tags=run_tags())
    varying = {"ablations": [Path(a).stem for a in ablations], "devices": devices, "overrides": overrides}
    log_params(client, sweep, varying, artifact_file="sweep.json")
    log_json(client, sweep, {"ablations": ablations, "overrides": overrides}, "ablations.json")
    return sweep


@flow(name=SWEEP_FLOW_NAME, log_prints=True)
def ablation_sweep(
    curriculum: str = "params/curricula/embedded-ablation.yaml",
    ablations: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    run_root: str = "runs/curriculum",
    root: str = ".",
    devices: int = 1,
    cell_deployment: str = CELL_DEPLOYMENT,
) -> dict[str, Any]:
    """Run the curriculum once per file of ``ablations`` (merged after every stage's params), at most
    ``devices`` cells training at once, under one MLflow sweep run; returns each cell's stage outcomes, read
    from the ``results.json`` each cell writes. From a deployment, each cell is a run of ``cell_deployment``
    (``flow/deployment``: a deployment of :func:`flows.curriculum.curriculum_flow`)."""
    check_attempts()
    ablations = list(ablations or [])
    if not ablations:
        raise ConfigError("ablations: give at least one ablation params file")
    if devices < 1:  # a limit of no slots would leave every cell waiting for one, forever
        raise ConfigError(f"devices: {devices}: at least 1 (the cells training at once)")
    overrides = overrides or {}
    check_flow_paths(root, run_root, curriculum, ablations)
    cells = load_cells(curriculum, overrides, ablations, root, run_root)
    name = next(iter(cells.values()))[0].name
    logger = get_run_logger()
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI")
    sweep = _sweep_run(tracking_uri, name, ablations, devices, overrides) if tracking_uri else None
    cell: dict[str, Any] = {"curriculum": curriculum, "overrides": overrides, "run_root": run_root, "root": root}
    cell["sweep_run_id"] = sweep
    failed: list[str] = []
    if current_deployment.get_id() is not None:
        set_device_limit(devices)
        runs = {
            a: cast(
                FlowRun,
                run_deployment(
                    cell_deployment, parameters={**cell, "ablation": a}, timeout=0, flow_run_name=f"cell-{Path(a).stem}"
                ),
            )
            for a in ablations
        }
        submitted = {Path(a).stem: r.name for a, r in runs.items()}
        logger.info("submitted %d cells (at most %d training at once): %s", len(runs), devices, submitted)
        states = _wait([r.id for r in runs.values()])
        failed = [a for a, r in runs.items() if not states[r.id].is_completed()]
    else:
        for a in ablations:
            try:
                curriculum_flow(**cell, ablation=a)
            except Exception as exc:  # the other cells still run; the sweep fails at the end
                logger.error("cell %s failed: %s", a, exc)
                failed.append(a)
    out: dict[str, Any] = {"curriculum": name, "ablations": {}, "run_id": sweep}
    store = Store.from_env()
    for a in ablations:
        cell_dir = Path(root) / run_root / name / "ablations" / Path(a).stem
        results = cell_dir / "results.json"
        if a in failed:
            continue
        if results.is_file():
            out["ablations"][Path(a).stem] = json.loads(results.read_text())
        elif store is not None:  # the cell ran on another machine: its summary from the store
            summary = store.get_json(f"{run_key(cell_dir, root)}/results.json")
            if summary is not None:
                out["ablations"][Path(a).stem] = summary
    if tracking_uri and sweep:
        end_run(MlflowClient(tracking_uri), sweep, "FAILED" if failed else "FINISHED")
    if failed:
        raise RuntimeError(f"sweep {name}: cells failed: {failed}")
    return out
