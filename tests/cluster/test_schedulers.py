"""A stage on two machines as the batch schedulers start it, each "machine" a local process with the environment the
scheduler gives it (gloo on CPU, one process per machine): Slurm's job through scripts/slurm/stage.sbatch and a
stand-in ``srun`` (tests/cluster/fake_slurm.py; the node list ``127.0.0.[1-2]`` names two addresses of this host,
so the first host it expands to is one the other "node" reaches), and a PyTorchJob's two pods running the manifest's
command with the operator's variables (``MASTER_ADDR`` is 127.0.0.1 here, the master's service name in a cluster),
each pod in its own checkout sharing only the store. Each ends with the adapter of the same two processes on one
machine, to the bit; a Slurm job killed mid-stage and started again with the same environment (a requeue) resumes
from its last checkpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tests.cluster.fake_slurm import install
from tests.cluster.pool import REPO, kill_machine, machine, wait_for
from tests.parallel.test_distributed import RESUME_ATOL
from tests.tiny_world import write_tiny_world
from vgrpo.parallel.schedulers import slurm_port

pytestmark = pytest.mark.slow

STAGE, ITERATIONS, EVERY = "s1-pick", 12, 3
LORA = "pytorch_lora_weights.safetensors"
ARGS = ["--curriculum", "one.yaml", "--stage", "1", "--run-root", "runs/one", "--outcome", "outcome.json"]
ARGS += ["--set", f"iterations={ITERATIONS}", f"checkpoint_every={EVERY}"]
MANIFEST = REPO / "deploy" / "kubernetes" / "stage.pytorchjob.yaml"


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _free_slurm_job_id() -> int:
    """A job id whose rendezvous port (derived from it, as on every node) is free here now."""
    start = int(time.time() * 1000) % 20000
    return next(job for job in range(start, start + 20000) if _port_is_free(slurm_port(job)))


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without a scheduler's or a tracking server's variables, with the project importable."""
    drop = ("SLURM_", "PET_", "MLFLOW_TRACKING_", "VGRPO_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    return {**env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"), n_test=4)


