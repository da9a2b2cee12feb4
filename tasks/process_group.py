"""Starting a child process detached, and stopping it with everything it started: the child runs in its own session
(``start_new_session=True``), so its process group holds its own children too (a local Prefect server's workers,
``accelerate launch``'s ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = [
    "ProcessGroupError",
    "log_tail",
    "process_group_members",
    "process_start_time",
    "start_detached",
    "stop_group",
    "stop_process_group",
    "stop_recorded_group",
    "write_pid_file",
]


class ProcessGroupError(RuntimeError):
    """A process group survived SIGKILL."""


def start_detached(command: Sequence[str], env: dict[str, str], cwd: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own session (its process group: :func:`stop_group` stops it and its children),
    reading nothing, both its outputs to ``log``."""
    return subprocess.Popen(
        list(command),
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_group(proc: subprocess.Popen[Any], timeout: float = 15.0, kill_timeout: float = 5.0) -> None:
    """SIGTERM the process group led by ``proc``, wait up to ``timeout`` seconds for every member to exit, then
    SIGKILL it (waiting up to ``kill_timeout``); raise :class:`ProcessGroupError` if anything survives."""
    stop_process_group(proc.pid, timeout, kill_timeout, reap=proc.poll)
    # The group's members are gone, but the leader may have died after the last poll: a zombie is not a member,
    # so collect it here, or its return code stays unset.
    proc.wait(timeout=kill_timeout)


def stop_process_group(
    pgid: int, timeout: float = 15.0, kill_timeout: float = 5.0, reap: Callable[[], object] = lambda: None
) -> None:
    """:func:`stop_group` by the group's id, for a group this process did not start (a pid file's); ``reap``
    collects the leader when it is this process's child, so that it does not count as a member."""
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, kill_timeout)):
        reap()
        if not process_group_members(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            reap()  # a live leader is a member; a dead one, once reaped, is not
            if not process_group_members(pgid):
                break
            time.sleep(0.1)
    if process_group_members(pgid):
        raise ProcessGroupError(f"process group {pgid} survived SIGKILL: {process_group_members(pgid)}")


def process_group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in process group ``pgid``, read from ``/proc``."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "(comm)": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat``), or None when there is none: with
    the pid, what names one process across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[19])  # field 22, "starttime"


def write_pid_file(path: Path, pid: int) -> None:
    """Record ``pid`` with its start time (``<pid> <start>``), for :func:`stop_recorded_group`."""
    path.write_text(f"{pid} {process_start_time(pid)}\n")


def stop_recorded_group(path: Path, timeout: float = 15.0) -> bool:
    """Stop the process group a pid file of :func:`write_pid_file` names, and remove the file; returns whether it
    signalled. It signals only the group it started: while the leader lives, only when its start time is the one
    recorded (a stale pid now another process's is left alone); once the leader is gone, its group's remaining
    members (the kernel reuses no pid while a group of that id has members)."""
    try:
        pid_text, _, start_text = path.read_text().partition(" ")
        pid, start = int(pid_text), int(start_text) if start_text.strip().isdigit() else None
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return False
    now = process_start_time(pid)
    ours = (now is None or now == start) and start is not None
    if ours and process_group_members(pid):
        stop_process_group(pid, timeout)
    path.unlink(missing_ok=True)
    return ours


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a child process's log (empty when it cannot be read): what an error shows."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
