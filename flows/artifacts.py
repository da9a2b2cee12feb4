"""What a curriculum run shows in the Prefect UI and leaves on disk: per stage, a table artifact of its final
evaluation, the captioned sample grid and a link to its MLflow run; per curriculum, a table artifact of every
stage's headline numbers, also written to ``<run dir>/results.md`` and ``results.json``."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from tasks.outcome import StageEvaluation, StageOutcome
from vgrpo.atomic import write_text_atomic
from vgrpo.config import StageConfig

__all__ = [
    "artifact_key",
    "hold_markdown",
    "mlflow_run_link",
    "publish_stage",
    "publish_summary",
    "summary_columns",
    "summary_table",
]

MLFLOW_UI = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` listens by default; set ``VGRPO_MLFLOW_UI`` when it runs elsewhere."""


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) from ``parts``."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(p for p in parts if p).lower())).strip("-")


def mlflow_run_link(tracking_uri: str, run_id: str) -> str:
    """The MLflow UI's page of a run (``VGRPO_MLFLOW_UI``, default :data:`MLFLOW_UI`)."""
    experiment = MlflowClient(tracking_uri).get_run(run_id).info.experiment_id
    return f"{os.environ.get('VGRPO_MLFLOW_UI', MLFLOW_UI)}/#/experiments/{experiment}/runs/{run_id}"


def _cell(metrics: dict[str, float], column: str) -> str:
    """``value [low, high]`` of a flat evaluation metric with its bootstrap interval, ``-`` when absent."""
    if column not in metrics:
        return "-"
    low, high = metrics.get(f"{column}_ci_low"), metrics.get(f"{column}_ci_high")
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    return f"{metrics[column]:.3f}{interval}"


def summary_columns(stages: Sequence[StageConfig]) -> list[str]:
    """The headline columns of a curriculum's evaluations: each evaluation reward's headline metrics
    (:meth:`vgrpo.rewards.base.Reward.headline_columns`) but the gains over a baseline, which a stage's evaluation
    has none of."""
    columns: list[str] = []
    for cfg in stages:
        for reward in cfg.evaluation.rewards:
            names = [column.metric for column in reward.headline_columns() if not column.gain]
            columns += [n for n in names if n not in columns]
    return columns


def summary_table(stages: Sequence[StageConfig], results: Sequence[StageOutcome]) -> str:
    """Each stage's final evaluation as a plain-text table, each number with its 95% bootstrap interval over
    prompts."""
    columns = summary_columns(stages)
    header = ["stage", *(c.removeprefix("eval/") + " [95% CI]" for c in columns)]
    rows = [[r.name, *(_cell(r.final_eval, c) for c in columns)] for r in results]
    if any(r.hold is not None for r in results):  # which checkpoint a holding stage exported
        header.append("kept")
        for row, r in zip(rows, results, strict=True):
            row.append("-" if r.hold is None else _kept(r.hold))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [header, *rows])


def _kept(hold: dict[str, Any]) -> str:
    """``iteration K`` of a holding stage's export, ``(stopped at N)`` when it stopped early."""
    stopped = f" (stopped at {hold['stopped_at']})" if hold.get("stopped_at") is not None else ""
    return f"iteration {hold['kept_iteration']}{stopped}"


def hold_markdown(name: str, hold: dict[str, Any]) -> str:
    """A holding stage's checks as a Markdown table, and which checkpoint it exported and why."""
    names = list(hold["reference"])
    lines = [
        f"### {name}: held rewards (reference: {hold['reference_kind']})",
        "",
        f"Exported: **iteration {hold['kept_iteration']}**. {hold['reason']}.",
        "",
        "| iteration | " + " | ".join(names) + " | holds |",
        "|---" * (len(names) + 2) + "|",
        "| floor | " + " | ".join(f"{hold['reference'][n] - hold['tolerances'][n]:.4f}" for n in names) + " | |",
    ]
    for check in hold["checks"]:
        values = " | ".join(f"{check['values'][n]:.4f}" for n in names)
        lines.append(f"| {check['iteration']} | {values} | {'yes' if check['holds'] else 'no'} |")
    return "\n".join(lines)


def _rows(final_eval: dict[str, float]) -> list[dict[str, Any]]:
    names = sorted(k for k in final_eval if not k.endswith(("_ci_low", "_ci_high")))
    return [
        {
            "metric": k.removeprefix("eval/"),
            "value": round(final_eval[k], 4),
            "ci_low": round(final_eval[f"{k}_ci_low"], 4) if f"{k}_ci_low" in final_eval else None,
            "ci_high": round(final_eval[f"{k}_ci_high"], 4) if f"{k}_ci_high" in final_eval else None,
        }
        for k in names
    ]


def publish_stage(
    cfg: StageConfig, outcome: StageOutcome, evaluation: StageEvaluation, tracking_uri: str | None, variant: str
) -> None:
    """The stage's evaluation table, its sample grid (embedded PNG) and a link to its MLflow run."""
    key = artifact_key(variant, cfg.name)
    if evaluation.final_eval:
        description = f"{cfg.name}: final evaluation (95% bootstrap CI over prompts), adapter {outcome.hash}"
        create_table_artifact(table=_rows(evaluation.final_eval), key=f"{key}-evaluation", description=description)
    if evaluation.grid and Path(evaluation.grid).is_file():
        data = base64.b64encode(Path(evaluation.grid).read_bytes()).decode()
        markdown = (
            f"### {cfg.name}: evaluation samples\n\n![grid](data:image/png;base64,{data})"
            "\n\nGreen frame: credited by the detector or OCR."
        )
        create_markdown_artifact(markdown=markdown, key=f"{key}-samples")
    if outcome.hold is not None:
        create_markdown_artifact(markdown=hold_markdown(cfg.name, outcome.hold), key=f"{key}-hold")
    if tracking_uri and outcome.record_run_id:
        link = mlflow_run_link(tracking_uri, outcome.record_run_id)
        create_link_artifact(link=link, key=f"{key}-mlflow", link_text=f"MLflow run of {cfg.name}")


def publish_summary(
    name: str,
    variant: str,
    stages: Sequence[StageConfig],
    results: Sequence[StageOutcome],
    run_dir: Path,
    table: str,
) -> list[dict[str, Any]]:
    """Every stage's headline numbers: a table artifact, ``results.md`` (the plain-text table) and
    ``results.json`` (every outcome but its per-iteration history) beside the stage outputs; returns what
    ``results.json`` holds."""
    columns = summary_columns(stages)
    rows = [
        {
            "stage": r.name,
            "iterations": len(r.history),
            "adapter": r.hash,
            **({"kept_iteration": r.hold["kept_iteration"]} if r.hold is not None else {}),
            **{c.removeprefix("eval/"): round(r.final_eval[c], 4) for c in columns if c in r.final_eval},
        }
        for r in results
    ]
    create_table_artifact(
        table=rows,
        key=artifact_key(name, variant, "stages"),
        description=f"{name}{f' ({variant})' if variant else ''}: final evaluation of each stage",
    )
    summary = [r.to_json(history=False) for r in results]
    write_text_atomic(run_dir / "results.md", table + "\n")
    write_text_atomic(run_dir / "results.json", json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    return summary
