"""Serve the project's deployments from this process (``prefect.serve``), so that
``prefect deployment run FLOW/<name>`` runs them (``FLOW``: ``vgrpo``, the curriculum flow, unless named below):

* ``embedded-curriculum`` -- the five-stage curriculum on the embedded default (runs on a CPU);
* ``sd35-curriculum`` -- the paper's SD3.5-Medium curriculum (weights under ``$VGRPO_MODELS``, docs/real-models.md);
* ``qwen-image-clip-pickscore``, ``flux2-clip-pickscore``, ``z-image-pickscore``, ``wan-clip-pickscore`` --
  Qwen-Image, FLUX.2-dev, Z-Image-Turbo and Wan2.1-T2V-14B (text-to-video) with LoRA on Flow-Factory's recipes
  (``params/curricula/qwen-image.yaml``, ``flux2.yaml``, ``z-image.yaml``, ``wan.yaml``; weights under
  ``$VGRPO_MODELS``);
* ``flux-kontext-counting-edit`` -- FLUX.1-Kontext-dev (editing) on Flow-GRPO's counting-edit recipe
  (``params/curricula/flux-kontext.yaml``; its edit set from the DVC stages ``counting_edit_sources`` and
  ``counting_edit_set``, weights under ``$VGRPO_MODELS``);
* ``flux-multireward`` -- the paper's FLUX.1-dev multi-reward run (``params/curricula/flux.yaml``);
* ``ablation-sweep`` (flow ``vgrpo-sweep``) -- the sweep flow (:mod:`flows.sweep`): the embedded GenEval stage once
  per file of ``params/ablations/`` (the paper's ablation grid), each cell a flow run of ``ablation-cell``, at most
  ``devices`` training at once (``-p devices=8`` on 8 GPUs), all nested under one sweep run in MLflow;
* ``ablation-cell`` -- the curriculum flow on the ablation curriculum: one cell, ``-p ablation=FILE``;
* ``stage-machine`` (flow ``vgrpo-machine``) -- machine r > 0 of a stage that spans machines, submitted by
  machine 0's train task (:mod:`flows.machine`).

The serving process runs up to ``VGRPO_SERVE_LIMIT`` (default 4) flow runs at once: a sweep's own run waits for its
cells, so it needs at least ``devices + 1``.

    python -m flows.deploy                 # serve them from this process (PREFECT_API_URL: scripts/services-env.sh)
    python -m flows.deploy --pool vgrpo    # or register them to a Prefect work pool, for workers (docs/cluster.md)

Registered to a pool, every deployment runs on whichever worker takes it: a process worker started in its own
checkout (``scripts/worker.sh``), whose ``VGRPO_ROOT`` the deployment's pull step changes into. The sweep's own
run only waits for its cells, so it goes to the pool's ``control`` queue (a worker without devices); everything
that trains goes to the ``gpu`` queue, which the machines' workers poll with one slot per device.

Parameters given with ``prefect deployment run ... -p overrides='{"rollout": {"group_size": 4}}'`` override
every stage's params.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, cast

from prefect import Flow, get_client, serve
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.deployments.runner import RunnerDeployment
from prefect.exceptions import ObjectNotFound
from prefect.runner.storage import LocalStorage

from flows.curriculum import curriculum_flow
from flows.machine import stage_machine_flow
from flows.recovery import SILENCE_S, install_recovery
from flows.sweep import CELL_DEPLOYMENT, ablation_sweep
from tasks.stage_tasks import MACHINE_DEPLOYMENT

ROOT = Path(__file__).resolve().parents[1]

ABLATIONS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "params" / "ablations").glob("*.yaml"))

ABLATION_CURRICULUM = "params/curricula/embedded-ablation.yaml"

DEPLOYMENTS: dict[str, tuple[Flow[..., Any], dict[str, Any]]] = {
    "embedded-curriculum": (curriculum_flow, {"curriculum": "params/curricula/embedded.yaml"}),
    "sd35-curriculum": (curriculum_flow, {"curriculum": "params/curricula/sd35.yaml"}),
    "flux-multireward": (curriculum_flow, {"curriculum": "params/curricula/flux.yaml"}),
    "qwen-image-clip-pickscore": (curriculum_flow, {"curriculum": "params/curricula/qwen-image.yaml"}),
    "flux2-clip-pickscore": (curriculum_flow, {"curriculum": "params/curricula/flux2.yaml"}),
    "z-image-pickscore": (curriculum_flow, {"curriculum": "params/curricula/z-image.yaml"}),
    "wan-clip-pickscore": (curriculum_flow, {"curriculum": "params/curricula/wan.yaml"}),
    "flux-kontext-counting-edit": (curriculum_flow, {"curriculum": "params/curricula/flux-kontext.yaml"}),
    CELL_DEPLOYMENT.partition("/")[2]: (curriculum_flow, {"curriculum": ABLATION_CURRICULUM}),
    "ablation-sweep": (ablation_sweep, {"curriculum": ABLATION_CURRICULUM, "ablations": ABLATIONS}),
    MACHINE_DEPLOYMENT.partition("/")[2]: (stage_machine_flow, {}),
}
"""Deployment name -> the flow it runs and its default parameters."""


def deployments() -> list[RunnerDeployment]:
    """:data:`DEPLOYMENTS` as deployments to serve."""
    # to_deployment returns the deployment itself when called outside an event loop, as here.
    return [
        cast(RunnerDeployment, flow.to_deployment(name=name, parameters=parameters))
        for name, (flow, parameters) in DEPLOYMENTS.items()
    ]


ENTRYPOINTS: dict[str, str] = {"curriculum_flow": "flows/curriculum.py:curriculum_flow"}
ENTRYPOINTS["ablation_sweep"] = "flows/sweep.py:ablation_sweep"
ENTRYPOINTS["stage_machine_flow"] = "flows/machine.py:stage_machine_flow"
QUEUES = {"ablation-sweep": "control"}
"""Each deployment's work queue in the pool (default ``gpu``)."""


