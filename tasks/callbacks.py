"""A stage's MLflow run as :class:`vgrpo.training.stage.StageCallbacks`: per-iteration metrics, evaluations (numbers,
table, captioned grid), skipped iterations, system metrics, and the trained adapter as a registered model.

A resumed stage continues the run its checkpoint names (``run_state``), so one stage has one run and one curve.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import mlflow
import mlflow.diffusers
import numpy as np
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models.signature import ModelSignature
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema

from tasks.outcome import StageEvaluation
from tasks.tracking import Tracking, end_run, log_image, log_json, log_metrics, log_params, start_run
from vgrpo.checkpoints.state import LORA_FILE
from vgrpo.config import StageConfig
from vgrpo.evaluation.grids import grid_image, grid_of
from vgrpo.evaluation.tables import flat_metrics
from vgrpo.training.stage import FanOut, ProgressView, StageCallbacks

__all__ = ["SYSTEM_METRICS_INTERVAL_S", "FanOut", "StageTracker", "log_adapter_model", "log_evaluation", "model_alias"]

SYSTEM_METRICS_INTERVAL_S = 10.0
"""Seconds between system-metric samples (CPU, memory, disk, GPU) logged to a stage's run, unless
``VGRPO_SYSTEM_METRICS_INTERVAL_S`` says otherwise when the run starts."""


def system_metrics_interval() -> float:
    """The sampling interval of a run starting now: ``VGRPO_SYSTEM_METRICS_INTERVAL_S`` when set, read at each
    start (not at import), else :data:`SYSTEM_METRICS_INTERVAL_S`."""
    return float(os.environ.get("VGRPO_SYSTEM_METRICS_INTERVAL_S", SYSTEM_METRICS_INTERVAL_S))


class StageTracker(StageCallbacks):
    """The progress line (:class:`vgrpo.training.stage.ProgressView`, on stderr and, with ``state_file``, as JSON
    for :mod:`flows.watch`) and, with a run, MLflow logging of one stage (rank 0); each evaluation's grid shows its
    first ``grid_prompts`` prompts (``evaluation.grid_prompts``; none with 0)."""

    def __init__(
        self,
        name: str,
        iterations: int,
        client: MlflowClient | None = None,
        run_id: str | None = None,
        registered_name: str | None = None,
        grid_prompts: int = 8,
        state_file: Path | None = None,
        sampling: Sampling | None = None,
    ) -> None:
        self.name, self.iterations, self.grid_prompts = name, iterations, grid_prompts
        self.sampling = sampling
        self.client, self.run_id, self.registered_name = client, run_id, registered_name
        self.model_uri: str | None = None
        self.view = ProgressView(name, iterations, state_file=state_file)
        self._monitor: Any = None

    @classmethod
    def open(
        cls,
        cfg: StageConfig,
        tracking: Tracking | None,
        previous_run_id: str | None,
        state_file: Path | None = None,
    ) -> StageTracker:
        """A tracker for ``cfg``: no run without ``tracking``; the run ``previous_run_id`` when it still exists
        (a resumed stage), moved under this flow's parent; else a new run with the stage's params. The progress
        goes to ``state_file`` too when given."""
        if tracking is None:
            return cls(cfg.name, cfg.iterations, grid_prompts=cfg.evaluation.grid_prompts, state_file=state_file)
        client = MlflowClient(tracking.uri)
        run_id = None
        if previous_run_id is not None:
            try:
                if client.get_run(previous_run_id).info.lifecycle_stage == "active":
                    run_id = previous_run_id
            except MlflowException:
                run_id = None  # deleted, or another store: start a new run
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            for key, value in {**tracking.tags, "vgrpo.continued": "true"}.items():  # e.g. the flow run now on it
                client.set_tag(run_id, key, value)
            if tracking.parent_run_id is not None:
                client.set_tag(run_id, "mlflow.parentRunId", tracking.parent_run_id)
        else:
            tags = {"vgrpo.training.stage": cfg.name, **tracking.tags}
            run_id = start_run(client, tracking.experiment, tracking.run_name, tracking.parent_run_id, tags=tags)
            log_params(client, run_id, cfg.model_dump(mode="json"))
        tracker = cls(
            cfg.name,
            cfg.iterations,
            client,
            run_id,
            registered_name=tracking.experiment,
            grid_prompts=cfg.evaluation.grid_prompts,
            state_file=state_file,
            sampling=Sampling.of(cfg),
        )
        tracker._start_system_metrics(tracking.uri, resumed=previous_run_id == run_id)
        return tracker

    def _start_system_metrics(self, uri: str, resumed: bool) -> None:
        self._monitor = SystemMetricsMonitor(
            self.run_id, sampling_interval=system_metrics_interval(), resume_logging=resumed, tracking_uri=uri
        )
        self._monitor.start()

    def on_log(self, metrics: dict[str, float], iteration: int) -> None:
        self.view.on_log(metrics, iteration)
        if self.client is not None and self.run_id is not None:
            log_metrics(self.client, self.run_id, metrics, step=iteration)

    def on_evaluate(self, table: dict[str, Any], images: np.ndarray, iteration: int) -> None:
        if self.client is not None and self.run_id is not None:
            _log_table(self.client, self.run_id, table, flat_metrics(table), iteration)
            if not self.grid_prompts:  # evaluation.grid_prompts = 0: no grid, as the final evaluation's
                return
            log_image(
                self.client,
                self.run_id,
                grid_image(**grid_of(table, images, self.grid_prompts)),
                f"eval/iter-{iteration:05d}.png",
            )

    def on_skip(self, event: dict[str, Any]) -> None:
        self.view.on_skip(event)
        if self.client is not None and self.run_id is not None:
            log_json(self.client, self.run_id, event, f"guard/iter-{event['iteration']:05d}.json")
            self.client.set_tag(
                self.run_id, "vgrpo.guard.last_skip", f"iteration {event['iteration']}: {event['quantity']}"
            )

    def on_checkpoint(self, path: Path, iteration: int) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_tag(self.run_id, "vgrpo.checkpoints.state", str(path.resolve()))

    def on_hold(self, check: dict[str, Any], reference: dict[str, float]) -> None:
        """Each hold check as ``hold/NAME`` (its value), ``hold/NAME_reference`` and ``hold/holds`` (1 or 0) at its
        iteration."""
        if self.client is not None and self.run_id is not None:
            metrics = {f"hold/{name}": value for name, value in check["values"].items()}
            metrics |= {f"hold/{name}_reference": value for name, value in reference.items()}
            log_metrics(self.client, self.run_id, {**metrics, "hold/holds": float(check["holds"])}, check["iteration"])

    def on_kept(self, hold: dict[str, Any]) -> None:
        """Which checkpoint the stage exported and why: tags, and every check as ``hold.json``."""
        if self.client is not None and self.run_id is not None:
            self.client.set_tag(self.run_id, "vgrpo.hold.kept_iteration", str(hold["kept_iteration"]))
            self.client.set_tag(self.run_id, "vgrpo.hold.reason", hold["reason"])
            self.client.set_tag(self.run_id, "vgrpo.hold.stopped_at", str(hold["stopped_at"]))
            log_json(self.client, self.run_id, hold, "hold.json")

    def finish_training(
        self,
        out_dir: Path,
        out_hash: str,
        resumed_from: int,
        skipped: int,
        base: Path,
        hold: dict[str, Any] | None = None,
    ) -> None:
        """Tag the output, log the adapter as a model (registered under the curriculum's name) and end the run.
        A holding stage's tags say which checkpoint the output is (:meth:`on_kept`; set again here, as a stage
        resumed after its export reports no checks)."""
        if self.client is not None and self.run_id is not None:
            for key, value in {
                "vgrpo.output": str(out_dir.resolve()),
                "vgrpo.output_hash": out_hash,
                "vgrpo.resumed_from": str(resumed_from),
                "vgrpo.skipped_iterations": str(skipped),
            }.items():
                self.client.set_tag(self.run_id, key, value)
            if hold is not None:
                self.on_kept(hold)
            self.model_uri = log_adapter_model(
                self.client, self.run_id, out_dir, base, self.registered_name, stage=self.name, sampling=self.sampling
            )
        self.close("FINISHED")

    def close(self, status: str) -> None:
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None
        if self.client is not None and self.run_id is not None:
            end_run(self.client, self.run_id, status)


def _log_table(client: MlflowClient, run_id: str, table: dict[str, Any], flat: dict[str, float], step: int) -> None:
    log_metrics(client, run_id, flat, step=step)
    log_json(client, run_id, table, f"eval/iter-{step:05d}.json")


def log_evaluation(uri: str, run_id: str, evaluation: StageEvaluation, iteration: int) -> None:
    """Log a final evaluation (:func:`tasks.stage.evaluate`'s) to a stage's run: its numbers at step
    ``iteration``, its table and its captioned grid."""
    if evaluation.table is None:
        return
    client = MlflowClient(uri)
    _log_table(client, run_id, evaluation.table, evaluation.final_eval, iteration)
    if evaluation.grid and Path(evaluation.grid).is_file():
        log_image(client, run_id, Path(evaluation.grid), f"eval/iter-{iteration:05d}.png")


def log_adapter_model(
    client: MlflowClient,
    run_id: str,
    out_dir: Path,
    base: Path,
    registered_name: str | None,
    *,
    stage: str | None = None,
    sampling: Sampling | None = None,
) -> str | None:
    """Log a stage's export as an MLflow model: a LoRA directory with MLflow's diffusers flavour
    (``mlflow.diffusers.load_model(uri).load_pipeline()`` and ``mlflow.pyfunc.load_model(uri).predict(prompts)``
    rebuild the pipeline from the local ``base`` with a bare ``from_pretrained``), registered as
    ``registered_name``, its version tagged ``vgrpo.training.stage`` and aliased by ``stage``
    (``models:/NAME@STAGE``: the newest version of that stage); a whole pipeline (full fine-tune) as artifacts
    under ``pipeline/``. ``predict``'s default parameters are ``sampling``'s (the stage's evaluation sampling; None:
    no CFG, 20 steps, the base's own resolution), not the flavour's 512 x 512 at CFG 7.5, which the embedded base
    cannot sample. Returns the model's URI."""
    if not (out_dir / LORA_FILE).is_file():
        client.log_artifacts(run_id, str(out_dir), "pipeline")
        return f"runs:/{run_id}/pipeline"
    mlflow.set_tracking_uri(client.tracking_uri)
    requirements = [f"{p}=={version(p)}" for p in ("torch", "diffusers", "peft", "transformers")]
    with mlflow.start_run(run_id=run_id):  # the flavour logs to the active run; the caller ends it
        info = mlflow.diffusers.log_model(
            adapter_path=str(out_dir),
            base_model=str(base.resolve()),
            name="adapter",
            signature=pyfunc_signature(base, sampling or Sampling()),
            registered_model_name=registered_name,
            pip_requirements=requirements,
            await_registration_for=0,
        )
    registered = info.registered_model_version
    if registered_name is not None and stage is not None and registered is not None:
        client.set_model_version_tag(registered_name, str(registered), "vgrpo.training.stage", stage)
        client.set_registered_model_alias(registered_name, model_alias(stage), str(registered))
    return str(info.model_uri)


@dataclass(frozen=True)
class Sampling:
    """The defaults of a logged model's ``predict``: Euler steps, CFG scale (1: none) and image side (None: the
    base's own)."""

    num_inference_steps: int = 20
    guidance_scale: float = 1.0
    resolution: int | None = None

    @classmethod
    def of(cls, cfg: StageConfig) -> Sampling:
        """A stage's evaluation sampling."""
        ev = cfg.evaluation
        return cls(ev.num_steps, ev.guidance_scale or 1.0, ev.resolution or cfg.rollout.resolution)


def pyfunc_signature(base: Path, sampling: Sampling) -> ModelSignature:
    """The diffusers flavour's signature (prompt strings in, a PNG ``image`` out) with ``sampling``'s
    defaults; the resolution defaults to the base's (its transformer's ``sample_size`` times the VAE's factor)."""
    side = sampling.resolution
    if side is None:
        transformer = json.loads((base / "transformer" / "config.json").read_text())
        vae = json.loads((base / "vae" / "config.json").read_text())
        # FLUX's transformer config has no sample_size: FluxPipeline's default_sample_size is 128
        side = int(transformer.get("sample_size", 128)) * 2 ** (len(vae["block_out_channels"]) - 1)
    return ModelSignature(
        inputs=Schema([ColSpec(type=DataType.string)]),  # unnamed: predict takes a plain list of prompts
        outputs=Schema([ColSpec(type=DataType.binary, name="image")]),
        params=ParamSchema(
            [
                ParamSpec(name="num_inference_steps", dtype=DataType.integer, default=sampling.num_inference_steps),
                ParamSpec(name="guidance_scale", dtype=DataType.double, default=float(sampling.guidance_scale)),
                ParamSpec(name="height", dtype=DataType.integer, default=side),
                ParamSpec(name="width", dtype=DataType.integer, default=side),
                ParamSpec(name="negative_prompt", dtype=DataType.string, default=""),
            ]
        ),
    )


def model_alias(stage: str) -> str:
    """A stage's name as a registered-model alias: letters, digits, ``_`` and ``-`` (others become ``-``); one that
    MLflow reserves (``latest``, ``v<digits>``) gets a ``stage-`` prefix."""
    alias = re.sub(r"[^\w-]", "-", stage)
    return f"stage-{alias}" if alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias) else alias
