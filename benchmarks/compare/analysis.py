"""The report's statistics on the cell records: the records themselves, each group of seeds as one curve with the
base as its first point, the bootstrap draw every comparison of a reward shares (:mod:`~benchmarks.compare.bootstrap`),
curves read at a budget and the surrogate-CV ratio. Collapse, spikes and Fisher's test on collapse counts are in
:mod:`~benchmarks.compare.collapse`.

Every statistic is a function of per-seed curves, so one replicate is: the prompts drawn within their tags (the
same draw for every group of a reward, which pairs the comparison on prompts and images) and each group's seeds
drawn with replacement; the seed spread is in every interval.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import METHODS
from benchmarks.compare.bootstrap import point_weights, prompt_weights
from vgrpo.atomic import write_text_atomic

AXES = {
    "iteration": "iterations",
    "train_s": "training wall time (s, evaluation excluded)",
    "gradient_steps": "gradient steps",
    "nfe": "transformer evaluations in training (NFE)",
}
N_BOOT = 4000


def load_records(source: Path) -> dict[str, dict[str, Any]]:
    """The cell records of a grid folder (one JSON per cell), or of the ``cells.jsonl`` a report committed."""
    if source.is_file():
        rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        return {r["name"]: r for r in rows}
    return {p.stem: json.loads(p.read_text()) for p in sorted(source.glob("*.json")) if p.stem != "grid"}


def write_records(path: Path, records: dict[str, dict[str, Any]]) -> None:
    """The records as ``cells.jsonl`` (one JSON per line, by name; atomically): what :func:`load_records` reads."""
    write_text_atomic(path, "".join(json.dumps(records[k], sort_keys=True) + "\n" for k in sorted(records)))


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
    """Seeds of one setting: per-prompt scores ``(S, K, P)`` with the base as point 0, and the x axes ``(K,)``.

    A diverged cell (stopped by non-finite iterations) keeps its last point for the rest of the curve and is
    marked in ``diverged``; its drop counts as the base's whole score (:meth:`worst_drop`)."""

    def __init__(self, runs: Sequence[dict[str, Any]], base: dict[str, Any]) -> None:
        self.runs = list(runs)
        b = base["curve"][0]
        self.tags = b["tags"]
        self.base_score = float(b["score"])
        n_points = max(len(r["curve"]) for r in runs)
        scores = []
        for r in runs:
            curve = r["curve"] or [{"per_prompt": [0.0] * len(b["per_prompt"])}]
            curve = curve + [curve[-1]] * (n_points - len(curve))
            scores.append([b["per_prompt"]] + [p["per_prompt"] for p in curve])
        full = [r for r in runs if len(r["curve"]) == n_points] or runs
        # Wall time from the cells that ran with the cores to themselves, when there are any.
        clean = [r for r in full if not (r.get("machine") or {}).get("under_load")] or full
        self.timed_cells = len(clean)
        self.timed_cpus = sorted({(r.get("machine") or {}).get("cpu", "not recorded") for r in clean})
        self.axes = {a: np.zeros(n_points + 1) for a in AXES}
        for a in AXES:
            self.axes[a][1:] = np.mean(
                [[p[a] for p in r["curve"]] for r in (clean if a == "train_s" else full)], axis=0
            )
        self.scores = np.asarray(scores, dtype=np.float64)
        self.diverged = np.asarray([bool(r.get("diverged")) for r in runs])
        self.iterations = self.axes["iteration"]

    @property
    def seeds(self) -> int:
        return self.scores.shape[0]

    def per_seed(self, weights: np.ndarray) -> np.ndarray:
        """``(B, S, K)``: each seed's curve under each prompt replicate (``weights`` ``(B, P)``; ``(P,)`` for the
        point estimate gives ``(S, K)``)."""
        return np.einsum("skp,...p->...sk", self.scores, weights)

    def mean_curve(self, point: np.ndarray) -> np.ndarray:
        """``(K,)``: the mean over seeds of the curve under the point weights."""
        return self.per_seed(point).mean(axis=0)

    def worst_drop(self, per_seed: np.ndarray) -> np.ndarray:
        """Each seed's largest drop below its start (the base) over the evaluation points, ``(..., S)``; a
        diverged seed's is its start's whole score."""
        drop = per_seed[..., :1] - per_seed[..., 1:]
        worst = drop.max(axis=-1)
        return np.where(self.diverged, per_seed[..., 0], worst)

    def drop_values(self, point: np.ndarray) -> np.ndarray:
        """``(S, P)``: each seed's worst drop (:meth:`worst_drop` at the point weights) per prompt, read at the
        evaluation point where the seed's drop is largest (a diverged seed: its start), so that ``point @`` a
        seed's row is its worst drop: the linearisation :mod:`benchmarks.compare.studentized` tests."""
        per = self.per_seed(point)
        k = 1 + np.argmax(per[:, :1] - per[:, 1:], axis=1)
        rows = np.arange(self.seeds)
        values = self.scores[rows, 0] - self.scores[rows, k]
        return np.where(self.diverged[:, None], self.scores[:, 0], values)