class CheckoutStorage(LocalStorage):
    """The code is already on every machine, in the checkout its worker serves: the pull step changes into
    ``$VGRPO_ROOT``, which Prefect resolves on the worker's machine when the flow run starts."""

    def to_pull_step(self) -> dict[str, Any]:
        return {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $VGRPO_ROOT }}"}}


def deploy_to_pool(pool: str, silence_s: int = SILENCE_S) -> list[str]:
    """Register :data:`DEPLOYMENTS` to the work pool ``pool`` (created as a process pool when missing) and the
    automations that run a crashed flow run again on another worker (:mod:`flows.recovery`); returns the
    deployments' names."""
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    names = []
    for name, (flow, parameters) in DEPLOYMENTS.items():
        # from_source is sync outside an event loop, as here (it returns a coroutine only inside one).
        remote = cast(Flow[..., Any], flow.from_source(CheckoutStorage(str(ROOT)), ENTRYPOINTS[flow.fn.__name__]))
        remote.deploy(
            name=name,
            work_pool_name=pool,
            work_queue_name=QUEUES.get(name, "gpu"),
            parameters=parameters,
            build=False,
            push=False,
            print_next_steps=False,
        )
        names.append(f"{flow.name}/{name}")
    install_recovery(silence_s)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", help="register the deployments to this work pool instead of serving them")
    parser.add_argument(
        "--silence",
        type=int,
        default=SILENCE_S,
        help="with --pool: seconds without a heartbeat after which a flow run counts as crashed and runs again",
    )
    args = parser.parse_args()
    if args.pool:
        for name in deploy_to_pool(args.pool, args.silence):
            print(f"{name} -> work pool {args.pool}")
        print(f"automations: a flow run silent for {args.silence} s is crashed and scheduled again")
        return
    serve(*deployments(), limit=int(os.environ.get("VGRPO_SERVE_LIMIT", "4")))


if __name__ == "__main__":
    main()
