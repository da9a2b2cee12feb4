"""``down`` signals only the process group ``up`` started: a pid file records the leader's start time, and a pid
that now names another process (the leader died, the pid was reused) is left alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tasks.process_group import process_group_members, process_start_time, stop_recorded_group, write_pid_file


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"], start_new_session=True)


def test_a_stale_pid_now_naming_another_process_is_not_signalled(tmp_path: Path) -> None:
    other = _sleeper()  # stands for whatever now holds the pid the services' leader had
    try:
        start = process_start_time(other.pid)
        assert start is not None
        pid_file = tmp_path / "prefect.pid"
        pid_file.write_text(f"{other.pid} {start - 1}\n")  # recorded for an earlier process of that pid
        assert not stop_recorded_group(pid_file)
        assert other.poll() is None and process_group_members(other.pid) == [other.pid]
        assert not pid_file.exists()
        pid_file.write_text(f"{other.pid}\n")  # a pid file without a start time (an older `up`): not trusted either
        assert not stop_recorded_group(pid_file) and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_recorded_group_is_stopped(tmp_path: Path) -> None:
    leader = _sleeper()
    pid_file = tmp_path / "mlflow.pid"
    write_pid_file(pid_file, leader.pid)
    assert pid_file.read_text().split() == [str(leader.pid), str(process_start_time(leader.pid))]
    assert stop_recorded_group(pid_file, timeout=5)
    assert leader.wait(timeout=5) is not None and not pid_file.exists()
