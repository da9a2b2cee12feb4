"""Machine r > 0 of a stage that spans machines: its ``launch.processes / launch.machines`` processes, joined to
machine 0's at its rendezvous (:mod:`tasks.launch`).

:func:`run_machine` first brings from the shared store (:mod:`tasks.store`) what every rank reads: the starting
adapter (by its content hash) and the stage's checkpoints (a resumed stage loads on every rank the checkpoint rank
0 picked), then starts ``accelerate launch --machine_rank r`` on the same spec as machine 0, in this checkout.
Its ranks train their share of each batch silently (rank 0, on machine 0, tracks and writes the outcome); an
error a user can fix is raised here as the rank raised it.

A pool's worker runs it as a flow run (``vgrpo-machine/stage-machine``, submitted by machine 0's train task); by
hand, on each other machine, with the job file machine 0 wrote::

    python -m tasks.stage_machine runs/curriculum/<name>/work/<stage>/launch/machine-job.json 1
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from tasks.launch import accelerate_command, run_launcher, write_spec
from tasks.machine_job import MachineJob, this_machine
from tasks.stage_layout import stage_dirs
from tasks.stage_store import restore_adapter, restore_checkpoints
from tasks.store import Store
from vgrpo.errors import UserError

__all__ = ["main", "run_machine"]


def run_machine(job: MachineJob, machine_rank: int, root: str = ".", log: Callable[[str], None] = print) -> None:
    """Run machine ``machine_rank``'s processes of the stage ``job`` describes, in the project at ``root`` (the job's
    paths were checked when it was made: inside this checkout).

    Raises:
        UserError: this is machine 0's own worker, or the starting adapter is neither here nor in the store.
        ConfigError, TrainingDiverged, LaunchFailed: as :func:`tasks.launch.run_launcher`.
    """
    cfg = job.stage
    if job.machine_0 == this_machine(root):
        raise UserError(
            f"stage {cfg.name}: machine {machine_rank} landed on the worker that runs machine 0, whose devices it "
            "holds; give the workers of stages across machines one run at a time (VGRPO_LIMIT=1 scripts/worker.sh)"
        )
    if not 0 < machine_rank < cfg.launch.machines:
        others = f"1..{cfg.launch.machines - 1}"
        raise UserError(f"machine rank {machine_rank}: stage {cfg.name}'s other machines are {others}")
    run_root = str(Path(root) / job.run_root)
    init_lora = str(Path(root) / job.init_lora) if job.init_lora else None
    store = Store.from_env()
    if store is not None:
        if init_lora is not None and not restore_adapter(store, Path(init_lora), str(job.init_hash)):
            missing = f"its starting adapter {job.init_hash} is not in the store {store.url}"
            raise UserError(f"stage {cfg.name}: {missing}")
        fetched = restore_checkpoints(store, run_root, cfg.name, root)
        if fetched:
            log(f"{cfg.name}: checkpoints {', '.join(fetched)} from the store ({store.url})")
    if init_lora is not None and not Path(init_lora).is_dir():
        raise UserError(f"stage {cfg.name}: its starting adapter {init_lora} is not on this machine (set VGRPO_STORE)")
    folder = stage_dirs(run_root, cfg.name)[1] / "launch" / f"machine-{machine_rank}"
    spec = write_spec(folder, cfg, init_lora, run_root, root, None)
    cmd = accelerate_command(
        cfg.launch, spec.resolve(), Path(root), port=job.main_port, machine_rank=machine_rank, main_ip=job.main_ip
    )
    log(f"{cfg.name}: launching machine {machine_rank} of {cfg.launch.machines}: {' '.join(cmd)}")
    run_launcher(cmd, folder, cfg.name, log, holds_rank_0=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run machine r of a stage that spans machines (docs/cluster.md).")
    parser.add_argument("job", type=Path, help="the machine-job.json machine 0 wrote (on a folder both see)")
    parser.add_argument("machine_rank", type=int, help="this machine's rank, 1 .. launch.machines - 1")
    parser.add_argument("--root", default=".", help="the project root on this machine")
    args = parser.parse_args(argv)
    run_machine(MachineJob.from_json(json.loads(args.job.read_text())), args.machine_rank, args.root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
