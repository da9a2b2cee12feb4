"""Stopping a child process and everything it started: the child runs in its own session (``start_new_session=True``),
so its process group holds its own children too (a local Prefect server's workers, ``accelerate launch``'s ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["ProcessGroupError", "process_group_members", "stop_group"]


class ProcessGroupError(RuntimeError):
    """A process group survived SIGKILL."""


def stop_group(proc: subprocess.Popen[Any], timeout: float = 15.0, kill_timeout: float = 5.0) -> None:
    """SIGTERM the process group led by ``proc``, wait up to ``timeout`` seconds for every member to exit, then
    SIGKILL it (waiting up to ``kill_timeout``); raise :class:`ProcessGroupError` if anything survives."""
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, kill_timeout)):
        proc.poll()  # reap the leader so that it does not count as a member
        if not process_group_members(proc.pid):
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (proc.poll() is None or process_group_members(proc.pid)):
            time.sleep(0.1)
    if process_group_members(proc.pid):
        raise ProcessGroupError(f"process group {proc.pid} survived SIGKILL: {process_group_members(proc.pid)}")


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