class Analysis:
    """The shared bootstrap draws (one per reward's test prompts, and one for the sweep's validation prompts,
    ``geneval-val``) and the quantities the report reads.

    A *statistic* is a function of the per-seed curves of some groups: ``fn(*per_seed) -> (...,)``. Its estimate
    uses the point weights and every seed; each replicate uses a prompt draw shared by all groups of the reward
    and, per group, a draw of its seeds."""

    def __init__(self, records: dict[str, dict[str, Any]], n_boot: int = N_BOOT, stream: int = 0) -> None:
        self.records = records
        self.n_boot = n_boot
        self.stream = stream
        self.bases = {r: records.get(f"base-{r}-test") for r in ("geneval", "preference")}
        self.bases["geneval-val"] = records.get("base-geneval-val")  # the sweep's validation prompts
        self.base = self.bases["geneval"]
        self.rng = np.random.default_rng(stream)
        self._weights: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._seed_draws: dict[tuple[str, int], np.ndarray] = {}
        self.groups: dict[str, Group] = {}
        if self.base:
            for m in METHODS:
                runs = cells(records, "methods", m)
                if runs:
                    self.groups[m] = Group(runs, self.base)

    def group(self, phase: str, method: str, *, reward: str = "geneval", variant: str = "default") -> Group | None:
        """The group of a phase's cells, or None when none has run (or the reward's base has not)."""
        runs = cells(self.records, phase, method, reward=reward, variant=variant)
        base = self.bases.get(reward)
        return Group(runs, base) if runs and base else None

    def redraw(self, n_boot: int, chunk: int) -> Analysis:
        """The same records and groups with fresh draws of ``n_boot`` replicates from chunk ``chunk`` of this
        analysis's stream (:meth:`replicates` joins the chunks)."""
        other = copy.copy(self)
        other.n_boot, other.rng = n_boot, np.random.default_rng([self.stream, 1 + chunk])
        other._weights, other._seed_draws = {}, {}
        return other

    def replicates(self, n_boot: int, draw: Callable[[Analysis], np.ndarray], chunk: int = 50_000) -> np.ndarray:
        """``n_boot`` replicates of a statistic, ``draw(analysis) -> (B,)`` run on chunks of at most ``chunk``
        replicates each (memory: a chunk's prompt weights are ``chunk x P`` floats)."""
        parts: list[np.ndarray] = []
        done = 0
        while done < n_boot:
            size = min(chunk, n_boot - done)
            parts.append(np.asarray(draw(self.redraw(size, len(parts))), dtype=np.float64))
            done += size
        return np.concatenate(parts)

    def design(self, groups: Sequence[tuple[str, Group]], fn: Callable[..., np.ndarray]) -> list[np.ndarray]:
        """Each group's signed per-seed per-prompt values ``(S, P)`` of a statistic linear in the curves (every
        claim's ``fn`` is): ``fn`` probed with one group's curves at a time, the others' set to 0, so that the
        estimate is the sum over groups of ``point @`` each group's seed mean."""
        out = []
        for i, (_, g) in enumerate(groups):
            args = [
                np.moveaxis(g.scores, -1, 0)[:, :, None, :] if j == i else np.zeros((1, 1, 1, h.scores.shape[1]))
                for j, (_, h) in enumerate(groups)
            ]
            out.append(np.asarray(fn(*args), dtype=np.float64).T)  # (P, S) -> (S, P)
        return out

    def drop_design(
        self, groups: Sequence[tuple[str, Group]], combine: Callable[..., np.ndarray], reward: str
    ) -> list[np.ndarray]:
        """:meth:`design` for a combination (linear in the groups' means) of seeds' worst drops, linearised at the
        point estimate (:meth:`Group.drop_values`)."""
        point, _ = self.weights(reward)
        n = len(groups)
        signs = [float(combine(*(1.0 if j == i else 0.0 for j in range(n)))) for i in range(n)]
        return [c * g.drop_values(point) for c, (_, g) in zip(signs, groups, strict=True)]

    def weights(self, reward: str) -> tuple[np.ndarray, np.ndarray]:
        """The point weights ``(P,)`` and the shared prompt replicates ``(B, P)`` of ``reward``'s test prompts."""
        if reward not in self._weights:
            tags = self.bases[reward]["curve"][0]["tags"]  # type: ignore[index]
            self._weights[reward] = (point_weights(tags), prompt_weights(tags, self.n_boot, self.rng))
        return self._weights[reward]

    def seed_draw(self, key: str, n: int) -> np.ndarray:
        """``(B, n)`` seed indices for the group ``key`` (fixed per group, so every statistic of a group uses
        the same draw)."""
        if (key, n) not in self._seed_draws:
            self._seed_draws[(key, n)] = self.rng.integers(0, n, size=(self.n_boot, n))
        return self._seed_draws[(key, n)]

    def _curves(self, g: Group, key: str, reward: str, mode: str) -> np.ndarray:
        """``(B, S, K)`` per-seed curves of a replicate: prompts drawn (unless ``mode`` is ``seeds``), seeds drawn
        (unless ``mode`` is ``prompts``)."""
        point, reps = self.weights(reward)
        per = g.per_seed(point if mode == "seeds" else reps)
        if mode == "prompts":
            return per
        per = np.broadcast_to(per, (self.n_boot, *per.shape[-2:]))
        return np.take_along_axis(per, self.seed_draw(key, g.seeds)[:, :, None], axis=1)

    def statistic(
        self,
        groups: Sequence[tuple[str, Group]],
        fn: Callable[..., np.ndarray],
        reward: str = "geneval",
        mode: str = "both",
    ) -> tuple[float, np.ndarray]:
        """``fn`` over the groups' per-seed curves ``(..., S, K)`` (each reduced over seeds by ``fn`` itself,
        e.g. :func:`final`): the estimate and ``(B,)`` replicates. ``mode`` ``seeds`` or ``prompts`` draws only
        those."""
        point, _ = self.weights(reward)
        est = np.asarray(fn(*(g.per_seed(point) for _, g in groups)), dtype=np.float64)
        reps = fn(*(self._curves(g, key, reward, mode) for key, g in groups))
        return (float(est) if est.ndim == 0 else est), np.asarray(reps, dtype=np.float64)  # type: ignore[return-value]

    def seed_statistic(
        self,
        groups: Sequence[tuple[str, Group]],
        per_seed_fn: Callable[[Group, np.ndarray], np.ndarray],
        combine: Callable[..., np.ndarray],
        reward: str = "geneval",
        mode: str = "both",
    ) -> tuple[float, np.ndarray]:
        """Like :meth:`statistic` for a per-seed quantity that needs its group (``per_seed_fn(group, curves) ->
        (..., S)``, e.g. :meth:`Group.worst_drop`): the seed means of each group, combined by ``combine``."""
        point, _ = self.weights(reward)
        est = float(combine(*(per_seed_fn(g, g.per_seed(point)).mean(axis=-1) for _, g in groups)))
        reps = combine(*(per_seed_fn(g, self._curves(g, key, reward, mode)).mean(axis=-1) for key, g in groups))
        return est, np.asarray(reps, dtype=np.float64)


