"""A stage on two machines through the pool: machine 0's train task (on one "machine"'s worker) starts its process
at a rendezvous on its address and submits machine 1 as a flow run, which another machine's worker takes (gloo
between separate checkouts that share only the servers and the store). The stage matches the same two processes on
one machine; the machine 1 that is killed mid-stage is replaced by a third machine's worker when the train task
retries the stage, which resumes from its last checkpoint and still matches."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tasks.process_group import stop_group
from tests.cluster.pool import deploy_to_pool, kill_machine, logged_steps, machine, wait_for, worker
from tests.cluster.servers import team_services
from tests.parallel.test_distributed import RESUME_ATOL
from tests.tiny_world import write_tiny_world

pytestmark = pytest.mark.slow

STAGE, ITERATIONS, EVERY = "s1-pick", 60, 10  # a launched iteration of the tiny model takes a fraction of a second
LORA = "pytorch_lora_weights.safetensors"
ACCELERATE = {  # what launch.machines > 1 asks for; the workers' VGRPO_HOST gives the rendezvous instead
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "MULTI_GPU",
    "num_machines": 2,
    "machine_rank": 0,
    "num_processes": 2,
    "main_process_ip": "127.0.0.1",
    "main_process_port": 29500,
    "rdzv_backend": "static",
    "same_network": True,
    "mixed_precision": "no",
    "use_cpu": False,
    "gpu_ids": "all",
}
TWO_MACHINES = {"processes": 2, "machines": 2, "accelerate_config": "two_machines.yaml"}


def _checkout(root: Path, world: Path) -> Path:
    checkout = machine(root, world)
    (checkout / "two_machines.yaml").write_text(yaml.safe_dump(ACCELERATE))
    return checkout


def _max_diff(a: Path, b: Path) -> float:
    one, two = load_file(a / LORA), load_file(b / LORA)
    assert set(one) == set(two)
    return max((one[k] - two[k]).abs().max().item() for k in one)


def test_a_stage_spans_two_machines_of_the_pool_and_survives_losing_one(tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    from tasks.stage import train
    from vgrpo.config import load_curriculum

    world = write_tiny_world(tmp_path / "world", n_test=4)
    names = ("a", "b", "c")
    checkouts = {n: _checkout(tmp_path / n, world) for n in names}
    store = tmp_path / "store"
    logs = [tmp_path / f"worker-{n}.log" for n in names]

    # The reference: the same two processes on one machine, without the pool.
    reference = _checkout(tmp_path / "one", world)
    one_machine = {"iterations": ITERATIONS, "checkpoint_every": EVERY, "launch": {"processes": 2}}
    ((cfg,),) = [load_curriculum(reference / "one.yaml", one_machine, root=str(reference))[1]]
    alone = train(cfg, None, str(reference / "runs" / "one"), str(reference), None, log=lambda line: None)

    overrides = {"iterations": ITERATIONS, "checkpoint_every": EVERY, "launch": TWO_MACHINES}
    with team_services(store) as team:
        env = team.client_env(VGRPO_HOST="127.0.0.1")
        env.update(PREFECT_RUNNER_POLL_FREQUENCY="2", PREFECT_WORKER_QUERY_SECONDS="2")
        deploy_to_pool(env)
        workers = {n: worker(f"machine-{n}", c, "gpu", env, tmp_path / f"worker-{n}.log") for n, c in checkouts.items()}
        logs += team.logs
        try:
            with temporary_settings(team.prefect_settings()):
                params = {"curriculum": "one.yaml", "run_root": "runs", "overrides": overrides}
                run = run_deployment("vgrpo/embedded-curriculum", parameters=params, timeout=0)
                launch = {n: c / "runs" / "one" / "work" / STAGE / "launch" for n, c in checkouts.items()}
                started = [launch[n] / "spec.json" for n in names]
                main = wait_for(
                    "machine 0", lambda: [p.parents[5].name for p in started if p.is_file()], 300, logs, poll=0.2
                )
                logs += [launch[n] / "rank-1.log" for n in names]

                def machine_one() -> list[str]:
                    return [n for n in names if (launch[n] / "machine-1" / "spec.json").is_file()]

                (first,) = wait_for("machine 1", machine_one, 300, logs, poll=0.2)
                uploaded = store / "runs" / "one" / "work" / STAGE / "checkpoints"
                wait_for(
                    "a checkpoint in the store", lambda: list(uploaded.glob("iter-*/.complete")), 300, logs, poll=0.2
                )
                kill_machine(workers[first])
                last_uploaded = max(int(p.parent.name.split("-")[1]) for p in uploaded.glob("iter-*/.complete"))
                (second,) = wait_for(
                    "machine 1 again", lambda: [n for n in machine_one() if n != first], 300, logs, poll=0.2
                )
                with get_client(sync_client=True) as client:
                    final = wait_for(
                        "the run to finish",
                        lambda: (r := client.read_flow_run(run.id)).state is not None and r.state.is_final() and r,
                        600,
                        logs,
                    )
                    task_runs = client.read_task_runs()
        finally:
            for w in workers.values():
                if w.poll() is None:
                    stop_group(w)
        assert final.state.is_completed(), final.state
        (train_run,) = [t for t in task_runs if t.name == f"{STAGE}/train"]
        assert train_run.run_count == 2  # the stage retried once, after losing machine 1
        steps = logged_steps(team.env, "one", STAGE)
    lost = len(steps) - len(set(steps))
    assert len(set(steps)) == ITERATIONS and 0 <= lost <= EVERY, (steps, last_uploaded)
    assert all(steps.count(s) == 1 for s in range(last_uploaded)), steps
    out = checkouts[main[0]] / "runs" / "one" / "stages" / STAGE
    diff = _max_diff(Path(alone.out_dir), out)
    print(
        f"\nmachine 0 on {main[0]}, machine 1 on {first} (killed after checkpoint iter-{last_uploaded}), then on "
        f"{second}; iterations trained twice: {lost}; largest difference from the one-machine run: {diff:.2e}"
    )
    assert diff <= RESUME_ATOL
    assert max(v.abs().max().item() for k, v in load_file(out / LORA).items() if "lora_B" in k) > 10 * RESUME_ATOL
