"""Serve the ``vgrpo`` flow's deployments from this process (``prefect.serve``), so that
``prefect deployment run vgrpo/<name>`` runs them:

* ``embedded-curriculum`` -- the five-stage curriculum on the embedded default (runs on a CPU);
* ``sd35-curriculum`` -- the paper's SD3.5-Medium curriculum (weights under ``$VGRPO_MODELS``, docs/real-models.md);
* ``flux-multireward`` -- the paper's FLUX.1-dev multi-reward run (``params/curricula/flux.yaml``; needs the FLUX
  adapter of the next issue);
* ``ablation-sweep`` -- the embedded GenEval stage once per file of ``params/ablations/`` (the paper's ablation
  grid), each cell its own flow run of this deployment, at most ``devices`` training at once
  (``-p devices=8`` on 8 GPUs), all nested under one sweep run in MLflow.

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

from prefect import serve
from prefect.deployments.runner import RunnerDeployment

from flows.curriculum import vgrpo

ROOT = Path(__file__).resolve().parents[1]

ABLATIONS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "params" / "ablations").glob("*.yaml"))

DEPLOYMENTS: dict[str, dict[str, Any]] = {
    "embedded-curriculum": {"curriculum": "params/curricula/embedded.yaml"},
    "sd35-curriculum": {"curriculum": "params/curricula/sd35.yaml"},
    "flux-multireward": {"curriculum": "params/curricula/flux.yaml"},
    "ablation-sweep": {"curriculum": "params/curricula/embedded-ablation.yaml", "ablations": ABLATIONS},
}


def main() -> None:
    # to_deployment returns the deployment itself when called outside an event loop, as here.
    deployments = [
        cast(RunnerDeployment, vgrpo.to_deployment(name=name, parameters=parameters))
        for name, parameters in DEPLOYMENTS.items()
    ]
    serve(*deployments, limit=int(os.environ.get("VGRPO_SERVE_LIMIT", "4")))


if __name__ == "__main__":
    main()
