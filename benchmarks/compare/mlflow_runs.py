"""The grid's cells as MLflow runs: one run per cell under one parent run per grid, the claims on the parent."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.compare.verdicts import Row


def track(records: dict[str, dict[str, Any]], tracking_uri: str, *, grid: str, claims: Sequence[Row] = ()) -> None:
    """One MLflow run per cell under one parent run of the grid: the spec as params (the columns to compare),
    the held-out curve as a metric history (step = iteration), the costs as metrics. Idempotent: a cell already
    logged (tag ``bench.cell``) is skipped, so a resumed grid adds only its new cells."""
    # mlflow is the ``pipeline`` extra's: the report needs it only when it writes the runs.
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    name = "vgrpo-benchmarks"
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name)
    parents = client.search_runs([exp_id], f"tags.`bench.grid` = '{grid}' and tags.`bench.role` = 'parent'")
    parent = (
        parents[0].info.run_id
        if parents
        else client.create_run(
            exp_id, run_name=f"bench-{grid}", tags={"bench.grid": grid, "bench.role": "parent"}
        ).info.run_id
    )
    logged = {
        r.data.tags.get("bench.cell")
        for r in client.search_runs(
            [exp_id], f"tags.`bench.grid` = '{grid}' and tags.`bench.role` = 'cell'", max_results=5000
        )
    }
    for cell, rec in records.items():
        if cell in logged:
            continue
        spec = rec["spec"]
        run = client.create_run(
            exp_id,
            run_name=cell,
            tags={"bench.grid": grid, "bench.role": "cell", "bench.cell": cell, "mlflow.parentRunId": parent},
        )
        rid = run.info.run_id
        params = {k: str(v) for k, v in spec.items() if k != "overrides"}
        params["overrides"] = json.dumps(spec.get("overrides", {}), sort_keys=True)
        metrics: list[Any] = []
        for p in rec["curve"]:
            step = int(p["iteration"])
            for key in ("score", "partial", "clipscore", "train_s", "gradient_steps", "nfe"):
                if key in p:
                    metrics.append(mlflow.entities.Metric(f"heldout/{key}", float(p[key]), 0, step))
        for key in ("surrogate_cv", "surrogate_cv_within_group", "peak_rss_mb", "wall_s"):
            if rec.get(key) is not None:
                metrics.append(mlflow.entities.Metric(key, float(rec[key]), 0, 0))
        for key, v in (rec.get("time_split_s") or {}).items():
            if v is not None:
                metrics.append(mlflow.entities.Metric(f"time/{key}_s", float(v), 0, 0))
        client.log_batch(rid, metrics=metrics, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
        client.set_terminated(rid, "FAILED" if rec.get("diverged") else "FINISHED")
    for row in claims:  # the claims table on the parent, so the grid reads at the top level
        if row.estimate is not None:
            for suffix, v in (("", row.estimate), ("_low", row.low), ("_high", row.high)):
                if math.isfinite(v):
                    client.log_metric(parent, f"claim_{row.id}{suffix}", float(v))
        client.set_tag(parent, f"claim_{row.id}", f"{row.claim}: {row.verdict}")
