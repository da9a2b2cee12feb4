"""The v4 report built from synthetic records of the v4 plan: its title, deviations and protocol, the 17-row
family with the equal-cost rows, and the verdicts read again under other streams and with the replicate group."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from benchmarks.compare import grid, registered, report
from tests.benchmarks.compare.test_exchange_check import RECORDS, SMALL
from tests.benchmarks.compare.test_plan_v4 import TUNED


def test_the_v4_report_from_the_records_of_its_plan(tmp_path: Path) -> None:
    folder = tmp_path / "cells"
    folder.mkdir()
    for name, r in RECORDS.items():
        (folder / f"{name}.json").write_text(json.dumps(r))
    planned = [s.name for s in grid.full_plan(TUNED, SMALL)]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "grid.json").write_text(json.dumps([{"started_at": "a", "elapsed_s": 7200.0, "workers": 1, "threads": 2}]))
    deviations = tmp_path / "grid-deviations.md"
    deviations.write_text("# Deviations\n\n- None yet.\n")
    v4 = dataclasses.replace(registered.GRIDS["v4"], design=SMALL, deviations=deviations)
    rows = report.write_report(
        folder, docs, command=v4.command, planned=planned, sizes=SMALL.sizes, grid=v4, tuned=TUNED
    )
    text = (docs / "README.md").read_text()
    assert text.startswith("# Benchmark v4: the re-tuned methods at 160 iterations on one machine type")
    assert text.index("- None yet.") < text.index("## Protocol (pre-registered)")
    assert "[../grid-preregistration.md](../grid-preregistration.md)" in text
    words = " ".join(text.split())
    assert "4 per method (160 iterations, evaluated every 20) and a replicate group of 4 V-GRPO seeds" in words
    assert "The 17 confirmatory rows are Holm-corrected" in words and "non-inferiority at 0.03" in words
    assert f"Cells done: {len(planned)} of {len(planned)} planned" in text
    assert '| V-GRPO | nmc10 | 0.0004 | `{"algorithm": {"n_mc": 10}}` |' in text
    ids = [r.id for r in rows]
    assert ids[:8] == ["E1", "E4", "E2", "E5", "E3", "D1", "D2", "D3"]
    assert sum(r.confirmatory for r in rows) == 17
    streams = text.index("## The verdicts under other random streams")
    exchange = text.index("## The verdicts under the exchange of a seed group")
    assert streams < exchange
    table = text[exchange:].split("\n\n")[2].splitlines()[2:]
    assert len(table) == len(rows) and all(line.endswith("| yes |") for line in table)  # same effect, other seeds
