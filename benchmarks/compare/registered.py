"""The pre-registered grids, each as one record of where its parts live: its design (the cells), its tuning sweep
(the recipes), its claim set (the rows), its pre-registration, its deviations and its report folder. The runner
(``python -m benchmarks.compare --grid v3|v4``) and the report read a grid from :data:`GRIDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.compare import grid, plan_v3, plan_v4, tuning, tuning_v4
from benchmarks.compare.analysis import load_records
from benchmarks.compare.claim_sets import V3, V4
from benchmarks.compare.grid import Design, Tuned
from benchmarks.compare.rules import ClaimSet
from benchmarks.compare.rungs import Sweep


@dataclass(frozen=True)
class Registered:
    """A pre-registered grid: ``docs`` holds its records (``cells.jsonl``, ``grid.json``) and its report."""

    name: str
    title: str
    design: Design
    claims: ClaimSet
    sweep: Sweep
    tuning_records: Path
    preregistration: Path
    deviations: Path
    docs: Path

    @property
    def command(self) -> str:
        return f"python -m benchmarks.compare --grid {self.name}"

    def load_tuned(self) -> dict[str, Tuned]:
        """Each method's recipe and rate from the sweep's committed records (a ``RuntimeError`` while it has not
        settled every method)."""
        records = load_records(self.tuning_records) if self.tuning_records.is_file() else {}
        return grid.tuned_settings(self.sweep, records)

    def check_preregistered(self, root: Path = ROOT) -> None:
        grid.check_preregistered(self.preregistration, root)


V3_DOCS = ROOT / "docs" / "benchmarks-v3" / "grid"
V4_DOCS = ROOT / "docs" / "benchmarks-v4" / "grid"
GRIDS = {
    "v3": Registered(
        "v3",
        "Benchmark v3: the pre-registered replication on the embedded default",
        plan_v3.DESIGN,
        V3,
        tuning.V3,
        plan_v3.TUNING_RECORDS,
        plan_v3.PREREGISTRATION,
        V3_DOCS.parent / "deviations.md",
        V3_DOCS,
    ),
    "v4": Registered(
        "v4",
        "Benchmark v4: the re-tuned methods at 160 iterations on one machine type",
        plan_v4.DESIGN,
        V4,
        tuning_v4.V4,
        plan_v4.TUNING_RECORDS,
        V4_DOCS.parent / "grid-preregistration.md",
        V4_DOCS.parent / "grid-deviations.md",
        V4_DOCS,
    ),
}
