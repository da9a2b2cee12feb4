"""A stage on ``launch.processes`` processes: ``accelerate launch`` started by the Prefect train task and by DVC's
stage command (:func:`tasks.stage.train`), and its outcome read back.

:func:`launch_stage` writes the stage's spec (params, starting adapter, folders, MLflow tracking) to
``<run_root>/work/<stage>/launch/spec.json`` and starts, in its own process group::

    python -m accelerate.commands.launch --num_processes N --num_machines M --mixed_precision P
        (--config_file F | --multi_gpu) [--machine_rank 0 --main_process_ip IP] [--main_process_port PORT]
        -m tasks.launched_stage spec.json

Each process trains its share of every batch (:mod:`vgrpo.parallel.distributed`; gloo on CPU, NCCL on GPUs). Every
line rank 0 prints (and the launcher's own) goes to ``log`` (the Prefect task's logger, or stdout under DVC); the
other ranks write to ``launch/rank-<r>.log``. Rank 0 writes its :class:`tasks.outcome.StageOutcome` (history,
evaluations, resumed_from, the output's hash) atomically to ``launch/result.json``; a rank that meets an error a
user can fix writes it there. When the caller is interrupted (a cancelled flow run, Ctrl-C) the whole group is
stopped; when a process fails, torchrun stops the others.

With ``launch.machines > 1`` this machine is machine 0 (global rank 0, the rendezvous: torchrun's static
rendezvous at ``IP:PORT``, as ``accelerate launch`` starts it). IP is ``VGRPO_HOST`` (the address the other
machines reach this one at; the port is then one free here) or else the accelerate config's ``main_process_ip``
and port. The other machines' processes are started with the same rendezvous by ``start_machines`` (the Prefect
train task submits a flow run per machine to the pool, :mod:`tasks.stage_machine`), or by a user who runs the
command :func:`launch_stage` logs on each of them.
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

import yaml

from tasks.machine_job import MachineJob
from tasks.outcome import StageOutcome
from tasks.process_group import log_tail, stop_group
from tasks.stage_layout import dir_hash
from tasks.store import Store
from tasks.tracking import Tracking
from vgrpo.atomic import write_json_atomic
from vgrpo.config import StageConfig
from vgrpo.errors import ConfigError, UserError
from vgrpo.parallel.launch import LaunchConfig
from vgrpo.training.guards import TrainingDiverged

__all__ = [
    "ERRORS",
    "LaunchFailed",
    "MachinesLaunchFailed",
    "StartMachines",
    "accelerate_command",
    "launch_stage",
    "read_result",
    "run_launcher",
    "run_streaming",
    "write_spec",
]

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


class MachinesLaunchFailed(LaunchFailed):
    """A stage that spans machines failed outside its ranks' own errors: a machine, its processes or the network
    between them lost. The Prefect train task retries it (from its checkpoints, with machines started again)."""


StartMachines = Callable[[MachineJob, Sequence[int]], None]
"""Starts machines ``1 .. launch.machines - 1`` of a stage on the job (the Prefect train task's submits one flow run
of the pool per machine); it returns once they are submitted, not when they finish."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now: the processes' rendezvous (concurrent stages never share one)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def accelerate_command(
    launch: LaunchConfig,
    spec: Path,
    root: Path,
    port: int | None = None,
    machine_rank: int = 0,
    main_ip: str | None = None,
) -> list[str]:
    """The ``accelerate launch`` command line (this interpreter's accelerate) that runs :mod:`tasks.launched_stage`
    on ``spec``. Without ``launch.accelerate_config`` the processes are accelerate's multi-GPU kind (torchrun);
    without CUDA they join with gloo on CPU (:meth:`vgrpo.parallel.distributed.Distributed.from_environment`). ``port``
    and ``main_ip`` override the config file's rendezvous; ``machine_rank`` is this machine's of
    ``launch.machines``."""
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
        cmd += ["--machine_rank", str(machine_rank)]
        if main_ip is not None:
            cmd += ["--main_process_ip", main_ip]
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


def rendezvous(launch: LaunchConfig, root: Path) -> tuple[str | None, int | None]:
    """Machine 0's rendezvous for a stage on ``launch.machines > 1``: ``VGRPO_HOST`` and a port free on it (a pool's
    worker, whichever machine it is) or ``VGRPO_PORT`` (a scheduler's job, whose other machines compute the same
    port: :mod:`tasks.cluster_stage`), else the accelerate config's ``main_process_ip`` and port (``None``: the
    file's own). A wildcard ``VGRPO_HOST`` is refused: the other machines need one address; the rendezvous itself
    (torch's TCPStore) listens on every interface without authentication, which only an isolated network or a
    firewall confines (docs/cluster.md)."""
    host = os.environ.get("VGRPO_HOST")
    if host:
        if host.strip("[]") in ("0.0.0.0", "::", "*"):
            raise ConfigError(
                f"VGRPO_HOST={host}: give the address the other machines reach this one at (one interface, on the "
                "network the machines share: torch's rendezvous is unauthenticated; docs/cluster.md)"
            )
        port = os.environ.get("VGRPO_PORT", "")
        return host, int(port) if port.isdigit() else free_port("")
    config = yaml.safe_load((root / str(launch.accelerate_config)).read_text()) or {}
    if not config.get("main_process_ip"):
        raise ConfigError(
            f"launch.machines={launch.machines}: set VGRPO_HOST to this machine's address, or main_process_ip in "
            f"{launch.accelerate_config}"
        )
    return None, None


