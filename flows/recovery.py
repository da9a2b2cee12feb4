"""A flow run whose machine died runs again on another worker, from the stages' last checkpoints.

Prefect's own mechanism, as its documentation sets it up for zombie flow runs: every flow run a worker starts sends
a heartbeat event (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds apart; ``scripts/worker.sh`` sets it), and two
automations on the server act on the project's flow runs (the curriculum flow ``vgrpo`` and the sweep flow
``vgrpo-sweep``):

* :data:`CRASH_SILENT`: a run that sent a heartbeat and then nothing (no heartbeat, no final state) for
  ``silence_s`` seconds is marked ``Crashed``: its machine, its worker or its process is gone;
* :data:`RETRY_CRASHED`: a ``Crashed`` run is set back to ``Scheduled`` (named ``AwaitingRetry``, as the UI's
  retry does), so whichever worker of the pool is free takes the same flow run, with the same parameters.

The run then starts over on that worker and finds what the dead one left in the shared store (:mod:`tasks.store`):
the stages it finished are cache hits or restored by content hash, and the stage it was training resumes from the
newest checkpoint it uploaded; what is lost is the iterations since that checkpoint. A run that crashes again and
again (a process killed for memory on every machine) fails after :data:`MAX_ATTEMPTS` starts
(:func:`check_attempts`) instead of looping.

    python -m flows.deploy --pool vgrpo      # registers the deployments and these automations
"""

from __future__ import annotations

from datetime import timedelta

from prefect import get_client
from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.runtime import flow_run

__all__ = [
    "CRASH_SILENT",
    "CURRICULUM_FLOW_NAME",
    "MACHINE_FLOW_NAME",
    "MAX_ATTEMPTS",
    "RETRY_CRASHED",
    "SWEEP_FLOW_NAME",
    "check_attempts",
    "install_recovery",
]

CRASH_SILENT = "vgrpo: crash silent flow runs"
RETRY_CRASHED = "vgrpo: retry crashed flow runs"

CURRICULUM_FLOW_NAME = "vgrpo"
"""The curriculum flow's name (:mod:`flows.curriculum`): its deployments are ``vgrpo/<name>``."""

SWEEP_FLOW_NAME = "vgrpo-sweep"
"""The ablation sweep flow's name (:mod:`flows.sweep`): its deployment is ``vgrpo-sweep/ablation-sweep``."""

RETRIED_FLOWS = (CURRICULUM_FLOW_NAME, SWEEP_FLOW_NAME)
"""The flows whose crashed runs start again (the automations act on the project's runs only)."""

MACHINE_FLOW_NAME = "vgrpo-machine"
"""The flow of machine r > 0 of a stage spanning machines: crashed when silent, never retried by itself (machine
0's train task starts the machines again when it retries the stage)."""

MAX_ATTEMPTS = 4
"""Starts of one flow run (the first and the retries after crashes) before it fails instead of starting again."""

SILENCE_S = 300
"""Default seconds without a heartbeat before a run counts as crashed: above Prefect's default heartbeat period
(180 s) as well as ``scripts/worker.sh``'s (30 s). A silence shorter than the workers' period crashes live runs,
and another worker then runs them a second time."""

FINAL = ("prefect.flow-run.Completed", "prefect.flow-run.Failed", "prefect.flow-run.Cancelled")


def _runs_of(*flows: str) -> tuple[ResourceSpecification, ResourceSpecification]:
    return (
        ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
        ResourceSpecification({"prefect.resource.role": "flow", "prefect.resource.name": list(flows)}),
    )


def automations(silence_s: int = SILENCE_S) -> list[Automation]:
    """The two automations (:data:`CRASH_SILENT`, :data:`RETRY_CRASHED`), not yet saved."""
    match, related = _runs_of(*RETRIED_FLOWS, MACHINE_FLOW_NAME)
    crash = Automation(
        name=CRASH_SILENT,
        description="A vgrpo flow run that stopped sending heartbeats lost its machine: mark it Crashed.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Crashed", *FINAL},
            match=match,
            match_related=related,
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=silence_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {silence_s} s: the run's machine or worker is gone",
            )
        ],
    )
    match, related = _runs_of(*RETRIED_FLOWS)
    retry = Automation(
        name=RETRY_CRASHED,
        description="A crashed vgrpo flow run starts again on whichever worker is free, from its checkpoints.",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match=match,
            match_related=related,
            for_each={"prefect.resource.id"},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.SCHEDULED,
                name="AwaitingRetry",
                message="crashed: scheduled again, to resume from the shared store's checkpoints",
                force=True,
            )
        ],
    )
    return [crash, retry]


def install_recovery(silence_s: int = SILENCE_S) -> list[str]:
    """Save :func:`automations` on the Prefect server (``PREFECT_API_URL``), replacing earlier ones of the same
    names; returns their names."""
    with get_client(sync_client=True) as client:
        for automation in automations(silence_s):
            for old in client.read_automations_by_name(automation.name):
                client.delete_automation(old.id)
            automation.create()
    return [CRASH_SILENT, RETRY_CRASHED]


def check_attempts(max_attempts: int = MAX_ATTEMPTS) -> None:
    """Fail this flow run (rather than let it crash and be retried once more) when it has started more than
    ``max_attempts`` times."""
    attempts = flow_run.get_run_count()
    if attempts > max_attempts:
        raise RuntimeError(
            f"flow run {flow_run.get_name()} started {attempts} times (crashed each time before): giving up; "
            "see the earlier attempts' logs for what killed them"
        )
