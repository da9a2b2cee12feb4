"""The report's statistics on the cell records: the records themselves, each method's seeds as one curve with the
base as its first point, the bootstrap draw every comparison shares (:mod:`benchmarks.bootstrap`), collapse, the
surrogate-CV ratio and Fisher's exact test."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import fisher_exact

from benchmarks.bootstrap import curve_replicates, first_crossing, interval, point_weights, prompt_weights
from benchmarks.common import METHODS

AXES = {
    "train_s": "training wall time (s, evaluation excluded)",
    "gradient_steps": "gradient steps",
    "nfe": "transformer evaluations in training (NFE)",
}
N_BOOT = 2000
COLLAPSE_DROP = 0.10  # a GenEval cell collapsed when its final strict credit is this far below the base's


def load_records(source: Path) -> dict[str, dict[str, Any]]:
    """The cell records of a grid folder (one JSON per cell), or of the ``cells.jsonl`` a report committed."""
    if source.is_file():
        rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        return {r["name"]: r for r in rows}
    return {p.stem: json.loads(p.read_text()) for p in sorted(source.glob("*.json")) if p.stem != "grid"}


def cells(
    records: dict[str, dict[str, Any]],
    phase: str,
    method: str | None = None,
    *,
    reward: str = "geneval",
    variant: str = "default",
) -> list[dict[str, Any]]:
    """The records of one phase (and method, reward and variant), by seed."""
    return sorted(
        (
            r
            for r in records.values()
            if r["spec"]["phase"] == phase
            and r["spec"]["reward"] == reward
            and r["spec"]["variant"] == variant
            and (method is None or r["spec"]["method"] == method)
        ),
        key=lambda r: r["spec"]["seed"],
    )


class Group:
    """One method's seeds: per-prompt scores ``(S, K, P)`` with the base as point 0, and the x axes ``(K,)``."""

    def __init__(self, runs: Sequence[dict[str, Any]], base: dict[str, Any]) -> None:
        self.runs = list(runs)
        b = base["curve"][0]
        self.tags = b["tags"]
        n_points = max(len(r["curve"]) for r in runs)
        scores, axes = [], {a: np.zeros(n_points + 1) for a in AXES}
        for r in runs:
            curve = r["curve"] + [r["curve"][-1]] * (n_points - len(r["curve"]))  # a diverged cell keeps its last
            scores.append([b["per_prompt"]] + [p["per_prompt"] for p in curve])
        full = [r for r in runs if len(r["curve"]) == n_points] or runs
        for a in AXES:
            axes[a][1:] = np.mean([[p[a] for p in r["curve"]] for r in full], axis=0)
        self.scores = np.asarray(scores, dtype=np.float64)
        self.axes = axes
        self.iterations = [0.0] + [p["iteration"] for p in max(runs, key=lambda r: len(r["curve"]))["curve"]]

    def mean_curve(self) -> np.ndarray:
        return self.scores.mean(axis=0) @ point_weights(self.tags)

    def replicates(self, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return curve_replicates(self.scores, weights, rng)


def collapsed(run: dict[str, Any], base_score: float) -> bool:
    """Diverged, or its final GenEval strict credit more than :data:`COLLAPSE_DROP` below the base's."""
    return bool(run.get("diverged")) or not run["curve"] or run["curve"][-1]["score"] < base_score - COLLAPSE_DROP


class Analysis:
    """The shared bootstrap draw and the quantities the report's tables read."""

    def __init__(self, records: dict[str, dict[str, Any]]) -> None:
        self.records = records
        self.base = records.get("base-geneval-test")
        self.rng = np.random.default_rng(0)
        self.weights = prompt_weights(self.base["curve"][0]["tags"], N_BOOT, self.rng) if self.base else None
        self._reps: dict[str, np.ndarray] = {}
        self.groups: dict[str, Group] = {}
        if self.base:
            for m in METHODS:
                runs = cells(records, "methods", m)
                if runs:
                    self.groups[m] = Group(runs, self.base)

    def reps(self, key: str, group: Group) -> np.ndarray:
        if key not in self._reps:
            self._reps[key] = group.replicates(self.weights, self.rng)
        return self._reps[key]

    def final_diff(self, a: tuple[str, Group], b: tuple[str, Group]) -> tuple[float, float, float]:
        """Final point of ``a`` minus final point of ``b`` (same prompts and images): estimate and interval."""
        est = float(a[1].mean_curve()[-1] - b[1].mean_curve()[-1])
        low, high = interval(self.reps(*a)[:, -1] - self.reps(*b)[:, -1])
        return est, low, high

    def time_ratio(self, other: str, axis: str) -> tuple[float, float, float] | None:
        """Where V-GRPO's curve reaches ``other``'s best point over where ``other`` reached it (on ``axis``)."""
        if "vgrpo" not in self.groups or other not in self.groups:
            return None
        v, o = self.groups["vgrpo"], self.groups[other]

        def ratio(vc: np.ndarray, oc: np.ndarray) -> np.ndarray:
            best_k = np.argmax(oc[..., 1:], axis=-1) + 1  # the other method's best trained point
            target = np.take_along_axis(oc, best_k[..., None], axis=-1)[..., 0]
            return first_crossing(v.axes[axis], vc, target) / o.axes[axis][best_k]

        est = float(ratio(v.mean_curve()[None], o.mean_curve()[None])[0])
        low, high = interval(ratio(self.reps("vgrpo", v), self.reps(other, o)))
        return est, low, high


def cv_ratio(
    naive: Sequence[dict[str, Any]], ours: Sequence[dict[str, Any]], key: str, rng: np.random.Generator
) -> tuple[float, float, float, float, float] | None:
    """Mean per-iteration CV of each method (over seeds and iterations) and the ratio ours / naive with a
    bootstrap over seeds and, within each drawn seed, its iterations."""
    a = [np.asarray([v for v in r.get(key, []) if v is not None]) for r in naive]
    b = [np.asarray([v for v in r.get(key, []) if v is not None]) for r in ours]
    a, b = [x for x in a if x.size], [x for x in b if x.size]
    if not a or not b:
        return None

    def draw(per_seed: list[np.ndarray]) -> float:
        seeds = [per_seed[i] for i in rng.integers(0, len(per_seed), len(per_seed))]
        return float(np.mean([s[rng.integers(0, s.size, s.size)].mean() for s in seeds]))

    ma, mb = float(np.mean([x.mean() for x in a])), float(np.mean([x.mean() for x in b]))
    low, high = interval(np.asarray([draw(b) / draw(a) for _ in range(N_BOOT)]))
    return ma, mb, mb / ma, low, high


def fisher_p(a_hits: int, a_n: int, b_hits: int, b_n: int) -> float:
    """Fisher's exact test's two-sided p-value for ``a_hits`` of ``a_n`` against ``b_hits`` of ``b_n``."""
    return float(fisher_exact([[a_hits, a_n - a_hits], [b_hits, b_n - b_hits]])[1])