@pytest.fixture(scope="module")
def reference(world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The adapter of the same stage on two processes of one machine (tasks.stage.train, as a pool's worker)."""
    from tasks.stage import train
    from vgrpo.config import load_curriculum

    checkout = machine(tmp_path_factory.mktemp("one") / "checkout", world)
    overrides = {"iterations": ITERATIONS, "checkpoint_every": EVERY, "launch": {"processes": 2}}
    ((cfg,),) = [load_curriculum(checkout / "one.yaml", overrides, root=str(checkout))[1]]
    alone = train(cfg, None, str(checkout / "runs" / "one"), str(checkout), None, log=lambda line: None)
    return Path(alone.out_dir)


def _diff(a: Path, b: Path) -> float:
    one, two = load_file(a / LORA), load_file(b / LORA)
    assert set(one) == set(two)
    return max((one[k] - two[k]).abs().max().item() for k in one)


def _slurm_job(checkout: Path, job_id: int, log: Path) -> subprocess.Popen[bytes]:
    """``sbatch scripts/slurm/stage.sbatch ARGS`` as Slurm runs the batch script on the job's first node: from its
    spool (the checkout is SLURM_SUBMIT_DIR), with the job's variables; its srun is the stand-in."""
    env = _clean_env(
        PATH=f"{install(checkout.parent / 'bin')}{os.pathsep}{os.environ['PATH']}",
        VGRPO_VENV=str(REPO / ".venv"),
        SLURM_JOB_ID=str(job_id),
        SLURM_JOB_NAME="vgrpo-stage",
        SLURM_JOB_NODELIST="127.0.0.[1-2]",
        SLURM_NNODES="2",
        SLURM_JOB_NUM_NODES="2",
        SLURM_SUBMIT_DIR=str(checkout),
    )
    spool = checkout.parent / "spool"
    spool.mkdir(exist_ok=True)
    script = spool / "slurm_script"
    script.write_bytes((REPO / "scripts" / "slurm" / "stage.sbatch").read_bytes())
    with log.open("ab") as out:
        return subprocess.Popen(
            ["bash", str(script), *ARGS],
            cwd=spool,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _finished(job: subprocess.Popen[bytes], checkout: Path, log: Path, timeout: float = 900) -> dict[str, object]:
    """The outcome machine 0 wrote once the job exited 0 (its output in the failure otherwise)."""
    try:
        code = job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_machine(job)
        code = None
    assert code == 0, log.read_text(errors="replace")[-6000:]
    return json.loads((checkout / "outcome.json").read_text())


def _checkout(root: Path, world: Path) -> Path:
    """A machine's checkout (tests.cluster.pool.machine) with the project's accelerate configs, which a stage on
    several machines names (vgrpo.parallel.schedulers.DEFAULT_ACCELERATE_CONFIG)."""
    checkout = machine(root, world)
    (checkout / "configs").symlink_to(REPO / "configs")
    return checkout


@pytest.fixture
def checkout(world: Path, tmp_path: Path) -> Iterator[Path]:
    yield _checkout(tmp_path / "checkout", world)


def test_a_slurm_job_on_two_nodes_trains_the_stage_of_two_processes_on_one(checkout: Path, reference: Path) -> None:
    log = checkout.parent / "job.log"
    started = time.monotonic()
    outcome = _finished(_slurm_job(checkout, _free_slurm_job_id(), log), checkout, log)
    text = log.read_text()
    assert "machine 0 of 2" in text and "machine 1 of 2" in text and "rendezvous 127.0.0.1:" in text
    assert (checkout / "runs/one/work" / STAGE / "launch/machine-1/spec.json").is_file()  # node 1's processes ran
    out = checkout / "runs" / "one" / "stages" / STAGE
    assert outcome["out_dir"] == str(Path("runs/one/stages") / STAGE) and outcome["resumed_from"] == 0
    diff = _diff(reference, out)
    print(f"\nSlurm, 2 nodes x 1 process: {time.monotonic() - started:.0f} s; largest difference {diff:.1e}")
    assert diff == 0


def test_a_pytorchjobs_two_pods_train_the_stage_of_two_processes_on_one(
    world: Path, tmp_path: Path, reference: Path
) -> None:
    pod = yaml.safe_load(MANIFEST.read_text())["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    command = [sys.executable if c == "python" else c for c in pod["containers"][0]["command"]]
    port = next(p for p in range(23456, 24456) if _port_is_free(p))
    store = tmp_path / "store"
    pods, logs = [], []
    started = time.monotonic()
    for rank, kind in enumerate(("master", "worker")):
        checkout = _checkout(tmp_path / kind / "checkout", world)
        operator = {  # training-operator v1.9's variables for a job of 2 replicas, nprocPerNode "1"
            "MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PET_MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "PET_NODE_RANK": str(rank),
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "1",
        }
        logs.append(checkout.parent / "pod.log")
        with logs[-1].open("wb") as out:
            env = _clean_env(VGRPO_STORE=str(store), **operator)
            pods.append(
                subprocess.Popen([*command, *ARGS], cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT)
            )
    try:
        codes = [p.wait(timeout=900) for p in pods]
    finally:
        for p in pods:
            if p.poll() is None:
                kill_machine(p)
    assert codes == [0, 0], "".join(log.read_text(errors="replace")[-4000:] for log in logs)
    master = tmp_path / "master" / "checkout"
    assert "machine 1 of 2" in logs[1].read_text() and not (tmp_path / "worker/checkout/outcome.json").exists()
    assert json.loads((master / "outcome.json").read_text())["resumed_from"] == 0
    assert list((store / "runs/one/work" / STAGE / "checkpoints").glob("iter-*/.complete"))  # through the store
    diff = _diff(reference, master / "runs" / "one" / "stages" / STAGE)
    print(f"\nPyTorchJob, 2 pods x 1 process: {time.monotonic() - started:.0f} s; largest difference {diff:.1e}")
    assert diff == 0


def test_a_requeued_slurm_job_resumes_from_its_last_checkpoint(checkout: Path, reference: Path) -> None:
    job_id, log = _free_slurm_job_id(), checkout.parent / "job.log"
    checkpoints = checkout / "runs" / "one" / "work" / STAGE / "checkpoints"
    first = _slurm_job(checkout, job_id, log)
    wait_for("the first checkpoint", lambda: list(checkpoints.glob("iter-*/state.json")), 600, [log], poll=0.1)
    kill_machine(first)  # preempted: every process of the job, at once (Slurm kills the job's cgroup)
    assert not (checkout / "outcome.json").exists(), "the job finished before it was killed: nothing to resume"
    kept = max(int(p.parent.name.split("-")[1]) for p in checkpoints.glob("iter-*/state.json"))
    started = time.monotonic()
    outcome = _finished(_slurm_job(checkout, job_id, log), checkout, log)  # the same job id, nodes and variables
    assert outcome["resumed_from"] == kept > 0
    diff = _diff(reference, checkout / "runs" / "one" / "stages" / STAGE)
    took = time.monotonic() - started
    print(f"\nkilled after checkpoint iter-{kept}; the requeued job: {took:.0f} s, largest difference {diff:.1e}")
    assert diff <= RESUME_ATOL
