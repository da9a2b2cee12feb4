"""Synthetic records of a tuning sweep (:class:`benchmarks.compare.rungs.Sweep`): a cell's curve as the cell
writes it (one prompt of each GenEval tag, every one scoring the point's score), for the sweep tests."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from benchmarks.common import GENEVAL_TAGS
from benchmarks.compare.plan import RunSpec
from benchmarks.compare.rungs import BASE, Sweep


def record(spec: RunSpec, curve: list[float], diverged: bool = False, every: float = 10.0) -> dict[str, Any]:
    """``spec``'s record with an evaluation point every ``every`` iterations scoring ``curve``; 100 transformer
    evaluations and 3 s per iteration."""

    def point(i: int, s: float) -> dict[str, Any]:
        it = every * (i + 1)
        axes = {"iteration": it, "train_s": 3.0 * it, "gradient_steps": 2.0 * it, "nfe": 100.0 * it}
        return {**axes, "score": s, "per_prompt": [s] * 6, "tags": list(GENEVAL_TAGS)}

    return {
        "name": spec.name,
        "spec": asdict(spec),
        "curve": [point(i, s) for i, s in enumerate(curve)],
        "diverged": "nan" if diverged else None,
        "gradient_steps_per_iteration": 2.0,
    }


def sweep_records(
    sweep: Sweep, curves: dict[tuple[str, str, float], list[list[float]]], base: float = 0.40
) -> dict[str, Any]:
    """The base scoring ``base`` and each rung's cells, one curve per seed, at the sweep's evaluation points."""
    records = {BASE.name: record(BASE, [base])}
    for (method, recipe, lr), per_seed in curves.items():
        for s, curve in enumerate(per_seed):
            spec = sweep.spec(method, recipe, lr, s)
            records[spec.name] = record(spec, curve, every=float(sweep.eval_every))
    return records
