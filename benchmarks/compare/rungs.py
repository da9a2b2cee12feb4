"""A tuning sweep's rungs and its rule, for any set of candidates: benchmark v3's sweep
(:mod:`benchmarks.compare.tuning`) and benchmark v4's (:mod:`benchmarks.compare.tuning_v4`) differ in what they
try (:class:`Sweep`), not in how they judge it.

- a rung (method, recipe, rate) is *stable* when on every seed its final validation score is at most
  ``drop_margin`` below that seed's best evaluation point, no point lies more than ``collapse_margin`` below the
  base, and the cell did not diverge;
- each method's choice is its stable rung with the highest seed-mean final score (ties: the smaller rate);
- while a recipe's best stable rung is at an edge of the rates it tried, the next rate out (a factor 2) is added,
  within ``rate_bounds`` (a best rung at the edge says the optimum may lie beyond it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.common import METHODS
from benchmarks.compare.plan import RunSpec

BASE = RunSpec("base", "base", "geneval", split="val")
"""The base model on the validation prompts: the start of every sweep's curves and the floor of its rule."""


@dataclass(frozen=True)
class Rung:
    """One (method, recipe, rate) over the tuning seeds."""

    method: str
    recipe: str
    lr: float
    finals: tuple[float, ...]  # per seed; a diverged cell scores minus infinity
    worst_drop: float  # the largest fall of a final below its seed's best point
    worst_below_base: float  # the lowest point minus the base, over seeds
    diverged: int
    last_quarter: float  # seed mean of the final minus the point at 3/4 of the horizon: near 0 on a plateau

    @property
    def mean(self) -> float:
        return sum(self.finals) / len(self.finals)


