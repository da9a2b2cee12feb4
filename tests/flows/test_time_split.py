"""The main job's wall time by part: the parts sum to the total, each from the clock that measured it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.time_split import PARTS, flow_split, format_split, job_split, main, read_marks, stage_times


def test_a_stage_splits_into_its_loop_timings_and_the_flows_clocks() -> None:
    timings = {"setup_s": 3.0, "iterations_s": 100.0, "evaluation_s": 10.0, "checkpoint_s": 1.5, "export_s": 0.5}
    parts = stage_times(timings, prompts_s=0.25, train_s=120.0, evaluate_s=20.0)
    assert parts == {"training": 100.0, "evaluation": 30.0, "loading": 5.25, "orchestration": 5.0}
    cached = stage_times({}, prompts_s=0.25, train_s=0.5, evaluate_s=0.1)  # a cache hit: only the flow's clocks
    assert cached == {"training": 0.0, "evaluation": 0.1, "loading": 0.25, "orchestration": 0.5}


def test_the_flow_and_the_job_parts_sum_to_their_totals() -> None:
    stages = [
        {"training": 100.0, "evaluation": 30.0, "loading": 5.25, "orchestration": 5.0},
        {"training": 50.0, "evaluation": 12.0, "loading": 4.0, "orchestration": 2.0},
    ]
    flow = flow_split(stages, total_s=220.0)
    assert flow == {"training": 150.0, "evaluation": 42.0, "loading": 9.25, "orchestration": 18.75, "total": 220.0}
    marks = {"start": 1000.0, "setup": 1030.0, "services": 1045.0, "flow": 1275.0, "evaluations": 1395.0}
    job = job_split({**marks, "end": 1400.0}, flow)
    assert job["total"] == 400.0 and job["flow_run"] == 230.0
    assert job["loading"] == 30.0 + 15.0 + 9.25
    assert job["evaluation"] == 42.0 + 120.0 and job["training"] == 150.0
    assert job["orchestration"] == pytest.approx(400.0 - 150.0 - 162.0 - 54.25)  # the flow's 18.75 + 10 + 5
    assert sum(job[p] for p in PARTS) == pytest.approx(job["total"], abs=1e-9)
    without_flow = job_split({"start": 0.0, "setup": 10.0, "services": 20.0, "flow": 90.0, "end": 100.0}, None)
    assert without_flow["loading"] == 20.0 and without_flow["orchestration"] == 80.0
    assert format_split(job).splitlines()[2] == "| training | 2.5 | 38% |"


def test_bad_marks_are_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\['end'\] missing"):
        job_split({"start": 0.0}, None)
    with pytest.raises(ValueError, match="not in order"):
        job_split({"start": 10.0, "setup": 5.0, "end": 20.0}, None)
    with pytest.raises(ValueError, match="negative"):
        flow_split([], -1.0)
    bad = tmp_path / "marks.txt"
    bad.write_text("start 1.0\nsetup\n")
    with pytest.raises(ValueError, match=r"marks.txt:2: expected 'NAME EPOCH_SECONDS'"):
        read_marks(bad)


def test_the_command_prints_the_table_and_writes_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marks = tmp_path / "marks.txt"
    marks.write_text("start 100.0\nsetup 110.0\nservices 120.0\nflow 220.0\nevaluations 260.0\nend 262.0\n")
    flow = tmp_path / "time_split.json"
    split = {"training": 60.0, "evaluation": 20.0, "loading": 5.0, "orchestration": 5.0, "total": 90.0}
    flow.write_text(json.dumps({"split": split}))
    out = tmp_path / "metrics" / "curriculum_time.json"
    assert main(["--marks", str(marks), "--flow", str(flow), "--out", str(out)]) == 0
    assert "| evaluation | 1.0 | 37% |" in capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["training"] == 60.0 and written["evaluation"] == 60.0 and written["loading"] == 25.0
    assert sum(written[p] for p in PARTS) == pytest.approx(written["total"], abs=0.05) and written["total"] == 162.0
    assert main(["--marks", str(tmp_path / "none.txt")]) == 2
