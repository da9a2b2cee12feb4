"""benchmarks.compare.tuning: every candidate recipe is a valid stage config, and the stability criterion, the
choice and the extensions do what the module states, on synthetic records."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.compare import tuning
from benchmarks.compare.plan import Sizes, stage_config
from tests.benchmarks.compare.tuning_records import sweep_records


def _records(curves: dict[tuple[str, str, float], list[list[float]]], base: float = 0.40) -> dict[str, Any]:
    return sweep_records(tuning.V3, curves, base)


def test_every_candidate_recipe_builds_a_stage_config(tmp_path: Path) -> None:
    prompts = tmp_path / "val.jsonl"
    prompts.write_text("")
    for spec in tuning.plan({})[1:]:
        config = stage_config(spec, Sizes(), prompts)
        assert config.iterations == tuning.ITERATIONS and config.algorithm.name == spec.method
        assert spec.split == "val" and spec.seed in (tuning.TUNING_SEED0, tuning.TUNING_SEED0 + 1)
    official = stage_config(tuning.tuning_spec("mixgrpo", "official", 8e-4, 0), Sizes(), prompts)
    assert (official.algorithm.window_size, official.algorithm.shift_interval) == (2, 16)
    assert official.rollout.group_noise == "shared"
    assert {(m, r) for m, r in tuning.ORDER} == {(m, r) for m in tuning.RECIPES for r in tuning.RECIPES[m]}


def test_a_late_collapse_is_not_chosen_and_the_stable_best_is() -> None:
    flat = [0.50, 0.52, 0.53, 0.53]
    records = _records(
        {
            ("vgrpo", "v2", 4e-4): [flat, flat],
            ("vgrpo", "v2", 8e-4): [[0.55, 0.58, 0.60, 0.58], [0.54, 0.57, 0.59, 0.58]],
            ("vgrpo", "v2", 1.6e-3): [[0.60, 0.66, 0.62, 0.55], [0.60, 0.65, 0.66, 0.66]],  # seed 0 drops 0.11
        }
    )
    rungs = {r.lr: r for r in tuning.rungs(records)}
    assert math.isnan(rungs[4e-4].last_quarter)  # four points: none at iteration 60
    assert not tuning.stable(rungs[1.6e-3]) and rungs[1.6e-3].worst_drop == pytest.approx(0.11)
    assert rungs[1.6e-3].mean > rungs[8e-4].mean  # the highest mean, yet unstable
    chosen = tuning.choose(records)["vgrpo"]
    assert chosen is not None and chosen.lr == 8e-4
    assert tuning.extensions(tuning.rungs(records)) == []  # the best stable rung is interior


def test_below_the_base_or_diverged_is_unstable_and_an_edge_extends() -> None:
    records = _records(
        {
            ("mixgrpo", "official", 4e-4): [[0.45, 0.46], [0.44, 0.47]],
            ("mixgrpo", "official", 8e-4): [[0.46, 0.48], [0.45, 0.49]],
            ("mixgrpo", "official", 1.6e-3): [[0.25, 0.50], [0.48, 0.50]],  # 0.15 below the base at a point
        }
    )
    done = tuning.rungs(records)
    assert [tuning.stable(r) for r in done] == [True, True, False]
    assert not tuning.extensions(done)  # 8e-4 is the best stable rung and interior
    records = _records({("mixgrpo", "official", lr): [[0.45, 0.50], [0.45, 0.50]] for lr in (4e-4, 8e-4, 1.6e-3)})
    assert tuning.choose(records)["mixgrpo"].lr == 4e-4  # ties: the smaller rate ...
    extra = tuning.extensions(tuning.rungs(records))
    assert {(s.lr, s.seed) for s in extra} == {(2e-4, 1500), (2e-4, 1501)}  # ... at the edge: one rate further out
    diverged = _records({("vgrpo", "v2", 4e-4): [[0.5, 0.5], [0.5, 0.5]]})
    name = tuning.tuning_spec("vgrpo", "v2", 4e-4, 1).name
    diverged[name]["diverged"] = "non-finite loss"
    (rung,) = tuning.rungs(diverged)
    assert rung.diverged == 1 and not tuning.stable(rung)


def test_the_last_quarter_reads_a_plateau() -> None:
    rising, flat = [0.40 + 0.01 * i for i in range(8)], [0.5, 0.55, 0.6, 0.6, 0.6, 0.61, 0.6, 0.6]
    records = _records({("vgrpo", "v2", 4e-4): [rising, flat]})
    (rung,) = tuning.rungs(records)
    assert rung.last_quarter == pytest.approx(((0.47 - 0.45) + (0.6 - 0.61)) / 2)


def test_the_report_marks_the_choice() -> None:
    records = _records({("vgrpo", "v2", lr): [[0.5, 0.5 + lr], [0.5, 0.5 + lr]] for lr in (4e-4, 8e-4, 1.6e-3)})
    text = tuning.report(records, tuning.plan(records), "python -m benchmarks.compare.tuning")
    assert "| V-GRPO | v2 | **0.0016** |" in text
    assert "- V-GRPO: v2 at lr 0.0016 (mean 0.502) (provisional: 1 of its 4 rungs not finished)" in text  # 3.2e-3
    assert "- MixGRPO: not chosen yet (provisional: 9 of its 9 rungs not finished)" in text
    # The strength section reads the chosen rung: 0.5016 at the end on every prompt and seed, 0.1016 above the
    # base's 0.40, so its intervals are points.
    assert "| 1 | V-GRPO | v2 | 0.0016 | 0.502 [0.502, 0.502] | +0.102 [+0.102, +0.102] |" in text


def test_the_committed_tuning_report_rebuilds_from_its_records() -> None:
    from benchmarks.common import ROOT
    from benchmarks.compare.analysis import load_records

    folder = ROOT / "docs" / "benchmarks-v3"
    records = load_records(folder / "tuning" / "cells.jsonl")
    rebuilt = tuning.report(records, tuning.plan(records), "python -m benchmarks.compare.tuning")
    assert rebuilt == (folder / "tuning.md").read_text()


def test_the_chosen_rungs_stand_in_for_the_methods_cells_of_the_power_analysis() -> None:
    from benchmarks.common import ROOT
    from benchmarks.compare import claim_sets
    from benchmarks.compare.analysis import Analysis, load_records
    from benchmarks.compare.claim_rows import claim_rows

    records = load_records(ROOT / "docs" / "benchmarks-v3" / "tuning" / "cells.jsonl")
    chosen = tuning.choose(records)
    grid = tuning.chosen_as_methods(records)
    picked = [m for m, r in chosen.items() if r is not None]
    assert {r["spec"]["phase"] for r in grid.values()} == {"base", "methods"}
    assert len(grid) == 1 + tuning.TUNING_SEEDS * len(picked)
    rows = {r.id: r for r in claim_rows(Analysis(grid, n_boot=200), refine_near=False, claims=claim_sets.V3)}
    # N1's statistic is the final V-GRPO minus naive: the two chosen rungs' seed-mean finals (GenEval's score is
    # the mean of its per-tag credits, as the claims' point weights read it).
    if {"vgrpo", "naive_elbo"} <= set(picked):
        v, n = chosen["vgrpo"], chosen["naive_elbo"]
        assert v is not None and n is not None
        assert rows["N1"].estimate == pytest.approx(v.mean - n.mean, abs=1e-9)
        assert rows["N1"].extra["seeds"] == [tuning.TUNING_SEEDS, tuning.TUNING_SEEDS]


def test_an_extension_that_ran_stays_planned_when_the_edge_moves_past_it() -> None:
    rising = {lr: [[0.5, 0.5 + lr], [0.5, 0.5 + lr]] for lr in (4e-4, 8e-4, 1.6e-3, 3.2e-3)}
    records = _records({("vgrpo", "v2", lr): c for lr, c in rising.items()})
    planned = {s.name for s in tuning.plan(records) if s.method == "vgrpo"}
    ran = {tuning.tuning_spec("vgrpo", "v2", 3.2e-3, s).name for s in range(tuning.TUNING_SEEDS)}
    nxt = {tuning.tuning_spec("vgrpo", "v2", 6.4e-3, s).name for s in range(tuning.TUNING_SEEDS)}
    assert ran <= planned and nxt <= planned and len(planned) == 5 * tuning.TUNING_SEEDS