@dataclass(frozen=True)
class Sweep:
    """What one tuning sweep tries and how it judges it.

    ``recipes``: each method's candidates, name -> overrides on the grid's own settings
    (:data:`benchmarks.compare.plan.METHOD_OVERRIDES`); ``rates``: each method's first rates; ``order``: the
    (method, recipe) pairs in the order their first rungs run (every recipe once)."""

    recipes: Mapping[str, Mapping[str, dict[str, Any]]]
    rates: Mapping[str, tuple[float, ...]]
    order: tuple[tuple[str, str], ...]
    rate_bounds: tuple[float, float]
    seed0: int
    seeds: int
    iterations: int
    eval_every: int
    drop_margin: float  # validation strict: a final this far below the seed's own best point is a late collapse
    collapse_margin: float  # validation strict below the base at any point (the grid's collapse margin)
    phase: str = "tune"

    def spec(self, method: str, recipe: str, lr: float, seed_index: int) -> RunSpec:
        return RunSpec(
            self.phase,
            method,
            lr=lr,
            seed=self.seed0 + seed_index,
            variant=recipe,
            overrides=self.recipes[method][recipe],
            iterations=self.iterations,
            eval_every=self.eval_every,
            split="val",
        )

    def rung_of(self, method: str, recipe: str, lr: float, cells: list[dict[str, Any]], base: float) -> Rung:
        finals, drops, lows, quarters, diverged = [], [], [], [], 0
        for cell in cells:
            scores = [p["score"] for p in cell["curve"]]
            if cell.get("diverged") or not scores:
                diverged += 1
                finals.append(float("-inf"))
                continue
            finals.append(scores[-1])
            drops.append(max(scores) - scores[-1])
            lows.append(min(scores) - base)
            at = {int(p["iteration"]): p["score"] for p in cell["curve"]}
            if self.iterations * 3 // 4 in at:
                quarters.append(scores[-1] - at[self.iterations * 3 // 4])
        return Rung(
            method,
            recipe,
            lr,
            tuple(finals),
            max(drops, default=float("inf")),
            min(lows, default=float("-inf")),
            diverged,
            sum(quarters) / len(quarters) if quarters else float("nan"),
        )

    def stable(self, rung: Rung) -> bool:
        return (
            rung.diverged == 0
            and rung.worst_drop <= self.drop_margin
            and rung.worst_below_base >= -self.collapse_margin
        )

    def tuning_cells(self, records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """The records of the sweep's cells (its phase, its seeds)."""
        seeds = range(self.seed0, self.seed0 + self.seeds)
        return [r for r in records.values() if r["spec"]["phase"] == self.phase and r["spec"]["seed"] in seeds]

    def cells_by_rung(self, records: dict[str, dict[str, Any]]) -> dict[tuple[str, str, float], list[dict[str, Any]]]:
        """The sweep's cells by (method, recipe, rate), in that order."""
        by_rung: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
        for record in self.tuning_cells(records):
            spec = record["spec"]
            by_rung.setdefault((spec["method"], spec["variant"], spec["lr"]), []).append(record)
        return dict(sorted(by_rung.items()))

    def rungs(self, records: dict[str, dict[str, Any]]) -> list[Rung]:
        """Every rung whose seeds have all finished."""
        base = records.get(BASE.name)
        if base is None:
            return []
        base_score = base["curve"][0]["score"]
        return [
            self.rung_of(m, r, lr, cells, base_score)
            for (m, r, lr), cells in self.cells_by_rung(records).items()
            if len(cells) == self.seeds
        ]

    def best_stable(self, candidates: list[Rung]) -> Rung | None:
        eligible = [r for r in candidates if self.stable(r)]
        return max(eligible, key=lambda r: (r.mean, -r.lr)) if eligible else None

    def extensions(self, done: list[Rung]) -> list[RunSpec]:
        """The next rate out for each recipe whose best stable rung is at an edge of the rates it tried (or, with
        no stable rung, below the smallest it tried)."""
        specs = []
        for method, recipes in self.recipes.items():
            for recipe in recipes:
                tried = [r for r in done if r.method == method and r.recipe == recipe]
                if len(tried) < len(self.rates[method]):
                    continue  # its first rates are still running
                lrs = sorted(r.lr for r in tried)
                best = self.best_stable(tried)
                nxt = []
                if best is None:
                    nxt = [lrs[0] / 2]
                elif best.lr == lrs[0]:
                    nxt = [best.lr / 2]
                elif best.lr == lrs[-1]:
                    nxt = [best.lr * 2]
                specs += [
                    self.spec(method, recipe, lr, s)
                    for lr in nxt
                    if self.rate_bounds[0] <= lr <= self.rate_bounds[1]
                    for s in range(self.seeds)
                ]
        return specs

    def first(self) -> list[RunSpec]:
        """Every recipe at its first rates over the seeds, in :attr:`order`."""
        return [
            self.spec(m, recipe, lr, s) for m, recipe in self.order for lr in self.rates[m] for s in range(self.seeds)
        ]

    def plan(self, records: dict[str, dict[str, Any]]) -> list[RunSpec]:
        """The base's validation evaluation, the first rungs, the extension rungs that have run (planned still
        once a later rung moved the edge past them), and those the rungs call for now."""
        ran = sorted((RunSpec(**r["spec"]) for r in self.tuning_cells(records)), key=lambda s: s.name)
        every = [BASE, *self.first(), *ran, *self.extensions(self.rungs(records))]
        return list({s.name: s for s in every}.values())  # each cell once, where it first appears

    def choose(self, records: dict[str, dict[str, Any]]) -> dict[str, Rung | None]:
        """Each method's chosen rung (None while it has no stable finished rung)."""
        done = self.rungs(records)
        return {m: self.best_stable([r for r in done if r.method == m]) for m in METHODS}

    def chosen_as_methods(self, records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The chosen rungs' cells as the grid's ``methods`` cells, and the validation base as the base: records
        the claims read (:func:`benchmarks.compare.claim_rows.claim_rows`) on the validation prompts, at the
        tuning seeds. The power analysis sizes a grid's method rows by them
        (``python -m benchmarks.compare.power --tuning``)."""
        base = records[BASE.name]
        out = {"base-geneval-test": {**base, "spec": {**base["spec"], "split": "test"}, "name": "base-geneval-test"}}
        for method, rung in self.choose(records).items():
            if rung is None:
                continue
            for seed_index in range(self.seeds):
                record = records[self.spec(method, rung.recipe, rung.lr, seed_index).name]
                spec = RunSpec(**{**record["spec"], "phase": "methods", "variant": "default", "split": "test"})
                out[spec.name] = {**record, "spec": {**record["spec"], **asdict(spec)}, "name": spec.name}
        return out
