"""Launched stages end to end: the tiny two-stage curriculum of tests/flows/test_curriculum.py through the curriculum
flow with ``launch.processes: 2`` (two gloo processes per stage under ``accelerate launch``) ends with the adapters
of the single-process flow within tests/parallel/test_distributed.py's tolerance, with exactly one MLflow run per stage
(none opened by rank 1) and the train task's log holding rank 0's output; DVC's stage command launches the same
way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.flows.test_curriculum import _task_runs, harness, project  # noqa: F401 (fixtures)
from tests.parallel.test_distributed import PARAM_ATOL

pytestmark = pytest.mark.slow

LORA = "pytorch_lora_weights.safetensors"
TWO = {"launch": {"processes": 2}}


def _flow(root: Path, run_root: str, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    from flows.curriculum import curriculum_flow

    state = curriculum_flow(
        curriculum="curriculum.yaml", root=str(root), run_root=run_root, overrides=overrides, return_state=True
    )
    return state.result(), state.state_details.flow_run_id


def _train_task_logs(flow_run_id: Any, name: str) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        (train,) = [r for r in runs if r.name == name]
        logs = client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[train.id])))
    return [log.message for log in logs]


def _stage_runs(uri: str, experiment: str, parent: str | None = None) -> list[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return [
        r for r in runs if "vgrpo.training.stage" in r.data.tags and r.data.tags.get("mlflow.parentRunId") == parent
    ]


def _assert_close_adapters(a: Path, b: Path) -> float:
    """Assert that two adapters agree within the tolerance; returns the largest LoRA B entry (0 before training)."""
    one, two = load_file(a / LORA), load_file(b / LORA)
    assert set(one) == set(two)
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=PARAM_ATOL)
    return max(v.abs().max().item() for k, v in one.items() if "lora_B" in k)


def test_the_flow_launches_each_stage_on_two_processes_and_matches_one_process(
    project: Path,  # noqa: F811
    harness: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tasks.tracking import tracking_uri

    uri = tracking_uri(project / "mlflow-launch")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    one, _ = _flow(project, "runs-one")
    two, flow_run_id = _flow(project, "runs-two", TWO)
    assert [s["name"] for s in two["stages"]] == ["s1-pick", "s2-geneval"]
    for a, b in zip(one["stages"], two["stages"], strict=True):
        assert _assert_close_adapters(Path(a["out_dir"]), Path(b["out_dir"])) > 10 * PARAM_ATOL  # a real update
        assert len(b["history"]) == len(a["history"]) and b["resumed_from"] == 0
        assert set(b["final_eval"]) == set(a["final_eval"])  # evaluated in the flow's process, as one process's
        assert (Path(b["out_dir"]).parents[1] / "work" / b["name"] / "launch" / "rank-1.log").is_file()

    # Exactly one MLflow run per stage, rank 0's, under the curriculum's run; it holds every iteration.
    runs = _stage_runs(uri, "tiny", two["run_id"])
    assert sorted(r.info.run_name for r in runs) == ["s1-pick", "s2-geneval"]
    assert sorted(r.info.run_id for r in runs) == sorted(s["run_id"] for s in two["stages"])
    from mlflow import MlflowClient

    pick = next(r for r in runs if r.info.run_name == "s1-pick")
    steps = [m.step for m in MlflowClient(uri).get_metric_history(pick.info.run_id, "reward/total_mean")]
    assert steps == [0, 1] and pick.info.status == "FINISHED"

    # The UI: one train task per stage (no per-phase task runs), whose log is the launcher's and rank 0's output.
    tasks = _task_runs(flow_run_id)
    assert "s1-pick/train" in tasks and "s1-pick/evaluate" in tasks
    assert not [t for t in tasks if "/rollout-" in t or "/update-" in t], tasks
    logs = _train_task_logs(flow_run_id, "s1-pick/train")
    assert any(m.startswith("s1-pick: launching 2 processes") for m in logs)
    assert any("s1-pick" in m and "| iteration 2/2 |" in m for m in logs), logs[-10:]  # rank 0's progress line


def test_dvc_stage_command_launches_the_stage_it_is_asked_to(
    project: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tasks.dvc_stage import main
    from tasks.tracking import tracking_uri

    uri = tracking_uri(tmp_path / "mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(project)  # the curriculum's paths are relative to the project
    metrics = tmp_path / "1.json"
    args = [
        "--curriculum",
        "curriculum.yaml",
        "--stage",
        "1",
        "--run-root",
        str(tmp_path / "dvc"),
        "--metrics",
        str(metrics),
        "--set",
        "launch.processes=2",
        "iterations=1",
    ]
    assert main(args) == 0
    assert json.loads(metrics.read_text())["iterations"] == 1
    (run,) = _stage_runs(uri, "tiny")
    assert run.data.tags["vgrpo.dvc_stage"] == "stage@1" and run.info.status == "FINISHED"
    assert "eval/geneval_geneval_strict" in run.data.metrics  # the final evaluation, in this process
