"""The pool's recovery automations (flows.recovery) as Prefect receives them, without a server: which runs each
acts on, after how long, and what it does; and the bound on a run's restarts. tests/cluster/test_recovery.py
(slow) kills a machine under them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flows.recovery import CRASH_SILENT, RETRY_CRASHED, automations, check_attempts


def test_a_silent_run_is_crashed_and_a_crashed_one_scheduled_again_for_the_projects_flows_only() -> None:
    crash, retry = automations(silence_s=90)
    assert (crash.name, retry.name) == (CRASH_SILENT, RETRY_CRASHED)
    assert crash.trigger.posture == "Proactive" and crash.trigger.within == timedelta(seconds=90)
    assert crash.trigger.after == {"prefect.flow-run.heartbeat"}
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed"} <= crash.trigger.expect
    assert crash.actions[0].state == "CRASHED"
    # A stage's other machines are crashed when silent, but only the curriculum and sweep runs are retried: machine
    # 0's train task starts the machines again itself.
    assert crash.trigger.match_related["prefect.resource.name"] == ["vgrpo", "vgrpo-sweep", "vgrpo-machine"]
    assert retry.trigger.match_related["prefect.resource.name"] == ["vgrpo", "vgrpo-sweep"]
    assert retry.trigger.expect == {"prefect.flow-run.Crashed"} and retry.trigger.posture == "Reactive"
    assert (retry.actions[0].state, retry.actions[0].name) == ("SCHEDULED", "AwaitingRetry")


def test_a_run_that_crashed_on_every_start_fails_at_the_fifth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("flows.recovery.flow_run.get_run_count", lambda: 4)
    check_attempts()
    monkeypatch.setattr("flows.recovery.flow_run.get_run_count", lambda: 5)
    with pytest.raises(RuntimeError, match=r"started 5 times \(crashed each time before\): giving up"):
        check_attempts()
