"""A stage on ``launch.processes`` processes: ``accelerate launch`` started by the Prefect train task and by DVC's
stage command (:func:`tasks.stage.train`), and its outcome read back.

:func:`launch_stage` writes the stage's spec (params, starting adapter, folders, MLflow tracking) to
``<run_root>/work/<stage>/launch/spec.json`` and starts, in its own process group::

    python -m accelerate.commands.launch --num_processes N --num_machines M --mixed_precision P
        (--config_file F | --multi_gpu) [--main_process_port PORT] -m tasks.launched_stage spec.json

Each process trains its share of every batch (:mod:`vgrpo.parallel.distributed`; gloo on CPU, NCCL on GPUs). Every
line rank 0 prints (and the launcher's own) goes to ``log`` (the Prefect task's logger, or stdout under DVC); the
other ranks write to ``launch/rank-<r>.log``. Rank 0 writes its :class:`tasks.outcome.StageOutcome` (history,
evaluations, resumed_from, the output's hash) atomically to ``launch/result.json``; a rank that meets an error a
user can fix writes it there. When the caller is interrupted (a cancelled flow run, Ctrl-C) the whole group is
stopped; when a process fails, torchrun stops the others.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from tasks.outcome import StageOutcome
from tasks.process_group import log_tail, stop_group
from tasks.tracking import Tracking
from vgrpo.atomic import write_json_atomic
from vgrpo.config import StageConfig
from vgrpo.errors import ConfigError, UserError
from vgrpo.parallel.launch import LaunchConfig
from vgrpo.training.guards import TrainingDiverged

__all__ = ["ERRORS", "LaunchFailed", "accelerate_command", "launch_stage", "read_result", "run_streaming"]

PROJECT = Path(__file__).resolve().parents[1]
"""The folder holding ``tasks`` and ``vgrpo``: on the launched processes' ``PYTHONPATH``."""

ERRORS: dict[str, type[Exception]] = {cls.__name__: cls for cls in (ConfigError, UserError, TrainingDiverged)}
"""Errors a rank reports in the result file, raised again in the caller as the same class (a user's error stays
one: exit code 2 from DVC's stage command, 3 for a diverged stage)."""

STOP_GRACE_S = 30.0
"""Seconds the launcher has to stop its processes after SIGTERM before the group is killed."""

_TAIL_LINES = 40  # of the launcher's output and each rank's log, in the error of a failed launch


class LaunchFailed(RuntimeError):
    """The launched processes exited with an error; the message holds the end of their output."""


def free_port() -> int:
    """A TCP port free on this machine now: the processes' rendezvous (concurrent stages never share one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accelerate_command(launch: LaunchConfig, spec: Path, root: Path, port: int | None = None) -> list[str]:
    """The ``accelerate launch`` command line (this interpreter's accelerate) that runs :mod:`tasks.launched_stage`
    on ``spec``. Without ``launch.accelerate_config`` the processes are accelerate's multi-GPU kind (torchrun);
    without CUDA they join with gloo on CPU (:meth:`vgrpo.parallel.distributed.Distributed.from_environment`). ``port``
    (one machine only) overrides the config file's rendezvous port."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(launch.processes),
        "--num_machines",
        str(launch.machines),
        "--mixed_precision",
        launch.mixed_precision,
        "--dynamo_backend",
        "no",
    ]
    if launch.accelerate_config is not None:
        cmd += ["--config_file", str(root / launch.accelerate_config)]
    else:
        cmd.append("--multi_gpu")
    if launch.machines > 1:
        cmd += ["--machine_rank", "0"]
    if port is not None:
        cmd += ["--main_process_port", str(port)]
    return [*cmd, "-m", "tasks.launched_stage", str(spec)]


def run_streaming(cmd: Sequence[str], log: Callable[[str], None], env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` in its own process group, passing each line of its output (stdout and stderr; a progress bar's
    carriage returns end lines too) to ``log``; returns the exit code. On any exception in here (an interrupt,
    a failing ``log``) the group is stopped (SIGTERM, SIGKILL after :data:`STOP_GRACE_S`) before it propagates."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.strip():
                log(line.rstrip("\n"))
        return proc.wait()
    except BaseException:
        stop_group(proc, STOP_GRACE_S)
        raise
    finally:
        proc.stdout.close()


def read_result(path: Path) -> StageOutcome | None:
    """The result file: rank 0's outcome, ``None`` when none was written; an error a rank reported is raised
    again (its :data:`ERRORS` class)."""
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if "error" in result:
        error = result["error"]
        raise ERRORS.get(error["kind"], RuntimeError)(error["message"])
    return StageOutcome.from_json(result)


def launch_stage(
    cfg: StageConfig,
    init_lora: str | None,
    run_root: str,
    root: str,
    tracking: Tracking | None,
    log: Callable[[str], None] = print,
) -> StageOutcome:
    """Train stage ``cfg`` on the processes its ``launch`` asks for and return rank 0's outcome:
    :func:`tasks.stage.train_and_track`'s. Paths are passed as given: the processes run in this directory.

    Raises:
        ConfigError, UserError, TrainingDiverged: as a rank raised them.
        LaunchFailed: any other failure, with the end of the processes' output.
    """
    launch, name = cfg.launch, cfg.name
    folder = Path(run_root) / "work" / name / "launch"
    spec, result = folder / "spec.json", folder / "result.json"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (result, *folder.glob("rank-*.log")):
        stale.unlink(missing_ok=True)
    written = {
        "stage": cfg.model_dump(mode="json"),
        "init_lora": init_lora,
        "run_root": run_root,
        "root": root,
        "tracking": asdict(tracking) if tracking is not None else None,
        "result": str(result),
        "logs": str(folder),
    }
    write_json_atomic(spec, written)
    cmd = accelerate_command(launch, spec.resolve(), Path(root), port=free_port() if launch.machines == 1 else None)
    log(f"{name}: launching {launch.processes} processes: {' '.join(cmd)}")
    if launch.machines > 1:
        log(f"{name}: on machine r of 1..{launch.machines - 1}, run the same command with --machine_rank r")
    paths = os.pathsep.join(p for p in (str(PROJECT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": paths, "PYTHONUNBUFFERED": "1"}
    output: deque[str] = deque(maxlen=_TAIL_LINES)

    def keep(line: str) -> None:
        output.append(line)
        log(line)

    code = run_streaming(cmd, keep, env)
    returned = read_result(result)  # raises what rank 0 reported
    if code == 0 and returned is not None:
        return returned
    ranks = "".join(f"\n--- {p.name}:\n{log_tail(p, _TAIL_LINES)}" for p in sorted(folder.glob("rank-*.log")))
    raise LaunchFailed(
        f"stage {name}: accelerate launch exited with {code}"
        f"{'' if returned is None else ' after rank 0 wrote its result'}; the end of its output:\n"
        + "\n".join(output)
        + ranks
    )
