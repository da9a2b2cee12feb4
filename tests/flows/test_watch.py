"""The curriculum's live line, read from the flow's and the stage's progress files by a separate process."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

from flows.watch import current_line, newest_state, watch, write_stage_state
from vgrpo.training.stage import ProgressView


def test_the_line_follows_the_flow_and_the_training_stage(tmp_path: Path) -> None:
    run = tmp_path / "embedded-curriculum"
    stages = ["s1-preference", "s2-geneval", "s3-preference"]
    write_stage_state(run, stages, 1, "training")
    assert current_line(run / "progress.json") == ("1:training", "stage 2/3 s2-geneval | loading the model, resuming")
    view = ProgressView(
        "s2-geneval", 40, stream=io.StringIO(), state_file=run / "work" / "s2-geneval" / "progress.json"
    )
    view.on_log({"reward/total_mean": 0.5, "time/iteration_s": 4.0}, 11)  # resumed at 11: 12 of 40 done
    assert current_line(run / "progress.json") == (
        "1:training",
        "stage 2/3 s2-geneval | iteration 12/40 | 4.0 s/it | ETA 1m52s | reward 0.500",
    )
    write_stage_state(run, stages, 1, "evaluating")
    assert current_line(run / "progress.json") == ("1:evaluating", "stage 2/3 s2-geneval | evaluating")
    write_stage_state(run, stages, 2, "done")
    assert current_line(run / "progress.json") == ("2:done", "all 3 stages done")
    assert newest_state(tmp_path, since=0.0) == run / "progress.json"  # not the stage's file under work/
    assert newest_state(tmp_path, since=time.time() + 60) is None  # written before the run started


def test_the_watcher_writes_a_line_per_phase_and_stops_with_the_process(tmp_path: Path) -> None:
    run = tmp_path / "c"
    write_stage_state(run, ["a", "b"], 0, "training")
    state = run / "work" / "a" / "progress.json"
    ProgressView("a", 2, stream=io.StringIO(), state_file=state).on_log(
        {"reward/total_mean": 0.25, "time/iteration_s": 1.0}, 0
    )
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    out = io.StringIO()
    lines = watch(tmp_path, since=0.0, pid=child.pid, out=out, every_s=60.0, poll_s=0.05)
    child.wait()
    assert out.getvalue().splitlines() == ["stage 1/2 a | iteration 1/2 | 1.0 s/it | ETA 1s | reward 0.250"]
    assert lines == 1
    assert not os.path.exists(tmp_path / "progress.json")
