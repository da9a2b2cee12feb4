"""A pre-registered grid's cells from its design: benchmark v3's (:mod:`benchmarks.compare.plan_v3`) and v4's
(:mod:`benchmarks.compare.plan_v4`) differ in their numbers (:class:`Design`), not in how a phase is laid out.

Phases, each on its own block of fresh seeds:

- ``base``: the base model's GenEval and preference evaluations;
- ``methods``: every method at the recipe and rate its tuning sweep chose, ``sizes.seeds`` seeds each;
- ``replicate``: a second seed group of the same config for the methods in ``design.replicated``, so the report
  can say whether a verdict holds when one seed group is exchanged for another (v3's two identical V-GRPO groups
  disagreed beyond their intervals);
- ``stability``: V-GRPO and naive ELBO-GRPO at multiples of their own rates, at the stress cadence;
- ``own_rate``: the same two at their own rates, at the stress cadence (the S1o/S2o rows);
- ``ablation``: V-GRPO's variants (:data:`benchmarks.compare.plan.ABLATIONS`) on its chosen recipe and rate;
- ``preference``: the two on the preference stage's rewards.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import METHODS
from benchmarks.compare.plan import ABLATIONS, RunSpec, Sizes, stage_lr
from benchmarks.compare.rungs import Sweep
from vgrpo.config import merge_overrides

STRESSED = ("vgrpo", "naive_elbo")  # the stability rows compare these two


@dataclass(frozen=True)
class Tuned:
    """A method's recipe and rate from the tuning sweep."""

    recipe: str
    lr: float
    overrides: dict[str, Any]


@dataclass(frozen=True)
class Design:
    """What a grid runs: its sizes, each phase's first seed, the seed counts :class:`Sizes` does not hold, and how
    the preference cells take a method's tuned recipe."""

    sizes: Sizes
    seed0: Mapping[str, int]  # phase -> its first seed (a block of 100)
    phases: tuple[str, ...]
    preference_stress_seeds: int  # per preference stress cell
    own_rate_seeds: int
    replicate_seeds: int = 0
    replicated: tuple[str, ...] = ()
    recipe_in_preference: bool = False
    """Whether the preference cells train each method's tuned recipe (at the stage's rate): v3 ran its presets there."""


class NotPreregistered(RuntimeError):
    """A pre-registered grid may not start: its pre-registration is a draft or not committed."""


def check_preregistered(path: Path, root: Path) -> None:
    """Refuse to run a grid before its pre-registration is fixed: ``path`` must say no ``DRAFT`` and be committed
    as it is (a :class:`NotPreregistered` naming the file otherwise), so that the commit that fixes the rows, rules
    and seeds precedes the first cell."""
    if not path.is_file():
        raise NotPreregistered(f"{path}: the pre-registration is missing")
    if "DRAFT" in path.read_text():
        raise NotPreregistered(
            f"{path}: still a DRAFT; fill in the tuned settings, remove DRAFT and commit it before the grid runs"
        )
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", str(path)], cwd=root, capture_output=True, text=True, check=False
    )
    if status.returncode != 0 or status.stdout.strip():
        raise NotPreregistered(f"{path}: not committed as it is (git status: {status.stdout.strip() or 'failed'})")


def tuned_settings(sweep: Sweep, records: dict[str, dict[str, Any]]) -> dict[str, Tuned]:
    """Each method's chosen rung in ``sweep``, once every rung it plans for that method has finished; a
    ``RuntimeError`` naming the methods whose choice is still open otherwise."""
    planned = sweep.plan(records)
    done = {(r.method, r.recipe, r.lr) for r in sweep.rungs(records)}
    chosen = sweep.choose(records)
    open_ = [
        m
        for m in METHODS
        if chosen[m] is None or any((s.method, s.variant, s.lr) not in done for s in planned if s.method == m)
    ]
    if open_:
        raise RuntimeError(f"the tuning sweep has not settled {open_}")
    out = {}
    for m in METHODS:
        rung = chosen[m]
        assert rung is not None
        out[m] = Tuned(rung.recipe, rung.lr, dict(sweep.recipes[m][rung.recipe]))
    return out


def plan_phase(phase: str, tuned: dict[str, Tuned], design: Design) -> list[RunSpec]:
    """The cells of one phase. Every cell keeps the variant names the claims group by (``default`` for a method's
    own recipe) and carries its recipe in ``overrides``."""
    if phase not in design.phases:
        raise ValueError(f"unknown phase {phase!r} (this grid's: {', '.join(design.phases)})")
    sizes, seed0 = design.sizes, design.seed0
    it, every = sizes.iterations, sizes.eval_every
    stress_it, stress_every = sizes.stability_iterations, sizes.stability_eval_every
    if phase == "base":
        return [RunSpec("base", "base", "geneval"), RunSpec("base", "base", "preference")]
    if phase in ("methods", "replicate"):
        methods, n = (METHODS, sizes.seeds) if phase == "methods" else (design.replicated, design.replicate_seeds)
        return [
            RunSpec(
                phase,
                m,
                lr=tuned[m].lr,
                seed=seed0[phase] + s,
                overrides=tuned[m].overrides,
                iterations=it,
                eval_every=every,
            )
            for s in range(n)
            for m in methods
        ]

    def own(m: str, reward: str) -> tuple[float, dict[str, Any]]:
        if reward == "geneval":
            return tuned[m].lr, tuned[m].overrides
        return stage_lr("preference"), (tuned[m].overrides if design.recipe_in_preference else {})

    if phase == "stability":
        seeds = {"geneval": sizes.stability_seeds, "preference": design.preference_stress_seeds}
        return [
            RunSpec(
                "stability",
                m,
                reward,
                lr=mult * own(m, reward)[0],
                seed=seed0["stability"] + s,
                variant=f"x{mult:g}",
                overrides=own(m, reward)[1],
                iterations=stress_it,
                eval_every=stress_every,
            )
            for reward in ("geneval", "preference")
            for mult in sizes.stability_multipliers
            for s in range(seeds[reward])
            for m in STRESSED
        ]
    if phase == "own_rate":
        return [
            RunSpec(
                "own_rate",
                m,
                reward,
                lr=own(m, reward)[0],
                seed=seed0["own_rate"] + s,
                variant="x1",
                overrides=own(m, reward)[1],
                iterations=stress_it,
                eval_every=stress_every,
            )
            for reward in ("geneval", "preference")
            for s in range(design.own_rate_seeds)
            for m in STRESSED
        ]
    if phase == "ablation":
        return [
            RunSpec(
                "ablation",
                "vgrpo",
                lr=tuned["vgrpo"].lr,
                seed=seed0["ablation"] + s,
                variant=v,
                overrides=merge_overrides(tuned["vgrpo"].overrides, o),
                iterations=it,
                eval_every=every,
            )
            for s in range(sizes.ablation_seeds)
            for v, o in ABLATIONS.items()
        ]
    if phase == "preference":
        return [
            RunSpec(
                "preference",
                m,
                "preference",
                lr=stage_lr("preference"),
                seed=seed0["preference"] + s,
                overrides=own(m, "preference")[1],
                iterations=sizes.preference_iterations,
                eval_every=every,
            )
            for s in range(sizes.preference_seeds)
            for m in STRESSED
        ]
    raise ValueError(f"phase {phase!r} has no layout")


def full_plan(tuned: dict[str, Tuned], design: Design) -> list[RunSpec]:
    return [s for p in design.phases for s in plan_phase(p, tuned, design)]
