"""The five-stage embedded curriculum with its stages alternating between two machines' workers ends with the
adapters of the same curriculum on one machine, to the bit.

Each "machine" is its own checkout with its own worker, polling its own work queue of the pool; the curriculum
runs as five flow runs of ``vgrpo/embedded-curriculum``, the k-th with ``until`` its k-th stage, sent to machine
a's queue and machine b's in turn. So each run finds stages 1..k-1 done, some on the other machine: their outputs
come from the shared store by content hash and their outcomes from the store as JSON (each machine keeps its own
Prefect results), and it trains stage k from stage k-1's adapter. The stages are the shipped ones, shortened (two
iterations each, a tiny evaluation: the model params of tests/flows/test_pipeline_e2e.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tasks.process_group import stop_group
from tests.cluster.pool import REPO, deploy_to_pool, worker
from tests.cluster.servers import team_services
from tests.flows.test_pipeline_e2e import TINY_MODEL

pytestmark = pytest.mark.slow

CURRICULUM = "params/curricula/embedded.yaml"
RUNS = "runs/curriculum"


def _params(dst: Path) -> list[str]:
    """The project's params, shortened; returns the curriculum's stage names."""
    shutil.copytree(REPO / "params", dst)
    (dst / "models" / "embedded.yaml").write_text(yaml.safe_dump(TINY_MODEL))
    names = []
    for rel in yaml.safe_load((REPO / CURRICULUM).read_text())["curriculum"]["stages"]:
        path = dst / Path(rel).relative_to("params")
        stage = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**stage, "iterations": 2, "checkpoint_every": 1}))
        names.append(stage["name"])
    return names


def _checkout(root: Path, shared: Path) -> Path:
    root.mkdir(parents=True)
    for name in ("flows", "models", "configs"):
        (root / name).symlink_to(REPO / name)
    (root / "params").symlink_to(shared / "params")
    (root / "data").mkdir()
    (root / "data" / "world").symlink_to(shared / "world")
    return root


def test_the_embedded_curriculum_alternating_between_two_machines_ends_with_the_one_machine_adapters(
    tmp_path: Path,
) -> None:
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    shared, store = tmp_path / "shared", tmp_path / "store"
    shared.mkdir()
    names = _params(shared / "params")
    world = [sys.executable, "-m", "vgrpo.world.cli", "world-splits", "--params", "params/embedded/pretrain.yaml"]
    made = subprocess.run([*world, "--out", str(shared / "world")], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-3000:]
    checkouts = {n: _checkout(tmp_path / n, shared) for n in ("a", "b")}
    with team_services(store) as team:
        env = team.client_env(PREFECT_RUNNER_POLL_FREQUENCY="2", PREFECT_WORKER_QUERY_SECONDS="2")
        deploy_to_pool(env)
        with temporary_settings(team.prefect_settings()), get_client(sync_client=True) as client:
            for n in checkouts:
                client.create_work_queue(name=f"machine-{n}", work_pool_name="vgrpo")
        workers = {
            n: worker(f"machine-{n}", c, f"machine-{n}", env, tmp_path / f"w-{n}.log") for n, c in checkouts.items()
        }
        try:
            with temporary_settings(team.prefect_settings()):
                runs = []
                for k, until in enumerate(names):
                    queue = "machine-a" if k % 2 == 0 else "machine-b"
                    params = {"curriculum": CURRICULUM, "run_root": RUNS, "until": until}
                    runs.append(run_deployment("vgrpo/embedded-curriculum", parameters=params, work_queue_name=queue))
                reference = run_deployment(
                    "vgrpo/embedded-curriculum",
                    parameters={"curriculum": CURRICULUM, "run_root": "runs/one-machine"},
                    work_queue_name="machine-a",
                )
        finally:
            for w in workers.values():
                stop_group(w)
    logs = "".join((tmp_path / f"w-{n}.log").read_text()[-3000:] for n in checkouts)
    assert all(r.state.is_completed() for r in [*runs, reference]), logs
    curriculum = "embedded-curriculum"

    def manifest(run_root: str, stage: str) -> dict[str, str]:
        return json.loads((store / run_root / curriculum / "work" / stage / "export.json").read_text())

    for k, stage in enumerate(names):
        trained_on = checkouts["a" if k % 2 == 0 else "b"] / RUNS / curriculum / "work" / stage / "checkpoints"
        other = checkouts["b" if k % 2 == 0 else "a"] / RUNS / curriculum / "work" / stage / "checkpoints"
        assert trained_on.is_dir() and not other.exists(), stage  # each stage trained on its machine only
        alternated, alone = manifest(RUNS, stage), manifest("runs/one-machine", stage)
        assert alternated["hash"] == alone["hash"], stage
        assert alternated["init_hash"] == alone["init_hash"], stage
