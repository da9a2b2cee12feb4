"""Slurm's commands as the tests stand them in, on PATH (no Slurm here): ``srun`` starts the step's tasks as local
processes, one per node of ``SLURM_JOB_NODELIST``, each with the variables srun gives a task; ``sbatch`` records its
command line and prints a job id (``--parsable``). :func:`install` writes both into a folder to put first on PATH.

What the fake ``srun`` does not do: place tasks on other hosts (every "node" is this one; the test's node list names
addresses of this host) or confine them to a cgroup (``--kill-on-bad-exit`` is honoured by killing each task's
processes)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vgrpo.parallel.schedulers import expand_nodelist

REPO = Path(__file__).resolve().parents[2]


def install(folder: Path) -> Path:
    """``folder/srun`` and ``folder/sbatch``, running this module with this interpreter; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for command in ("srun", "sbatch"):
        path = folder / command
        path.write_text(
            f'#!/bin/sh\nPYTHONPATH="{REPO}${{PYTHONPATH:+:$PYTHONPATH}}" '
            f'exec "{sys.executable}" -m tests.cluster.fake_slurm {command} "$@"\n'
        )
        path.chmod(0o755)
    return folder


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """srun's ``--name=value`` options before the command, and the command."""
    options: dict[str, str] = {}
    while argv and argv[0].startswith("--"):
        name, _, value = argv.pop(0)[2:].partition("=")
        options[name] = value
    return options, argv


def srun(argv: list[str]) -> int:
    from tests.cluster.pool import descendants  # not at the top: sbatch's start stays light

    options, command = _options(argv)
    if options.get("ntasks-per-node") != "1":
        print(f"fake srun: expected --ntasks-per-node=1, got {options}", file=sys.stderr)
        return 2
    hosts = expand_nodelist(os.environ["SLURM_JOB_NODELIST"])
    tasks = []
    for node, host in enumerate(hosts):
        step = {"SLURM_NODEID": node, "SLURM_PROCID": node, "SLURM_LOCALID": 0, "SLURMD_NODENAME": host}
        step |= {
            "SLURM_STEP_ID": 0,
            "SLURM_NTASKS": len(hosts),
            "SLURM_NNODES": len(hosts),
            "SLURM_STEP_NUM_NODES": len(hosts),
        }
        env = {**os.environ, **{k: str(v) for k, v in step.items()}}
        tasks.append(subprocess.Popen(command, env=env))
    codes: dict[int, int] = {}  # in the order the tasks ended: the first failure is the cause
    while len(codes) < len(tasks):
        for i, task in enumerate(tasks):
            if i not in codes and task.poll() is not None:
                codes[i] = task.returncode
                if task.returncode and options.get("kill-on-bad-exit") == "1":
                    for other in tasks:  # the step's cgroup, as Slurm kills it
                        for pid in descendants(other.pid):
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    return next((code for code in codes.values() if code), 0) % 256


def sbatch(argv: list[str]) -> int:
    """Append ``argv`` to ``$FAKE_SBATCH_LOG`` (one JSON list a line) and print the next job id."""
    log = Path(os.environ["FAKE_SBATCH_LOG"])
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("".join(f"{line}\n" for line in [*lines, json.dumps(argv)]))
    print(f"{1000 + len(lines)};cluster" if "--parsable" in argv else f"Submitted batch job {1000 + len(lines)}")
    return 0


if __name__ == "__main__":
    raise SystemExit({"srun": srun, "sbatch": sbatch}[sys.argv[1]](sys.argv[2:]))
