"""Benchmark v3's cells, as ``docs/benchmarks/v3-preregistration.md`` proposes them: the v2 phases at the seed counts
of its power analysis, on fresh seeds, each method at the recipe and rate the tuning sweep chose
(:mod:`benchmarks.compare.tuning`), and a phase at each method's own rate evaluated at the stress cadence (the
S1o/S2o rows' cells).

The runner runs it as ``python -m benchmarks.compare --grid v3`` (:mod:`benchmarks.compare.runner`), once the
tuning sweep has settled every method (:func:`tuned_settings`) and the pre-registration is committed
(:func:`check_preregistered`); its rows are :data:`benchmarks.compare.claim_sets.V3`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT
from benchmarks.compare import grid, tuning
from benchmarks.compare.analysis import load_records
from benchmarks.compare.grid import Design, Tuned
from benchmarks.compare.plan import RunSpec, Sizes

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
DESIGN = Design(
    sizes=V3,
    seed0=SEED0,
    phases=PHASES,
    preference_stress_seeds=PREFERENCE_STRESS_SEEDS,
    own_rate_seeds=OWN_RATE_SEEDS,
)
"""The v3 grid as :mod:`benchmarks.compare.grid` lays it out: the preference cells run each method's preset."""


NotPreregistered = grid.NotPreregistered


def check_preregistered(path: Path = PREREGISTRATION, root: Path = ROOT) -> None:
    """:func:`benchmarks.compare.grid.check_preregistered` on v3's pre-registration."""
    grid.check_preregistered(path, root)


def tuned_settings(tuning_records: dict[str, dict[str, Any]]) -> dict[str, Tuned]:
    """Each method's chosen rung in v3's sweep (:func:`benchmarks.compare.grid.tuned_settings`)."""
    try:
        return grid.tuned_settings(tuning.V3, tuning_records)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}: run `python -m benchmarks.compare.tuning`") from None


def plan_phase(phase: str, tuned: dict[str, Tuned], sizes: Sizes = V3) -> list[RunSpec]:
    """The cells of one v3 phase (:func:`benchmarks.compare.grid.plan_phase` on :data:`DESIGN`)."""
    return grid.plan_phase(phase, tuned, replace(DESIGN, sizes=sizes))


def load_tuned(path: Path = TUNING_RECORDS) -> dict[str, Tuned]:
    """:func:`tuned_settings` from the tuning sweep's committed records."""
    return tuned_settings(load_records(path) if path.is_file() else {})


def full_plan(tuned: dict[str, Tuned], sizes: Sizes = V3) -> list[RunSpec]:
    return grid.full_plan(tuned, replace(DESIGN, sizes=sizes))
