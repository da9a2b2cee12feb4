"""What the pipeline's stage tasks return: a trained stage (:class:`StageOutcome`) and its final evaluation
(:class:`StageEvaluation`), frozen values that pass between the Prefect tasks, the stage launcher and DVC's stage
command. They are serialised only where they are written: a launched stage's result file, a curriculum's
``results.json``, DVC's metrics files."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StageEvaluation", "StageOutcome"]


@dataclass(frozen=True)
class StageOutcome:
    """A trained stage: where its adapter is and its content hash, the MLflow runs that hold it, and what was
    measured on the way.

    Attributes:
        name: The stage's name.
        out_dir: The exported adapter (or pipeline) folder.
        hash: :func:`tasks.stage.dir_hash` of ``out_dir``: the identity of the output.
        run_id: The MLflow run that trained it (``None`` without tracking).
        model_uri: The MLflow model logged from it (``None`` without tracking).
        resumed_from: The iteration its last start resumed from (0: from scratch).
        wall_s: Seconds the last start took, with a launched stage's process start.
        history: Each iteration's flat metrics.
        skipped: How many iterations were skipped for a non-finite value.
        evaluations: Each evaluation's flat metrics with its ``iteration``: the in-stage ones, then the final
            one once the stage has been evaluated.
        final_eval: The final evaluation's flat ``eval/...`` metrics (empty until evaluated, or without
            evaluation prompts).
        timings: Seconds the last start spent on each part of training
            (:attr:`vgrpo.training.stage.StageResult.timings`; empty when not recorded).
        flow_run_id: The Prefect flow run that trained it (``None`` outside Prefect).
        record_run_id: The MLflow run that holds its final evaluation in the current flow run: the training run,
            or a run marking a cache hit.
        hold: A holding stage's checks and which checkpoint it exported, and why
            (:attr:`vgrpo.training.stage.StageResult.hold`); ``None`` without ``hold``.
    """

    name: str
    out_dir: str
    hash: str
    run_id: str | None = None
    model_uri: str | None = None
    resumed_from: int = 0
    wall_s: float = 0.0
    history: tuple[dict[str, float], ...] = ()
    skipped: int = 0
    evaluations: tuple[dict[str, Any], ...] = ()
    final_eval: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    flow_run_id: str | None = None
    record_run_id: str | None = None
    hold: dict[str, Any] | None = None

    def replace(self, **changes: Any) -> StageOutcome:
        """A copy with ``changes`` (a dataclass's ``replace``)."""
        return dataclasses.replace(self, **changes)

    def evaluated(self, evaluation: StageEvaluation, iteration: int) -> StageOutcome:
        """This outcome with its final evaluation, appended to :attr:`evaluations` at ``iteration``."""
        final = evaluation.final_eval
        return self.replace(
            final_eval=dict(final),
            evaluations=(*self.evaluations, {"iteration": iteration, **final}) if final else self.evaluations,
        )

    def to_json(self, *, history: bool = True) -> dict[str, Any]:
        """A JSON-able mapping of every field (``history=False`` leaves the per-iteration metrics out)."""
        data = dataclasses.asdict(self)
        data["history"], data["evaluations"] = list(self.history), list(self.evaluations)
        if not history:
            del data["history"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageOutcome:
        """The outcome :meth:`to_json` wrote; a ``ValueError`` naming the fields that are missing or unknown."""
        names = {f.name for f in dataclasses.fields(cls)}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing, unknown = sorted(required - set(data)), sorted(set(data) - names)
        if missing or unknown:
            raise ValueError(f"not a stage outcome: missing fields {missing}, unknown fields {unknown}")
        values = dict(data)
        values["history"] = tuple(values.get("history", ()))
        values["evaluations"] = tuple(values.get("evaluations", ()))
        return cls(**values)


@dataclass(frozen=True)
class StageEvaluation:
    """The final evaluation of a stage's exported weights.

    Attributes:
        table: The evaluation table (:func:`vgrpo.evaluation.tables.summarise`), ``None`` without evaluation
            prompts.
        final_eval: Its flat ``eval/...`` metrics (:func:`vgrpo.evaluation.tables.flat_metrics`).
        grid: The captioned sample grid it wrote, if any.
    """

    table: dict[str, Any] | None = None
    final_eval: dict[str, float] = field(default_factory=dict)
    grid: str | None = None
