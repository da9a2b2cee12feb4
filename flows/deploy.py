"""Serve the ``vgrpo`` flow's deployments from this process (``prefect.serve``), so that
``prefect deployment run vgrpo/<name>`` runs them:

* ``embedded-curriculum`` -- the five-stage curriculum on the embedded default (runs on a CPU);
* ``sd35-curriculum`` -- the paper's SD3.5-Medium curriculum (set the weight paths in ``params/models/sd35.yaml``).

    python -m flows.deploy        # needs PREFECT_API_URL (python -m flows.services env)

Parameters given with ``prefect deployment run ... -p overrides='{"rollout": {"group_size": 4}}'`` override
every stage's params.
"""

from __future__ import annotations

from typing import cast

from prefect import serve
from prefect.deployments.runner import RunnerDeployment

from flows.curriculum import vgrpo

DEPLOYMENTS: dict[str, str] = {
    "embedded-curriculum": "params/curricula/embedded.yaml",
    "sd35-curriculum": "params/curricula/sd35.yaml",
}


def main() -> None:
    # to_deployment returns the deployment itself when called outside an event loop, as here.
    deployments = [
        cast(RunnerDeployment, vgrpo.to_deployment(name=name, parameters={"curriculum": path}))
        for name, path in DEPLOYMENTS.items()
    ]
    serve(*deployments, limit=1)


if __name__ == "__main__":
    main()
