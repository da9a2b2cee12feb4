"""A machine that dies mid-stage costs at most the iterations since its last checkpoint: its flow run goes silent,
the pool's automations (:mod:`flows.recovery`) mark it crashed and schedule it again, the other machine's worker
takes it, restores the checkpoints the dead machine uploaded to the store and finishes the stage, with the
weights of a run that was never interrupted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tasks.process_group import stop_group
from tests.cluster.pool import deploy_to_pool, kill_machine, logged_steps, machine, wait_for, worker
from tests.cluster.servers import team_services
from tests.tiny_world import write_tiny_world

pytestmark = pytest.mark.slow

ITERATIONS, EVERY = 30, 3
STAGE = "s1-pick"
SILENCE_S = 40  # above the heartbeat's minimum period (30 s)


def test_a_machine_killed_mid_stage_costs_at_most_the_iterations_since_its_last_checkpoint(tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    from tasks.stage import train
    from tasks.stage_layout import dir_hash
    from vgrpo.config import load_curriculum

    world = write_tiny_world(tmp_path / "world", n_test=4)
    checkouts = {"a": machine(tmp_path / "a", world), "b": machine(tmp_path / "b", world)}
    store = tmp_path / "store"
    overrides = {"iterations": ITERATIONS, "checkpoint_every": EVERY}
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    with team_services(store) as team:
        env = team.client_env(PREFECT_RUNNER_POLL_FREQUENCY="2")
        env.update(PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_FLOWS_HEARTBEAT_FREQUENCY="30")
        deploy_to_pool(env, "--silence", str(SILENCE_S))
        workers = {n: worker(f"machine-{n}", c, "gpu", env, tmp_path / f"worker-{n}.log") for n, c in checkouts.items()}
        logs += team.logs
        try:
            with temporary_settings(team.prefect_settings()):
                params = {"curriculum": "one.yaml", "run_root": "runs", "overrides": overrides}
                run = run_deployment("vgrpo/embedded-curriculum", parameters=params, timeout=0)
                work = {n: c / "runs" / "one" / "work" / STAGE for n, c in checkouts.items()}
                started = wait_for("a machine to start", lambda: [n for n in work if work[n].is_dir()], 300, logs)
                (dead,) = started
                uploaded = store / "runs" / "one" / "work" / STAGE / "checkpoints"
                wait_for(
                    "a checkpoint in the store", lambda: list(uploaded.glob("iter-*/.complete")), 300, logs, poll=0.2
                )
                time.sleep(0.5)  # an iteration or so past it, which the kill loses
                kill_machine(workers[dead])
                killed_at = time.monotonic()
                last_uploaded = max(int(p.parent.name.split("-")[1]) for p in uploaded.glob("iter-*/.complete"))
                assert last_uploaded < ITERATIONS, "the kill came after the stage's last checkpoint: nothing to lose"
                with get_client(sync_client=True) as client:
                    # Crashed is a final state too, but only until the retry automation schedules the run again
                    final = wait_for(
                        "the run to crash, be scheduled again and finish on the other machine",
                        lambda: (
                            (r := client.read_flow_run(run.id)).state is not None
                            and r.state.is_final()
                            and not r.state.is_crashed()
                            and r
                        ),
                        600,
                        logs,
                    )
                    states = [s.name for s in client.read_flow_run_states(run.id)]
            recovered_after = time.monotonic() - killed_at
        finally:
            for w in workers.values():
                if w.poll() is None:
                    stop_group(w)
        assert final.state.is_completed(), (final.state, states)
        assert "Crashed" in states and "AwaitingRetry" in states and final.run_count == 2, states
        (alive,) = [n for n in checkouts if n != dead]
        assert (checkouts[alive] / "runs" / "one" / "stages" / STAGE).is_dir()
        # What was lost: the iterations the dead machine trained past its last uploaded checkpoint, each logged
        # twice to the stage's one MLflow run (continued by the second machine from the checkpoint's run id).
        steps = logged_steps(team.env, "one", STAGE)
        lost = len(steps) - len(set(steps))
    print(
        f"\nkilled machine {dead} after checkpoint iter-{last_uploaded}; the run finished on {alive} "
        f"{recovered_after:.0f} s later; iterations trained twice: {lost} (checkpoint_every={EVERY}); "
        f"states: {states}"
    )
    assert len(set(steps)) == ITERATIONS and 0 <= lost <= EVERY, (steps, last_uploaded)
    # Only what came after the last uploaded checkpoint ran twice (iterations count from 0; iter-k holds k of them).
    assert all(steps.count(s) == 1 for s in range(last_uploaded)), steps
    # The weights are those of the same stage trained without a break, on one machine.
    reference = machine(tmp_path / "c", world)
    ((cfg,),) = [load_curriculum(reference / "one.yaml", overrides, root=str(reference))[1]]
    alone = train(cfg, None, str(reference / "runs" / "one"), str(reference), None)
    assert dir_hash(Path(alone.out_dir)) == dir_hash(checkouts[alive] / "runs" / "one" / "stages" / STAGE)
