"""The plateau diagnosis's tables from small synthetic records whose values are known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.compare.diagnosis import BEGIN, END, diagnosis_lines, main
from benchmarks.compare.diagnosis_tables import (
    by_method,
    change_table,
    diagnostic_table,
    fall_point,
    heldout_table,
    precursor_table,
    quarter_bounds,
    quarter_means,
    spread,
    tag_tables,
)
from benchmarks.compare.series import DIAGNOSTICS

TAGS = ["counting", "counting", "colors", "colors"]
SERIES = {d.record_key: d for d in DIAGNOSTICS}


def _cell(method: str, seed: int, shift: float) -> dict[str, Any]:
    """8 iterations (quarters of 2), evaluated at 2, 4, 6 and 8; the train reward is 0.1 per quarter plus ``shift``."""
    curve = [
        {"iteration": float(it), "score": 0.5 + shift + 0.01 * it, "per_prompt": [0.0, 0.5, 1.0, 0.5 + shift]}
        for it in (2, 4, 6, 8)
    ]
    record: dict[str, Any] = {
        "spec": {"phase": "methods", "method": method, "reward": "geneval", "seed": seed},
        "name": f"{method}-{seed}",
        "curve": curve,
        "train_reward": [0.1 + shift + 0.1 * (i // 2) for i in range(8)],
        "grad_norm_per_iteration": [1.0 + shift] * 4 + [0.5 + shift] * 4,
    }
    if method == "vgrpo":
        record["surrogate_cv_per_iteration"] = [0.4] * 8
        record["update_norm_per_iteration"] = [None, 2.0, 4.0, 4.0, None, None, 1.0, 3.0]
    else:
        record["update_norm_per_iteration"] = [None] * 8
    return record


def _records() -> list[dict[str, Any]]:
    base = {
        "spec": {"phase": "base", "method": "base", "reward": "geneval", "seed": 0},
        "name": "base",
        "curve": [{"iteration": 0.0, "score": 0.3, "per_prompt": [0.0, 0.0, 0.4, 0.8], "tags": TAGS}],
    }
    cells = [_cell(m, seed, shift) for m in ("diffusion_nft", "vgrpo") for seed, shift in ((1, 0.0), (0, 0.2))]
    return [base, *cells]


def test_quarters_of_a_run_and_their_means_skip_iterations_without_a_value() -> None:
    assert quarter_bounds(80) == [(0, 20), (20, 40), (40, 60), (60, 80)]
    assert quarter_bounds(8) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert quarter_means([None, 2.0, 4.0, 4.0, None, None, 1.0, 3.0]) == [2.0, 4.0, None, 2.0]
    assert spread([0.1, None, 0.3, 0.2]) == "0.2 [0.1, 0.3]" and spread([None]) == "not recorded"


def test_methods_come_in_the_reports_order_each_by_seed() -> None:
    cells = by_method(_records(), "methods", "geneval")
    assert list(cells) == ["vgrpo", "diffusion_nft"]
    assert [r["spec"]["seed"] for r in cells["vgrpo"]] == [0, 1]


def test_a_tuning_sweeps_cells_come_by_rung_each_by_seed() -> None:
    """``by="rung"``: a row per method, recipe and rate (methods in the report's order, recipes in the order of
    their first cell, rates rising), each by seed; the tables and the page take the rung labels."""
    cells = []
    for method, recipe, lr, seed in (
        ("diffusion_nft", "official", 8e-4, 1601),
        ("vgrpo", "v3", 4e-4, 1601),
        ("vgrpo", "nmc10", 2e-4, 1600),
        ("vgrpo", "v3", 2e-4, 1600),
        ("vgrpo", "v3", 4e-4, 1600),
    ):
        cell = _cell(method, seed, 0.1 * (seed - 1600))
        cell["spec"].update(phase="tune", variant=recipe, lr=lr)
        cells.append(cell)
    rungs = by_method(cells, "tune", "geneval", by="rung")
    assert list(rungs) == [
        "V-GRPO v3 lr 0.0002",
        "V-GRPO v3 lr 0.0004",
        "V-GRPO nmc10 lr 0.0002",
        "DiffusionNFT official lr 0.0008",
    ]
    assert [r["spec"]["seed"] for r in rungs["V-GRPO v3 lr 0.0004"]] == [1600, 1601]
    assert list(by_method(cells, "tune", "geneval")) == ["vgrpo", "diffusion_nft"]
    table = diagnostic_table(rungs, SERIES["grad_norm_per_iteration"])
    assert table is not None and table[2] == "| V-GRPO v3 lr 0.0002 | 1 | 1 | 0.5 | 0.5 |"
    assert table[3] == "| V-GRPO v3 lr 0.0004 | 1.05 [1, 1.1] | 1.05 [1, 1.1] | 0.55 [0.5, 0.6] | 0.55 [0.5, 0.6] |"
    lines = diagnosis_lines([_records()[0], *cells], "tune", by="rung")
    assert "Cells per rung (seeds): V-GRPO v3 lr 0.0002 1, V-GRPO v3 lr 0.0004 2, " in "\n".join(lines)


def test_a_diagnostic_table_gives_each_quarter_the_seeds_median_and_range() -> None:
    cells = by_method(_records(), "methods", "geneval")
    reward = diagnostic_table(cells, SERIES["train_reward"])
    assert reward is not None
    assert reward[0] == "| method | it. 1-2 | it. 3-4 | it. 5-6 | it. 7-8 |"
    # seeds at shift 0.2 and 0: quarter k is 0.1 (k + 1) + shift, so the median is 0.1 (k + 1) + 0.1
    assert reward[2] == "| V-GRPO | 0.2 [0.1, 0.3] | 0.3 [0.2, 0.4] | 0.4 [0.3, 0.5] | 0.5 [0.4, 0.6] |"
    cv = diagnostic_table(cells, SERIES["surrogate_cv_per_iteration"])
    assert cv is not None and cv[2] == "| V-GRPO | 0.4 [0.4, 0.4] | 0.4 [0.4, 0.4] | 0.4 [0.4, 0.4] | 0.4 [0.4, 0.4] |"
    assert cv[3] == "| DiffusionNFT | not recorded | not recorded | not recorded | not recorded |"
    update = diagnostic_table(cells, SERIES["update_norm_per_iteration"])
    assert update is not None and update[2].startswith("| V-GRPO | 2 [2, 2] | 4 [4, 4] | not recorded | 2 [2, 2] |")
    assert diagnostic_table(cells, SERIES["ratio_std_per_iteration"]) is None  # no cell has it


def test_the_held_out_and_change_tables() -> None:
    cells = by_method(_records(), "methods", "geneval")
    held = heldout_table(cells)
    assert held[0] == "| method | it. 2 | it. 4 | it. 6 | it. 8 |"
    assert held[2] == "| V-GRPO | 0.62 [0.52, 0.72] | 0.64 [0.54, 0.74] | 0.66 [0.56, 0.76] | 0.68 [0.58, 0.78] |"
    change = change_table(cells)
    assert change[0].startswith("| method | train reward, Q4 - Q3 | held-out, it. 8 - it. 6 | held-out, it. 8 - it. 4")
    # train reward +0.1 a quarter, held-out +0.01 an iteration, grad norm 0.5 / 1.0 and 0.7 / 1.2, the CV holds
    row = "| V-GRPO | 0.1 [0.1, 0.1] | 0.02 [0.02, 0.02] | 0.04 [0.04, 0.04] | 0.542 [0.5, 0.583] | 1 [1, 1] |"
    assert change[2] == row + " not recorded |"
    assert change[3].endswith("| not recorded | not recorded |")


def test_tag_tables_start_from_the_base_and_average_the_seeds() -> None:
    records = _records()
    lines = tag_tables(by_method(records, "methods", "geneval"), TAGS, records[0])
    counting = lines.index("**counting** (2 prompts)")
    assert lines[counting + 2] == "| method | 0 (base) | 2 | 4 | 6 | 8 | last: seed range |"
    assert lines[counting + 4] == "| V-GRPO | 0 | 0.25 | 0.25 | 0.25 | 0.25 | [0.25, 0.25] |"
    colors = lines.index("**colors** (2 prompts)")
    # colors: base (0.4 + 0.8) / 2; the cells (1 + 0.5 + shift) / 2, 0.85 and 0.75: mean 0.8
    assert lines[colors + 4] == "| V-GRPO | 0.6 | 0.8 | 0.8 | 0.8 | 0.8 | [0.75, 0.85] |"


def test_the_page_lists_what_is_not_recorded_and_keeps_the_reading_around_its_block(tmp_path: Path) -> None:
    block = diagnosis_lines(_records(), "methods")
    assert block[0] == BEGIN and block[-1] == END
    assert "- ratio std, last step: `train/ratio_std_last` (record key `ratio_std_last_per_iteration`)" in block
    assert not any(line.startswith("- LoRA-update norm:") for line in block)  # V-GRPO's cells record it
    records = tmp_path / "cells.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    page = tmp_path / "diagnosis.md"
    main([str(records), "--out", str(page)])
    assert page.read_text().startswith("# Plateau diagnosis\n\n```\npython -m benchmarks.compare.diagnosis")
    page.write_text(f"# Reading\n\nV-GRPO plateaus.\n\n{BEGIN}\nold tables\n{END}\n\n## After\n")
    main([str(records), "--out", str(page)])
    text = page.read_text()
    assert text.startswith("# Reading\n\nV-GRPO plateaus.\n\n" + BEGIN) and text.endswith(END + "\n\n## After\n")
    assert "old tables" not in text and "| V-GRPO | 0.2 [0.1, 0.3]" in text


def test_the_v3_diagnosis_page_holds_the_tables_of_the_committed_records() -> None:
    from benchmarks.common import ROOT
    from benchmarks.compare.analysis import load_records

    records = list(load_records(ROOT / "docs/benchmarks-v3/grid/cells.jsonl").values())
    assert "\n".join(diagnosis_lines(records, "methods")) in (ROOT / "docs/benchmarks-v3/diagnosis.md").read_text()


def test_a_held_out_fall_and_what_moved_before_it() -> None:
    """V-GRPO's seed 0 falls at iteration 6 (0.70 to 0.55, more than FALL below its best); the table shows its
    series by block up to the fall, and its seed 1, which did not fall, up to the same iteration; a method with
    no fall has no row."""
    assert fall_point([{"iteration": 2, "score": 0.6}, {"iteration": 4, "score": 0.7}]) is None
    curve = [{"iteration": float(it), "score": s} for it, s in ((2, 0.6), (4, 0.7), (6, 0.55), (8, 0.3))]
    assert fall_point(curve) == (6, 0.7, 0.55)
    cells = by_method(_records()[1:], "methods", "geneval")
    for cell in cells["vgrpo"]:
        cell["spec"]["eval_every"] = 2
    cells["vgrpo"][0]["curve"] = curve
    cells["vgrpo"][0]["surrogate_mean_per_iteration"] = [-0.4, -0.4, -0.5, -0.5, -0.9, -0.9, -2.0, -2.0]
    lines = precursor_table(cells)
    assert lines[0] == "| method | seed | held-out fell at | gradient norm | surrogate mean | train reward |"
    fell, held = lines[2:]
    assert fell.startswith("| V-GRPO | 0 | it. 6: 0.700 to 0.550 | 1.2 → 1.2 → 0.7 |")  # 3 blocks of 2 iterations
    assert "| -0.4 → -0.5 → -0.9 | 0.3 → 0.4 → 0.5 |" in fell
    assert held == "| V-GRPO | 1 | did not fall | 1 → 1 → 0.5 | not recorded | 0.1 → 0.2 → 0.3 |"
    assert precursor_table(by_method(_records()[1:], "methods", "geneval")) == []
