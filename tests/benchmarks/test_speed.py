"""benchmarks.speed: the committed repeats rebuild the committed speed tables, and a measurement records the
machine's load and is not run again."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from benchmarks import provenance
from benchmarks.common import ROOT


def test_the_committed_speed_repeats_rebuild_the_committed_speed_tables() -> None:
    from benchmarks import speed

    args = Namespace(repeats=3, embedded_iterations=5, sd35_iterations=2)
    raw = ROOT / "docs" / "benchmarks" / "speed"
    assert len(list(raw.glob("*-T*-r*.json"))) == 2 * 3 * 3  # all committed, so `measure` only reads them
    results = {t: speed.measure(t, raw, args) for t in (10, 20, 40)}
    tables = speed.table(results, args)
    committed = (ROOT / "docs" / "benchmarks" / "speed.md").read_text().splitlines()
    start = committed.index("## Embedded base (8 prompts x 8 samples)")  # the header names this machine's CPU
    assert tables[tables.index(committed[start]) :] == [*committed[start:], ""]
    assert speed.spread([3.0, 1.0, 2.0]) == "2.00 (1.00-3.00)"


def test_a_speed_measurement_records_the_machine_load_and_is_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import speed

    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **_: object) -> None:  # the measured process writes its JSON where it is told
        calls.append(cmd)
        Path(cmd[-1]).write_text(json.dumps({"results": {}, "args": {}}))

    monkeypatch.setattr(speed.subprocess, "run", fake_run)
    monkeypatch.setattr(speed, "wait_until_idle", lambda: None)
    args = Namespace(repeats=2, embedded_iterations=1, sd35_iterations=1)
    first = speed.measure(10, tmp_path, args)
    assert len(calls) == 4 and sorted(p.name for p in tmp_path.iterdir()) == [
        f"{n}-T10-r{k}.json" for n in ("embedded", "sd35_arch") for k in (0, 1)
    ]
    assert all(set(x["machine"]) >= {"other_load_cores", "under_load", "process_cpu_s"} for x in first["embedded"])
    assert speed.measure(10, tmp_path, args) == first and len(calls) == 4
    note = speed.load_note({10: first})  # all four recorded: no line about measurements that predate recording
    assert len(note) == 3 and f"of 4 ran above {provenance.LOADED_CORES} cores" in note[2]
    assert speed.load_note({10: {"embedded": [{"results": {}}]}})[2].startswith("- 1 of 1 measurements predate")


def test_regenerating_the_tables_keeps_the_sections_written_by_hand(tmp_path: Path) -> None:
    """The roofline and levers sections between the introduction and the first table survive a regeneration."""
    from benchmarks import speed

    committed = (ROOT / "docs" / "benchmarks" / "speed.md").read_text().splitlines()
    kept = speed.written_sections(ROOT / "docs" / "benchmarks" / "speed.md")
    assert kept[0] == "## Against the machine's limit: the roofline command"
    assert "## The merged LoRA and the learning outcome" in kept and speed.EMBEDDED_HEADING not in kept
    assert committed[committed.index(kept[0]) : committed.index(speed.EMBEDDED_HEADING)] == kept
    assert speed.written_sections(tmp_path / "absent.md") == []
