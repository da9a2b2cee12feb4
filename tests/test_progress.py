"""The progress line of a stage: the rate is the median of the last iterations, the ETA that rate times the
iterations left; off a terminal a line is written at most every ``every_s`` seconds and at the last iteration."""

from __future__ import annotations

import io
import json
from pathlib import Path

from vgrpo.progress_line import Progress, format_duration, seconds_per_iteration
from vgrpo.training.stage import ProgressView


def test_rate_is_the_median_of_the_last_five_iterations_and_eta_the_rest_at_that_rate() -> None:
    assert seconds_per_iteration([]) is None
    assert seconds_per_iteration([30.0, 4.0, 5.0, 3.0, 4.5, 4.0]) == 4.0  # the 30 s warm-up has left the window
    progress = Progress("s2-geneval", iterations=40, stage_index=2, stages=5)
    for i, (t, r) in enumerate([(30.0, 0.5), (4.0, 0.51), (5.0, 0.52), (3.0, 0.53), (4.5, 0.54), (4.0, 0.55)]):
        progress.record(i, t, r)
    assert progress.done == 6 and progress.rate == 4.0
    assert progress.eta_s == 4.0 * 34
    assert progress.line() == "stage 2/5 s2-geneval | iteration 6/40 | 4.0 s/it | ETA 2m16s | reward 0.530 0.540 0.550"


def test_a_skipped_iteration_counts_but_does_not_time() -> None:
    progress = Progress("s1", iterations=3)
    progress.record(0, 2.0, 0.1)
    progress.record(1, None, None)
    assert progress.done == 2 and progress.times == [2.0] and progress.eta_s == 2.0
    assert progress.line() == "s1 | iteration 2/3 | 2.0 s/it | ETA 2s | reward 0.100 skipped"
    assert Progress("s1", iterations=3).line() == "s1 | iteration 0/3"


def test_durations_read_as_seconds_minutes_hours() -> None:
    assert [format_duration(s) for s in (None, -1.0, 0.4, 59.4, 61.0, 3599.0, 3725.0)] == [
        "?",
        "?",
        "0s",
        "59s",
        "1m01s",
        "59m59s",
        "1h02m",
    ]


def test_off_a_terminal_the_view_writes_when_due_and_at_the_end(tmp_path: Path) -> None:
    out = io.StringIO()
    state = tmp_path / "progress.json"
    view = ProgressView("s1", 4, stream=out, every_s=3600.0, state_file=state)
    for i in range(4):
        view.on_log({"reward/total_mean": 0.25 * i, "time/iteration_s": 2.0}, i)
    assert out.getvalue().splitlines() == [
        "s1 | iteration 1/4 | 2.0 s/it | ETA 6s | reward 0.000",  # the first, then nothing for an hour but the last
        "s1 | iteration 4/4 | 2.0 s/it | ETA 0s | reward 0.250 0.500 0.750",
    ]
    saved = Progress.from_json(json.loads(state.read_text()))
    assert saved.done == 4 and saved.times == [2.0] * 4 and saved.line() == out.getvalue().splitlines()[-1]
    written = out.getvalue()
    view.on_skip({"iteration": 4, "quantity": "loss", "count": 1, "of": 8})
    assert out.getvalue() == written  # the stage's WARNING says why (tests/test_console_warnings.py)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_skip_ends_the_redrawn_line_for_the_warning_that_follows() -> None:
    out = _Terminal()
    view = ProgressView("s1", 4, stream=out)
    view.on_log({"reward/total_mean": 0.5, "time/iteration_s": 2.0}, 0)
    view.on_skip({"iteration": 1, "quantity": "loss", "count": 1, "of": 8})
    assert out.getvalue().endswith("\x1b[K\n")
