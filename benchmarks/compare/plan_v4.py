"""Benchmark v4's cells and their machine time: v3's phases (:mod:`benchmarks.compare.grid`) at v4's horizon, on
fresh seeds, each method at the recipe and rate the v4 tuning sweep chose (:mod:`benchmarks.compare.tuning_v4`),
with a second V-GRPO seed group of the same config (the ``replicate`` phase), so that the report can say whether
each verdict holds when one seed group is exchanged for the other.

    python -m benchmarks.compare.plan_v4                  # the cells and their machine time, from the sweep's records
    python -m benchmarks.compare.plan_v4 --provisional    # the same with each method's best rung so far

The seed counts are a DRAFT until ``docs/benchmarks-v4``'s grid pre-registration fixes them from the power
analysis (``docs/benchmarks-v4/power-from-v3.md``) and the machine time this module prints.

The machine time is an estimate for one machine type, from the sweep's own records on it (:func:`cost_model`):
each cell's training seconds per iteration are its recipe's in the sweep (an N_MC ablation scales the part of the
iteration that N_MC multiplies, the surrogate's preparation and the update, by its N_MC over the recipe's), and
each evaluation point costs the sweep's seconds per evaluated prompt times the cell's evaluation prompts (the
preference evaluation's prompts at :data:`PREFERENCE_EVAL_FACTOR` times a GenEval prompt's). A sweep cell's seconds
per evaluated prompt are its wall time less its training seconds over its evaluated prompts, so they carry its
loading too.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import LABELS, METHODS, ROOT
from benchmarks.compare import grid, plan_v3, tuning_v4
from benchmarks.compare.analysis import load_records
from benchmarks.compare.grid import Design, Tuned
from benchmarks.compare.plan import ABLATIONS, RunSpec, Sizes

SIZES = replace(
    Sizes(),
    iterations=tuning_v4.V4.iterations,
    eval_every=tuning_v4.V4.eval_every,
    seeds=11,
    ablation_seeds=7,
    preference_seeds=5,
    stability_seeds=3,
)
"""DRAFT seed counts: 11 per method (D1 at 0.05 and E1 at Bonferroni, from v3's variances), 7 per ablation, 5 per
preference cell, 3 per GenEval stress cell; the stress and preference cells keep v3's lengths."""
SEED0 = {"methods": 1700, "replicate": 1800, "stability": 1900, "own_rate": 2000, "ablation": 2100, "preference": 2200}
"""Fresh seed blocks: v2 used 0-201, v3 1000-1499, v3's sweep 1500-1599 and v4's 1600-1699."""
PHASES = ("base", "methods", "replicate", "stability", "own_rate", "ablation", "preference")
DESIGN = Design(
    sizes=SIZES,
    seed0=SEED0,
    phases=PHASES,
    preference_stress_seeds=5,
    own_rate_seeds=9,
    replicate_seeds=11,
    replicated=("vgrpo",),
    recipe_in_preference=True,
)
"""Benchmark v4's grid (DRAFT counts). Unlike v3 the preference cells train each method's tuned recipe (at the
preference stage's rate): a recipe is the method's, a rate the reward's. 5 seeds per preference stress cell, not
v3's 15: S2 needs 3 at Bonferroni on v3's variances (``docs/benchmarks-v4/power-from-v3.md``)."""
TUNING_RECORDS = ROOT / "docs" / "benchmarks-v4" / "tuning" / "cells.jsonl"
PREFERENCE_EVAL_FACTOR = 11.13 / 630 / (6.49 / 540)
"""A preference evaluation prompt's seconds over a GenEval one's: v3's base evaluations on one machine
(``docs/benchmarks-v3/grid/cells.jsonl``: 11.13 s for 630 prompts, 6.49 s for 540)."""


def load_tuned(path: Path = TUNING_RECORDS, provisional: bool = False) -> dict[str, Tuned]:
    """Each method's chosen recipe and rate from the v4 sweep's records; with ``provisional``, its best stable
    finished rung so far (methods with none left out), for a budget before the sweep settles."""
    records = load_records(path) if path.is_file() else {}
    if not provisional:
        return grid.tuned_settings(tuning_v4.V4, records)
    sweep = tuning_v4.V4
    return {
        m: Tuned(rung.recipe, rung.lr, dict(sweep.recipes[m][rung.recipe]))
        for m, rung in sweep.choose(records).items()
        if rung is not None
    }


def full_plan(tuned: dict[str, Tuned], design: Design = DESIGN) -> list[RunSpec]:
    return grid.full_plan(tuned, design)


@dataclass(frozen=True)
class RecipeCost:
    """One recipe's measured costs in the sweep: training seconds per iteration, the part of it N_MC multiplies
    (preparation and update), and its N_MC."""

    iteration_s: float
    n_mc_part_s: float
    n_mc: int | None


def _key(method: str, overrides: dict[str, Any]) -> str:
    return f"{method} {json.dumps(overrides, sort_keys=True)}"


def cost_model(records: dict[str, dict[str, Any]], sizes: Sizes = SIZES) -> Callable[[RunSpec], float | None]:
    """A cell's estimated seconds on the sweep's machine from the sweep's records (``None`` where its recipe has no
    record without other load): see the module's docstring."""
    sweep = tuning_v4.V4
    by_recipe: dict[str, list[dict[str, Any]]] = defaultdict(list)
    per_prompt = []
    for cell in sweep.tuning_cells(records):
        if cell.get("machine", {}).get("under_load") or not cell.get("time_split_s"):
            continue
        spec, split = cell["spec"], cell["time_split_s"]
        by_recipe[_key(spec["method"], spec["overrides"])].append(cell)
        points = len(cell["curve"])
        if points and cell.get("wall_s"):
            train = split["iteration"] * spec["iterations"]
            per_prompt.append((cell["wall_s"] - train) / (points * sizes.val_prompts))
    costs = {
        key: RecipeCost(
            statistics.mean(c["time_split_s"]["iteration"] for c in cells),
            statistics.mean(c["time_split_s"]["prepare"] + c["time_split_s"]["update"] for c in cells),
            (cells[0].get("config") or {}).get("algorithm", {}).get("n_mc"),
        )
        for key, cells in by_recipe.items()
    }
    eval_prompt_s = statistics.mean(per_prompt) if per_prompt else None
    ablation_keys = {v: set(_flatten(o)) for v, o in ABLATIONS.items()}

    def seconds(spec: RunSpec) -> float | None:
        if eval_prompt_s is None:
            return None
        prompts = sizes.preference_prompts if spec.reward == "preference" else sizes.test_prompts
        factor = PREFERENCE_EVAL_FACTOR if spec.reward == "preference" else 1.0
        one_evaluation = prompts * eval_prompt_s * factor
        if spec.phase == "base":
            return one_evaluation
        evaluation = (spec.iterations // spec.eval_every) * one_evaluation  # the start is the base's evaluation
        overrides, n_mc = spec.overrides, None
        if spec.phase == "ablation":
            # the variant's keys off the recipe: its cost is the recipe's, N_MC scaled
            if "algorithm.n_mc" in ablation_keys[spec.variant]:
                n_mc = spec.overrides["algorithm"]["n_mc"]
            overrides = _drop(spec.overrides, ablation_keys[spec.variant])
        cost = costs.get(_key(spec.method, overrides))
        if cost is None:
            return None
        per_iteration = cost.iteration_s
        if n_mc is not None and cost.n_mc:
            per_iteration += cost.n_mc_part_s * (n_mc / cost.n_mc - 1)
        return spec.iterations * per_iteration + evaluation

    return seconds


def _flatten(overrides: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in overrides.items():
        out += _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


def _drop(overrides: dict[str, Any], keys: set[str], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in overrides.items():
        if isinstance(v, dict):
            if kept := _drop(v, keys, f"{prefix}{k}."):
                out[k] = kept
        elif f"{prefix}{k}" not in keys:
            out[k] = v
    return out


def budget_lines(plan: list[RunSpec], seconds: Callable[[RunSpec], float | None], tuned: dict[str, Tuned]) -> list[str]:
    """The plan's cells and estimated machine hours by phase (and by method in the methods phase), as markdown."""
    lines = ["| method | recipe | rate |", "|---|---|---|"]
    lines += [f"| {LABELS[m]} | {t.recipe} | {t.lr:g} |" for m, t in tuned.items()]
    lines += ["", "| phase | cells | hours (estimate) | cells without a cost |", "|---|---|---|---|"]
    groups: dict[str, list[RunSpec]] = defaultdict(list)
    for spec in plan:
        groups[spec.phase].append(spec)
        if spec.phase == "methods":
            groups[f"methods: {LABELS[spec.method]}"].append(spec)
    total, unknown = 0.0, 0
    for name, specs in groups.items():
        known = [s for s in (seconds(x) for x in specs) if s is not None]
        missing = len(specs) - len(known)
        if not name.startswith("methods: "):
            total, unknown = total + sum(known), unknown + missing
        lines.append(f"| {name} | {len(specs)} | {sum(known) / 3600:.1f} | {missing or ''} |")
    lines.append(f"| **all** | {len(plan)} | **{total / 3600:.1f}** | {unknown or ''} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare.plan_v4", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=TUNING_RECORDS, help="the v4 sweep's records")
    parser.add_argument(
        "--provisional", action="store_true", help="each method's best stable rung so far, before the sweep settles"
    )
    args = parser.parse_args(argv)
    if not args.records.is_file():
        parser.error(f"--records: {args.records} does not exist")
    try:
        tuned = load_tuned(args.records, args.provisional)
    except RuntimeError as exc:
        parser.error(f"{exc}; --provisional estimates from each method's best rung so far")
    if missing := [m for m in METHODS if m not in tuned]:
        v3 = plan_v3.load_tuned()
        tuned |= {m: v3[m] for m in missing}
        print(f"No stable rung yet for {', '.join(LABELS[m] for m in missing)}: each at its v3 choice.\n")
    plan = full_plan({m: tuned[m] for m in METHODS})
    print("\n".join(budget_lines(plan, cost_model(load_records(args.records)), tuned)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
