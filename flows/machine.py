"""Machine r > 0 of a stage that spans machines, as a flow run a pool's worker takes (:mod:`tasks.stage_machine`).

Machine 0's train task submits one run of ``vgrpo-machine/stage-machine`` per other machine; each holds this
machine's devices for its processes while they train. The flow has its own name so that the pool's retry of
crashed runs (:mod:`flows.recovery`) leaves it alone: machine 0's train task starts the machines again when it
retries the stage.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.devices import local_devices
from flows.recovery import MACHINE_FLOW_NAME
from tasks.machine_job import MachineJob
from tasks.stage_machine import run_machine

__all__ = ["stage_machine_flow"]


@flow(name=MACHINE_FLOW_NAME, log_prints=True)
def stage_machine_flow(job: dict[str, Any], machine_rank: int, root: str = ".") -> None:
    """Run machine ``machine_rank``'s processes of the stage ``job`` (a :class:`tasks.machine_job.MachineJob` as
    JSON, written by machine 0's launch)."""
    machine_job = MachineJob.from_json(job)
    with local_devices(machine_job.stage.launch.processes_per_machine):
        run_machine(machine_job, machine_rank, root, log=get_run_logger().info)
