"""The check that benchmark v3's report says the same with the pre-registration commit's analysis code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import ROOT
from benchmarks.compare import plan_v3, prereg_check
from benchmarks.compare.analysis import write_records
from tests.benchmarks.compare import synthetic

OLD = "# Report\n\nintro\n\n## Claims\n\n| a | 0.1 |\n| b | 0.2 |\n\n## Provenance\n\ncode x\n"


def test_a_report_that_only_adds_sections_changes_no_old_line() -> None:
    new = OLD.replace("## Provenance", "## Streams\n\nmoved\n\n## Provenance")
    assert prereg_check.compare(OLD, new) == [
        "Old lines changed or dropped: 0.",
        "Blocks added (every other line of the old report is there, in order): 1.",
        "- lines 10-13: `## Streams`",
    ]
    assert prereg_check.compare(OLD, OLD)[0] == "Old lines changed or dropped: 0."


def test_a_changed_or_dropped_line_is_listed_with_its_old_and_new_place() -> None:
    changed = prereg_check.compare(OLD, OLD.replace("| b | 0.2 |", "| b | 0.3 |"))
    assert changed[:2] == ["Old lines changed or dropped: 1.", "- old lines 8-8 (now lines 8-8): `| b | 0.2 |`"]
    dropped = prereg_check.compare(OLD, OLD.replace("| a | 0.1 |\n", ""))
    assert dropped[:2] == ["Old lines changed or dropped: 1.", "- old lines 7-7 (dropped): `| a | 0.1 |`"]


def test_the_preregistration_commit_changed_its_file_and_it_has_not_changed_since() -> None:
    commit, path = prereg_check.preregistration_commit(), str(plan_v3.PREREGISTRATION.relative_to(ROOT))

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)

    assert path in git("show", "--name-only", "--format=", commit).stdout.split()
    assert git("diff", "--quiet", commit, "HEAD", "--", path).returncode == 0


@pytest.mark.slow
def test_the_report_built_from_head_s_archive_matches_this_checkout(tmp_path: Path) -> None:
    records = tmp_path / "cells.jsonl"
    write_records(records, synthetic.v3_grid(plan_v3.load_tuned()))
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare.prereg_check", "--commit", "HEAD", "--records", str(records)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Old lines changed or dropped: 0." in out and "Blocks added" in out and ": 0." in out.splitlines()[-1], out
