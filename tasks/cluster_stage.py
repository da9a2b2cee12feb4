"""One curriculum stage on the machines a batch scheduler gave a job (docs/cluster.md): the command Slurm's ``srun``
starts once per node (``scripts/slurm/stage.sbatch``) and a ``PyTorchJob``'s pods each run
(``deploy/kubernetes/stage.pytorchjob.yaml``), in the project root on every machine::

    python -m tasks.cluster_stage --curriculum params/curricula/embedded.yaml --stage 3 --run-root runs/slurm/embedded

The scheduler's environment gives the machines, this machine's rank, its processes (one per GPU) and the rendezvous
(:func:`vgrpo.parallel.schedulers.placement_from_env`); the stage's ``launch:`` takes them. Then each machine runs
what a pool's worker runs for a stage across machines (:mod:`tasks.launch`), the same ``accelerate launch``:

* machine 0 trains as the train task does (:func:`tasks.stage.run_tracked_stage`: rank 0 tracks, checkpoints and
  exports; checkpoints from the store first), at ``VGRPO_HOST:VGRPO_PORT`` = the placement's rendezvous, then
  evaluates the adapter here, writing ``--outcome`` when given;
* machine r > 0 runs :func:`tasks.stage_machine.run_machine` (the starting adapter and checkpoints from the store,
  then ``accelerate launch --machine_rank r`` at the same rendezvous).

A job the scheduler kills and starts again (a requeue, a restarted pod) runs the same command with the same
environment: the stage resumes from its newest checkpoint, in the run folder or the store. Exit status 2: a setting
to fix (named); 3: the stage diverged; 1: the processes failed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tasks.launch import LaunchFailed
from tasks.machine_job import MachineJob
from tasks.stage import run_tracked_stage
from tasks.stage_layout import dir_hash
from tasks.stage_machine import run_machine
from tasks.stage_store import project_path, restore_stage
from tasks.store import Store
from vgrpo.atomic import write_json_atomic
from vgrpo.config import StageConfig, load_curriculum, overrides_from_pairs
from vgrpo.errors import UserError
from vgrpo.parallel.schedulers import Placement, launch_section, placement_from_env, without_rendezvous_variables
from vgrpo.training.guards import TrainingDiverged

__all__ = ["arguments", "main", "scheduled_stage"]


def scheduled_stage(cfg: StageConfig, placement: Placement) -> StageConfig:
    """``cfg`` on the scheduler's machines and processes, validated again (the batch must split over them)."""
    dumped = cfg.model_dump(mode="json")
    return StageConfig.model_validate({**dumped, "launch": launch_section(dumped["launch"], placement)})


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _starting_adapter(init: str | None, stages: list[StageConfig], stage: int, run_root: Path) -> str | None:
    """The adapter stage ``stage`` starts from: ``init`` (``none``: the base pipeline), else the previous stage's
    under ``run_root``, brought from the store when another job finished it on other machines."""
    if init is not None:
        return None if init == "none" else init
    if stage == 1:
        return None
    previous = stages[stage - 2].name
    path = run_root / "stages" / previous
    store = Store.from_env()
    if not path.is_dir() and store is not None:
        restore_stage(store, run_root, previous)
    return str(path)


def _other_machine(cfg: StageConfig, init: str | None, run_root: str, placement: Placement) -> None:
    """Machine ``placement.machine_rank`` > 0: the pool's machine-r body on the scheduler's rendezvous."""
    job = MachineJob(
        stage=cfg,
        run_root=project_path(run_root),
        init_lora=project_path(init) if init else None,
        init_hash=dir_hash(Path(init)) if init and Path(init).is_dir() else None,
        machine_0=None,  # a scheduler never puts two of a job's machines on one host
        main_ip=placement.main_addr,
        main_port=placement.main_port,
    )
    run_machine(job, placement.machine_rank, ".")


def arguments() -> argparse.ArgumentParser:
    """The command line every machine of the job runs (the sbatch file's and the manifest's)."""
    parser = argparse.ArgumentParser(prog="python -m tasks.cluster_stage", description=__doc__.split("\n")[0])
    parser.add_argument("--curriculum", required=True, help="curriculum params file")
    parser.add_argument("--stage", type=int, required=True, help="1-based stage number in the curriculum")
    parser.add_argument("--run-root", required=True, help="adapters: RUN_ROOT/stages, checkpoints: RUN_ROOT/work")
    parser.add_argument("--init", default=None, help="adapter to start from ('none': the base pipeline)")
    parser.add_argument("--params", nargs="*", default=[], help="extra params files merged after the stage's")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a params entry")
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: the curriculum's name)")
    parser.add_argument("--outcome", default=None, help="JSON to write with the stage's outcome (machine 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    try:
        placement = placement_from_env(os.environ, _visible_gpus())
        spec, stages = load_curriculum(args.curriculum, overrides_from_pairs(args.set), extra=args.params)
        if not 1 <= args.stage <= len(stages):
            raise UserError(f"--stage {args.stage}: {args.curriculum} has stages 1..{len(stages)}")
        cfg = scheduled_stage(stages[args.stage - 1], placement)
        init = _starting_adapter(args.init, stages, args.stage, Path(args.run_root))
        if init is not None and not Path(init).is_dir():
            raise UserError(f"stage {args.stage} starts from {init}, which is not here (run the previous stage)")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # What is left of the scheduler's rendezvous would reach the launcher and this process's own evaluation.
    scheduler_env = dict(os.environ)
    os.environ.clear()
    os.environ.update(without_rendezvous_variables(scheduler_env))
    print(f"{cfg.name}: {placement.describe()}", flush=True)
    try:
        if placement.machine_rank > 0:
            _other_machine(cfg, init, args.run_root, placement)
            return 0
        os.environ.update(VGRPO_HOST=placement.main_addr, VGRPO_PORT=str(placement.main_port))
        outcome = run_tracked_stage(
            cfg,
            init,
            args.run_root,
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"),
            experiment=args.experiment or spec.name,
            tags={"vgrpo.runner": placement.scheduler, "vgrpo.job": placement.job},
            start_machines=lambda job, ranks: print(f"{cfg.name}: machines {list(ranks)} are the scheduler's"),
        )
    except TrainingDiverged as exc:  # the message names the intact checkpoint a rerun resumes from
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except LaunchFailed as exc:  # a machine or its processes lost: the scheduler's retry resumes the stage
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.outcome:
        write_json_atomic(Path(args.outcome), outcome.to_json())
    print(f"{cfg.name}: {outcome.out_dir} ({outcome.hash}), resumed from {outcome.resumed_from}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
