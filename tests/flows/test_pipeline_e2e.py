"""End to end, as a user drives it: a copy of this project with tiny params runs a two-stage curriculum with
`dvc repro` and through a real Prefect server and the `vgrpo` deployment, both logging to an MLflow sqlite store.

The Prefect run is killed (SIGKILL to the serving process group) in the middle of stage 2 and run again: stage 1
comes from the task cache, stage 2 resumes from its last checkpoint, in its same MLflow run, and ends with the
same adapter (bit for bit) and the same final evaluation as DVC's uninterrupted run of the same params; the
Prefect API holds each step as a task run and the stage table artifact.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
import yaml

pytest.importorskip("prefect")
pytest.importorskip("mlflow")
pytest.importorskip("dvc")

from services.local import local_services
from tasks.process_group import process_group_members
from tasks.stage import dir_hash

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = {  # params/models/embedded.yaml, shrunk so that a stage takes seconds
    "pipeline": "models/embedded-base",
    "rollout": {"prompts_per_iteration": 2, "group_size": 4, "num_steps": 10, "shift": None},  # N_MC 10 <= steps
    "lora": {"rank": 4, "alpha": 8},
    "eval_prompts": "data/world/test.jsonl",
    "evaluation": {
        "group_size": 2,
        "num_steps": 4,
        "seed": 0,
        "max_prompts": 4,
        "rewards": [
            {"name": "geneval"},
            {"name": "pickscore", "key": "world_pickscore", "options": {"path": "models/world-pickscore"}},
        ],
    },
}
STAGE_LENGTHS = (2, 4)  # the shipped curriculum's first two stages, shortened


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    tail = f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert out.returncode == 0, f"{' '.join(cmd)} failed ({out.returncode}):\n{tail}"
    return out.stdout


def _copy_project(dst: Path) -> None:
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("project")
    _copy_project(root)
    (root / "params/models/embedded.yaml").write_text(yaml.safe_dump(TINY_MODEL))
    curriculum = yaml.safe_load((root / "params/curricula/embedded.yaml").read_text())["curriculum"]
    for rel, iterations in zip(curriculum["stages"], STAGE_LENGTHS, strict=False):
        stage = yaml.safe_load((root / rel).read_text())
        (root / rel).write_text(yaml.safe_dump({**stage, "iterations": iterations, "checkpoint_every": 1}))
    tiny = {**curriculum, "name": "tiny-curriculum", "stages": curriculum["stages"][:2]}
    (root / "params/curricula/tiny.yaml").write_text(yaml.safe_dump({"curriculum": tiny}))
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "tiny project"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)
    with local_services(tmp_path_factory.mktemp("services")) as services:  # MLflow: services' sqlite store
        env = {**os.environ, **services.env, "PREFECT_HOME": str(root / ".prefect-client")}
        env["PYTHONPATH"] = str(root)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # DVC runs `python ...`
        yield root, env


def _serve(root: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(root / "serve.log", "ab")  # noqa: SIM115 -- the child writes it until killed
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.deploy"], cwd=root, env=env, stdout=log, stderr=log, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        check = subprocess.run(
            [sys.executable, "-m", "prefect", "deployment", "inspect", "vgrpo/embedded-curriculum"],
            cwd=root,
            env=env,
            capture_output=True,
        )
        if check.returncode == 0:
            return proc
        assert proc.poll() is None, (root / "serve.log").read_text()[-3000:]
        time.sleep(2)
    raise TimeoutError("the serve process did not register the deployments")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while process_group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process_group_members(proc.pid) == []


def test_dvc_and_prefect_runs_agree_after_a_kill_and_resume(project: tuple[Path, dict[str, str]]) -> None:
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root, env = project
    dvc = [sys.executable, "-m", "dvc"]

    # 1. DVC: stage@2 pulls in the world's prompt files and stage@1; the metrics table has both stages.
    _run([*dvc, "repro", "stage@2"], root, env)
    shown = json.loads(_run([*dvc, "metrics", "show", "--json"], root, env))
    files = next(iter(shown.values()))["data"]
    assert files["metrics/stages/s1-preference.json"]["data"]["iterations"] == 2
    assert files["metrics/stages/s2-geneval.json"]["data"].keys() == {
        "iterations",
        "wall_s",
        "strict",
        "partial",
        "pickscore",
    }
    s2 = json.loads((root / "metrics/stages/s2-geneval.eval.json").read_text())  # the whole final evaluation
    assert s2["iterations"] == 4 and s2["resumed_from"] == 0 and "eval/geneval_geneval_strict" in s2
    assert json.loads((root / "plots/stages/s2-geneval.json").read_text())[3]["iteration"] == 3.0
    assert "stage@2" not in _run([*dvc, "status", "stage@2"], root, env)  # reproduced: nothing left to do
    # The adapters go to a remote (here a temporary one, not the project's default) and come back in a git clone.
    remote, clone = root.parent / "dvc-remote", root.parent / "clone"
    _run([*dvc, "remote", "add", "--local", "-d", "e2e", str(remote)], root, env)
    _run([*dvc, "push", "stage@1", "stage@2"], root, env)
    _run(["git", "add", "dvc.lock"], root, env)
    _run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost", "commit", "-qm", "stage@2"], root, env)
    _run(["git", "clone", "-q", str(root), str(clone)], root.parent, env)
    _run([*dvc, "remote", "add", "--local", "-d", "e2e", str(remote)], clone, env)
    _run([*dvc, "pull", "stage@1", "stage@2"], clone, env)
    for stage in ("s1-preference", "s2-geneval"):
        assert dir_hash(clone / "runs/dvc/stages" / stage) == dir_hash(root / "runs/dvc/stages" / stage), stage

    # 2. Prefect: the deployment runs the same two stages; kill it once stage 2 has a checkpoint, then re-run.
    params = ["-p", "curriculum=params/curricula/tiny.yaml", "-p", "run_root=runs/prefect"]
    run = [sys.executable, "-m", "prefect", "deployment", "run", "vgrpo/embedded-curriculum", *params]
    serve = _serve(root, env)
    try:
        _run(run, root, env)
        checkpoint = root / "runs/prefect/tiny-curriculum/work/s2-geneval/checkpoints/iter-2"
        deadline = time.monotonic() + 300
        while not checkpoint.is_dir() and time.monotonic() < deadline:
            assert serve.poll() is None, (root / "serve.log").read_text()[-3000:]
            time.sleep(0.1)
        assert checkpoint.is_dir(), (root / "serve.log").read_text()[-3000:]
    finally:
        _kill_group(serve)
    assert not (root / "runs/prefect/tiny-curriculum/stages/s2-geneval").exists()  # killed before its end
    serve = _serve(root, env)
    try:
        _run([*run, "--watch", "--watch-timeout", "600"], root, env, timeout=660)
    finally:
        _kill_group(serve)

    # 3. Same adapters and final evaluation as DVC's uninterrupted run.
    for stage in ("s1-preference", "s2-geneval"):
        prefect_out, dvc_out = root / "runs/prefect/tiny-curriculum/stages" / stage, root / "runs/dvc/stages" / stage
        assert dir_hash(prefect_out) == dir_hash(dvc_out), stage
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    tiny = client.get_experiment_by_name("tiny-curriculum")
    runs = client.search_runs([tiny.experiment_id])
    s2_runs = [r for r in runs if r.data.tags.get("vgrpo.training.stage") == "s2-geneval"]
    (resumed,) = s2_runs  # the restarted flow continued the interrupted stage's run
    assert resumed.info.status == "FINISHED" and resumed.data.tags["vgrpo.continued"] == "true"
    assert int(resumed.data.tags["vgrpo.resumed_from"]) >= 2
    final = resumed.data.metrics
    for key in ("eval/geneval_geneval_strict", "eval/geneval_geneval_partial", "eval/world_pickscore"):
        assert final[key] == pytest.approx(s2[key], abs=1e-5), key
    history = client.get_metric_history(resumed.info.run_id, "reward/total_mean")
    assert {m.step for m in history} == {0, 1, 2, 3} and history[-1].step == 3

    # The Prefect API holds every step as a task run of the restarted flow run, and the stage table artifact.
    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}), get_client(sync_client=True) as prefect:
        flow_run_id = resumed.data.tags["prefect.flow_run_id"]
        tasks = {
            t.name
            for t in prefect.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])))
        }
        table = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["tiny-curriculum-stages"]))
        )
    assert {
        "s2-geneval/rollout-0003",
        "s2-geneval/score-0003",
        "s2-geneval/update-0003",
        "s2-geneval/export",
        "s2-geneval/evaluate",
        "s2-geneval/train",
        "s1-preference/train",
    } <= tasks, sorted(tasks)
    assert table, "no stage table artifact"

    # 4. The DVC stages are MLflow runs too, with metrics and evaluation images.
    embedded = client.get_experiment_by_name("embedded-curriculum")
    dvc_runs = client.search_runs([embedded.experiment_id])
    assert {r.data.tags["vgrpo.dvc_stage"] for r in dvc_runs} == {"stage@1", "stage@2"}
    for r in dvc_runs:
        assert "reward/total_mean" in r.data.metrics and "eval/world_pickscore" in r.data.metrics
        images = [a.path for a in client.list_artifacts(r.info.run_id, "eval")]
        assert any(p.endswith(".png") for p in images)
        assert r.data.tags.get("mlflow.source.git.commit")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 2 and all("prefect.flow_run_id" in r.data.tags for r in parents)

    # 5. An experiment with one param changed re-runs stage 2 only, from stage 1's adapter.
    exp = [*dvc, "exp", "run", "stage@2", "--set-param", "params/stages/embedded/2-geneval-kl.yaml:iterations=3"]
    out = _run(exp, root, env)
    assert "'stage@1' didn't change" in out and "Running stage 'stage@2'" in out
    assert json.loads((root / "metrics/stages/s2-geneval.json").read_text())["iterations"] == 3
