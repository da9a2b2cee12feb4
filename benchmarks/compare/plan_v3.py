"""Benchmark v3's cells, as ``docs/benchmarks/v3-preregistration.md`` proposes them: the v2 phases at the seed counts
of its power analysis, on fresh seeds, each method at the recipe and rate the tuning sweep chose
(:mod:`benchmarks.compare.tuning`), and a phase at each method's own rate evaluated at the stress cadence (the
S1o/S2o rows' cells).

The runner runs it as ``python -m benchmarks.compare --grid v3`` (:mod:`benchmarks.compare.runner`), once the
tuning sweep has settled every method (:func:`tuned_settings`) and the pre-registration is committed
(:func:`check_preregistered`); its rows are :data:`benchmarks.compare.claim_sets.V3`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import METHODS, ROOT
from benchmarks.compare import tuning
from benchmarks.compare.analysis import load_records
from benchmarks.compare.plan import ABLATIONS, RunSpec, Sizes, stage_lr
from vgrpo.config import merge_overrides

V3 = replace(Sizes(), seeds=10, ablation_seeds=7, preference_seeds=5, stability_seeds=3)
"""Seeds per cell: 10 per method (E2 at Bonferroni; E1 needs 7), 7 per ablation (A6 at Bonferroni), 5 per preference
cell, 3 per GenEval stress cell (S1 is an estimation row)."""
PREFERENCE_STRESS_SEEDS = 15  # S2 at Bonferroni
OWN_RATE_SEEDS = 9  # S2's count at 0.05 (S1o and S2o are estimation rows)
SEED0 = {"methods": 1000, "stability": 1100, "own_rate": 1200, "ablation": 1300, "preference": 1400}
"""Fresh seed bases: no v3 cell reuses a v2 seed (0-4, 100-102, 200-201) or a tuning seed (1500-)."""
PHASES = ("base", "methods", "stability", "own_rate", "ablation", "preference")
TUNING_RECORDS = ROOT / "docs" / "benchmarks-v3" / "tuning" / "cells.jsonl"
"""The tuning sweep's committed records, which decide each method's recipe and rate."""
PREREGISTRATION = ROOT / "docs" / "benchmarks" / "v3-preregistration.md"


class NotPreregistered(RuntimeError):
    """The v3 grid may not start: its pre-registration is a draft or not committed."""


def check_preregistered(path: Path = PREREGISTRATION, root: Path = ROOT) -> None:
    """Refuse to run the grid before its pre-registration is fixed: ``path`` must say no ``DRAFT`` and be
    committed as it is (a :class:`NotPreregistered` naming the file otherwise), so that the commit that fixes the
    rows, rules and seeds precedes the first cell."""
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


STRESSED = ("vgrpo", "naive_elbo")  # the stability rows compare these two


@dataclass(frozen=True)
class Tuned:
    """A method's recipe and rate from the tuning sweep."""

    recipe: str
    lr: float
    overrides: dict[str, Any]


def tuned_settings(tuning_records: dict[str, dict[str, Any]]) -> dict[str, Tuned]:
    """Each method's chosen rung, once every rung the sweep plans for it has finished; a ``RuntimeError`` naming
    the methods whose choice is still open otherwise."""
    planned = tuning.plan(tuning_records)
    done = {(r.method, r.recipe, r.lr) for r in tuning.rungs(tuning_records)}
    chosen = tuning.choose(tuning_records)
    open_ = [
        m
        for m in METHODS
        if chosen[m] is None or any((s.method, s.variant, s.lr) not in done for s in planned if s.method == m)
    ]
    if open_:
        raise RuntimeError(f"the tuning sweep has not settled {open_}: run `python -m benchmarks.compare.tuning`")
    out = {}
    for m in METHODS:
        rung = chosen[m]
        assert rung is not None
        out[m] = Tuned(rung.recipe, rung.lr, tuning.RECIPES[m][rung.recipe])
    return out


def plan_phase(phase: str, tuned: dict[str, Tuned], sizes: Sizes = V3) -> list[RunSpec]:
    """The cells of one v3 phase. Every cell keeps the variant names the claims group by (``default`` for a
    method's own recipe) and carries its recipe in ``overrides``."""
    it, every = sizes.iterations, sizes.eval_every
    stress_it, stress_every = sizes.stability_iterations, sizes.stability_eval_every
    if phase == "base":
        return [RunSpec("base", "base", "geneval"), RunSpec("base", "base", "preference")]
    if phase == "methods":
        return [
            RunSpec(
                "methods",
                m,
                lr=tuned[m].lr,
                seed=SEED0["methods"] + s,
                overrides=tuned[m].overrides,
                iterations=it,
                eval_every=every,
            )
            for s in range(sizes.seeds)
            for m in METHODS
        ]

    def own(m: str, reward: str) -> tuple[float, dict[str, Any]]:
        return (tuned[m].lr, tuned[m].overrides) if reward == "geneval" else (stage_lr("preference"), {})

    if phase == "stability":
        seeds = {"geneval": sizes.stability_seeds, "preference": PREFERENCE_STRESS_SEEDS}
        return [
            RunSpec(
                "stability",
                m,
                reward,
                lr=mult * own(m, reward)[0],
                seed=SEED0["stability"] + s,
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
                seed=SEED0["own_rate"] + s,
                variant="x1",
                overrides=own(m, reward)[1],
                iterations=stress_it,
                eval_every=stress_every,
            )
            for reward in ("geneval", "preference")
            for s in range(OWN_RATE_SEEDS)
            for m in STRESSED
        ]
    if phase == "ablation":
        return [
            RunSpec(
                "ablation",
                "vgrpo",
                lr=tuned["vgrpo"].lr,
                seed=SEED0["ablation"] + s,
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
                seed=SEED0["preference"] + s,
                iterations=sizes.preference_iterations,
                eval_every=every,
            )
            for s in range(sizes.preference_seeds)
            for m in STRESSED
        ]
    raise ValueError(f"unknown phase {phase!r}")


def load_tuned(path: Path = TUNING_RECORDS) -> dict[str, Tuned]:
    """:func:`tuned_settings` from the tuning sweep's committed records."""
    return tuned_settings(load_records(path) if path.is_file() else {})


def full_plan(tuned: dict[str, Tuned], sizes: Sizes = V3) -> list[RunSpec]:
    return [s for p in PHASES for s in plan_phase(p, tuned, sizes)]
