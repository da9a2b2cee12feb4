"""Machine r > 0 of a stage that spans machines, as a flow run a pool's worker takes (:mod:`tasks.stage_machine`).

Machine 0's train task submits one run of ``vgrpo-machine/stage-machine`` per other machine; each holds this
machine's devices for its processes while they train. The flow has its own name so that the pool's retry of
crashed runs (:mod:`flows.recovery`) leaves it alone: machine 0's train task starts the machines again when it
retries the stage.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.devices import local_devices
from tasks.launch import MachineJob
from tasks.stage_machine import run_machine
from vgrpo.config import StageConfig

__all__ = ["stage_machine_flow"]


@flow(name="vgrpo-machine", log_prints=True)
def stage_machine_flow(job: MachineJob, machine_rank: int, root: str = ".") -> None:
    """Run machine ``machine_rank``'s processes of the stage ``job`` (written by machine 0's launch)."""
    launch = StageConfig.model_validate(job["stage"]).launch
    with local_devices(launch.processes // launch.machines):
        run_machine(job, machine_rank, root, log=get_run_logger().info)