def drop_of(group: Group, c: np.ndarray) -> np.ndarray:
    """Per-seed worst drop (:meth:`Group.worst_drop`), as :meth:`Analysis.seed_statistic` takes it."""
    return group.worst_drop(c)


def identity(x: np.ndarray) -> np.ndarray:
    return x


def final(c: np.ndarray) -> np.ndarray:
    """The seed mean of the last point of per-seed curves ``(..., S, K)``."""
    return c[..., -1].mean(axis=-1)


def start(c: np.ndarray) -> np.ndarray:
    return c[..., 0].mean(axis=-1)


def curve_mean(c: np.ndarray) -> np.ndarray:
    """The seed mean of the curve's height averaged over the evaluation points after the start."""
    return c[..., 1:].mean(axis=(-1, -2))


def at_budget(xs: np.ndarray, c: np.ndarray, x: float) -> np.ndarray:
    """The seed-mean curve ``(..., S, K)`` read at ``x`` on the axis ``xs`` ``(K,)`` (linear between points;
    NaN beyond the last point)."""
    if x > xs[-1] + 1e-9:
        return np.full(c.shape[:-2], np.nan)
    k = int(np.searchsorted(xs, x, side="left"))
    if k == 0:
        return start(c)
    if abs(xs[k] - x) < 1e-9:
        return c[..., k].mean(axis=-1)
    frac = (x - xs[k - 1]) / (xs[k] - xs[k - 1])
    return ((1 - frac) * c[..., k - 1] + frac * c[..., k]).mean(axis=-1)


def cv_ratio(
    naive: Sequence[dict[str, Any]], ours: Sequence[dict[str, Any]], key: str, rng: np.random.Generator, n_boot: int
) -> tuple[float, float, np.ndarray] | None:
    """Mean per-iteration CV of each method (over seeds and iterations), and replicates of the ratio ours / naive
    drawing seeds and, within each drawn seed, its iterations."""
    a = [np.asarray([v for v in r.get(key, []) if v is not None]) for r in naive]
    b = [np.asarray([v for v in r.get(key, []) if v is not None]) for r in ours]
    a, b = [x for x in a if x.size], [x for x in b if x.size]
    if not a or not b:
        return None

    def draw(per_seed: list[np.ndarray]) -> float:
        seeds = [per_seed[i] for i in rng.integers(0, len(per_seed), len(per_seed))]
        return float(np.mean([s[rng.integers(0, s.size, s.size)].mean() for s in seeds]))

    ma, mb = float(np.mean([x.mean() for x in a])), float(np.mean([x.mean() for x in b]))
    return ma, mb, np.asarray([draw(b) / draw(a) for _ in range(n_boot)])
