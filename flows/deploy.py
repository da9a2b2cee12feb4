"""Serve the project's deployments from this process (``prefect.serve``), so that
``prefect deployment run vgrpo/<name>`` runs them (both flows are named ``vgrpo``):

* ``embedded-curriculum`` -- the five-stage curriculum on the embedded default (runs on a CPU);
* ``sd35-curriculum`` -- the paper's SD3.5-Medium curriculum (weights under ``$VGRPO_MODELS``, docs/real-models.md);
* ``flux-multireward`` -- the paper's FLUX.1-dev multi-reward run (``params/curricula/flux.yaml``; needs the FLUX
  adapter of the next issue);
* ``ablation-sweep`` -- the sweep flow (:mod:`flows.sweep`): the embedded GenEval stage once per file of
  ``params/ablations/`` (the paper's ablation grid), each cell a flow run of ``ablation-cell``, at most
  ``devices`` training at once (``-p devices=8`` on 8 GPUs), all nested under one sweep run in MLflow;
* ``ablation-cell`` -- the curriculum flow on the ablation curriculum: one cell, ``-p ablation=FILE``.

The serving process runs up to ``VGRPO_SERVE_LIMIT`` (default 4) flow runs at once: a sweep's own run waits for its
cells, so it needs at least ``devices + 1``.

    python -m flows.deploy        # needs PREFECT_API_URL (scripts/services-env.sh sets it)

Parameters given with ``prefect deployment run ... -p overrides='{"rollout": {"group_size": 4}}'`` override
every stage's params.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from prefect import Flow, serve
from prefect.deployments.runner import RunnerDeployment

from flows.curriculum import curriculum_flow
from flows.sweep import CELL_DEPLOYMENT, ablation_sweep

ROOT = Path(__file__).resolve().parents[1]

ABLATIONS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "params" / "ablations").glob("*.yaml"))

ABLATION_CURRICULUM = "params/curricula/embedded-ablation.yaml"

DEPLOYMENTS: dict[str, tuple[Flow[..., Any], dict[str, Any]]] = {
    "embedded-curriculum": (curriculum_flow, {"curriculum": "params/curricula/embedded.yaml"}),
    "sd35-curriculum": (curriculum_flow, {"curriculum": "params/curricula/sd35.yaml"}),
    "flux-multireward": (curriculum_flow, {"curriculum": "params/curricula/flux.yaml"}),
    CELL_DEPLOYMENT.partition("/")[2]: (curriculum_flow, {"curriculum": ABLATION_CURRICULUM}),
    "ablation-sweep": (ablation_sweep, {"curriculum": ABLATION_CURRICULUM, "ablations": ABLATIONS}),
}
"""Deployment name -> the flow it runs and its default parameters."""


def deployments() -> list[RunnerDeployment]:
    """:data:`DEPLOYMENTS` as deployments to serve."""
    # to_deployment returns the deployment itself when called outside an event loop, as here.
    return [
        cast(RunnerDeployment, flow.to_deployment(name=name, parameters=parameters))
        for name, (flow, parameters) in DEPLOYMENTS.items()
    ]


def main() -> None:
    serve(*deployments(), limit=int(os.environ.get("VGRPO_SERVE_LIMIT", "4")))


if __name__ == "__main__":
    main()