def write_spec(
    folder: Path, cfg: StageConfig, init_lora: str | None, run_root: str, root: str, tracking: Tracking | None
) -> Path:
    """Write the spec :mod:`tasks.launched_stage` reads to ``folder/spec.json``, clearing the previous result and
    rank logs there; returns the spec's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (folder / "result.json", *folder.glob("rank-*.log")):
        stale.unlink(missing_ok=True)
    written = {
        "stage": cfg.model_dump(mode="json"),
        "init_lora": init_lora,
        "run_root": run_root,
        "root": root,
        "tracking": asdict(tracking) if tracking is not None else None,
        "result": str(folder / "result.json"),
        "logs": str(folder),
    }
    write_json_atomic(folder / "spec.json", written)
    return folder / "spec.json"


def run_launcher(
    cmd: list[str], folder: Path, name: str, log: Callable[[str], None], holds_rank_0: bool
) -> StageOutcome | None:
    """Run ``cmd`` (:func:`accelerate_command`) with the project on ``PYTHONPATH``, each line to ``log``; returns
    rank 0's outcome when this machine ``holds_rank_0`` (``None`` on the other machines).

    Raises:
        ConfigError, UserError, TrainingDiverged: as a rank raised them.
        LaunchFailed: any other failure, with the end of the processes' output.
    """
    paths = os.pathsep.join(p for p in (str(PROJECT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": paths, "PYTHONUNBUFFERED": "1"}
    output: deque[str] = deque(maxlen=_TAIL_LINES)

    def keep(line: str) -> None:
        output.append(line)
        log(line)

    code = run_streaming(cmd, keep, env)
    returned = read_result(folder / "result.json")  # raises what a rank reported
    if code == 0 and (returned is not None or not holds_rank_0):
        return returned
    ranks = "".join(f"\n--- {p.name}:\n{log_tail(p, _TAIL_LINES)}" for p in sorted(folder.glob("rank-*.log")))
    raise LaunchFailed(
        f"stage {name}: accelerate launch exited with {code}"
        f"{'' if returned is None else ' after rank 0 wrote its result'}; the end of its output:\n"
        + "\n".join(output)
        + ranks
    )


def launch_stage(
    cfg: StageConfig,
    init_lora: str | None,
    run_root: str,
    root: str,
    tracking: Tracking | None,
    log: Callable[[str], None] = print,
    start_machines: StartMachines | None = None,
) -> StageOutcome:
    """Train stage ``cfg`` on the processes its ``launch`` asks for and return rank 0's outcome:
    :func:`tasks.stage.train_and_track`'s. Paths are passed as given: the processes run in this directory. On
    several machines, this is machine 0 and ``start_machines`` starts the others (without it, the command to run
    on each is logged); with a store, the starting adapter goes to it by content hash, for them to restore.

    Raises:
        ConfigError, UserError, TrainingDiverged: as a rank raised them.
        LaunchFailed: any other failure, with the end of the processes' output (:class:`MachinesLaunchFailed`
            when the stage spans machines).
    """
    launch, name = cfg.launch, cfg.name
    folder = Path(run_root) / "work" / name / "launch"
    spec = write_spec(folder, cfg, init_lora, run_root, root, tracking)
    if launch.machines == 1:
        cmd = accelerate_command(launch, spec.resolve(), Path(root), port=free_port())
        log(f"{name}: launching {launch.processes} processes: {' '.join(cmd)}")
        returned = run_launcher(cmd, folder, name, log, holds_rank_0=True)
    else:
        main_ip, main_port = rendezvous(launch, Path(root))
        cmd = accelerate_command(launch, spec.resolve(), Path(root), port=main_port, main_ip=main_ip)
        log(f"{name}: launching machine 0 of {launch.machines}: {' '.join(cmd)}")
        init_hash = None
        if init_lora:  # by its content hash, where the other machines restore it from (tasks.stage_store)
            init_hash = dir_hash(Path(init_lora))
            store = Store.from_env()
            if store is not None and not store.has(f"adapters/{init_hash}"):
                store.put_dir(Path(init_lora), f"adapters/{init_hash}")
        job = MachineJob.from_this_machine(cfg, init_lora, init_hash, run_root, root, main_ip, main_port)
        job_file = folder / "machine-job.json"
        write_json_atomic(job_file, job.to_json())
        if start_machines is not None:
            start_machines(job, range(1, launch.machines))
        else:
            log(f"{name}: on machine r of 1..{launch.machines - 1}, run: python -m tasks.stage_machine {job_file} r")
        try:
            returned = run_launcher(cmd, folder, name, log, holds_rank_0=True)
        except LaunchFailed as exc:
            raise MachinesLaunchFailed(str(exc)) from exc
    assert returned is not None  # holds_rank_0: run_launcher raised otherwise
    return returned
