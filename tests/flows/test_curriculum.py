"""The `vgrpo` flow on a tiny two-stage curriculum through Prefect's test server: each phase a task run, stages
chained through their adapters and served from the cache (an evaluation setting changed re-evaluates without
training; a missing output retrains), one MLflow run per stage with its model registered, a resumed stage in its
same run, and an ablation sweep (the curriculum once per ablation file, nested under one sweep run)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from tests.tiny_world import TINY_MODEL_PARAMS, WORLD_PICK, write_tiny_world


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_tiny_world(tmp_path_factory.mktemp("project"), n_test=6)
    pick = {"name": "pickscore", "options": {"path": str(WORLD_PICK)}}
    stages = {
        "a.yaml": {
            "name": "s1-pick",
            "prompts": "train.jsonl",
            "iterations": 2,
            "rewards": [pick],
            "algorithm": {"name": "vgrpo", "n_mc": 2},
        },
        "b.yaml": {
            "name": "s2-geneval",
            "prompts": "train.jsonl",
            "iterations": 1,
            "rewards": [{"name": "geneval"}],
            "prompt_tags": ["counting", "colors"],
            "algorithm": {"name": "vgrpo", "n_mc": 2, "kl_coef": 0.3},
        },
    }
    (root / "base.yaml").write_text("seed: 0\n")
    (root / "model.yaml").write_text(yaml.safe_dump(TINY_MODEL_PARAMS))
    for name, data in stages.items():
        (root / name).write_text(yaml.safe_dump(data))
    curriculum = {"name": "tiny", "base": ["base.yaml"], "model": "model.yaml", "stages": ["a.yaml", "b.yaml"]}
    (root / "curriculum.yaml").write_text(yaml.safe_dump({"curriculum": curriculum}))
    return root


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    storage = tmp_path_factory.mktemp("prefect-results")  # cached results of this module only
    with prefect_test_harness(server_startup_timeout=90), temporary_settings({PREFECT_LOCAL_STORAGE_PATH: storage}):
        yield


def _task_runs(flow_run_id: Any) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(r.name for r in runs if r.state_name != "Cached")


def _run(project: Path, **params: Any) -> tuple[dict[str, Any], list[str]]:
    """The flow's result and the names of the task runs it ran (not served from the cache), read back from the
    Prefect API."""
    from flows.curriculum import curriculum_flow

    state = curriculum_flow(
        curriculum="curriculum.yaml", root=str(project), run_root="runs", return_state=True, **params
    )
    return state.result(), _task_runs(state.state_details.flow_run_id)


def test_curriculum_flow_runs_each_phase_as_a_task_caches_stages_and_tracks_them(
    project: Path, harness: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    import mlflow.diffusers
    import mlflow.pyfunc
    from mlflow import MlflowClient
    from PIL import Image
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tasks.tracking import tracking_uri

    uri = tracking_uri(project / "mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("VGRPO_SYSTEM_METRICS_INTERVAL_S", "0.5")
    out, tasks = _run(project)
    first, second = out["stages"]
    assert [s["name"] for s in out["stages"]] == ["s1-pick", "s2-geneval"]
    assert (Path(first["out_dir"]) / "pytorch_lora_weights.safetensors").is_file()
    assert "eval/geneval_geneval_strict" in second["final_eval"]
    # Every phase of every iteration is a task run of the flow, named after its stage and iteration.
    for name in (
        "s1-pick/prepare-prompts",
        "s1-pick/setup-policy",
        "s1-pick/rollout-0000",
        "s1-pick/score-0001",
        "s1-pick/update-0001",
        "s1-pick/checkpoint-0002",
        "s1-pick/export",
        "s1-pick/evaluate",
        "s2-geneval/rollout-0000",
        "s2-geneval/evaluate",
    ):
        assert name in tasks, (name, tasks)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["tiny-stages"])))
    table = json.loads(artifacts[0].data) if isinstance(artifacts[0].data, str) else artifacts[0].data
    assert [row["stage"] for row in table] == ["s1-pick", "s2-geneval"]
    assert (project / "runs/tiny/results.md").read_text().startswith("stage")
    # The wall time by part (flows.time_split): the parts sum to the flow's total, training is the iterations'.
    split = json.loads((project / "runs/tiny/time_split.json").read_text())
    parts = split["split"]
    assert sum(parts[p] for p in ("training", "evaluation", "loading", "orchestration")) == pytest.approx(
        parts["total"]
    )
    assert 0 < parts["training"] < parts["total"] and parts["evaluation"] > 0 and parts["orchestration"] > 0
    assert sorted(split["stages"]) == ["s1-pick", "s2-geneval"]
    assert first["timings"]["iterations_s"] == pytest.approx(split["stages"]["s1-pick"]["training"])
    # Where the run stands, for the terminal's watcher (flows.watch): done, and each stage's last iteration.
    assert json.loads((project / "runs/tiny/progress.json").read_text())["phase"] == "done"
    assert json.loads((project / "runs/tiny/work/s1-pick/progress.json").read_text())["done"] == 2

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == ["s1-pick", "s2-geneval"]
    assert parent.data.params["curriculum"] == "tiny" and "final/eval/geneval_geneval_strict" in parent.data.metrics
    pick_run = next(r for r in children if r.data.tags["vgrpo.training.stage"] == "s1-pick")
    assert [m.step for m in client.get_metric_history(pick_run.info.run_id, "reward/pickscore_raw_mean")] == [0, 1]
    assert any(k.startswith("system/") for k in pick_run.data.metrics)
    artifacts_logged = [a.path for a in client.list_artifacts(pick_run.info.run_id, "eval")]
    assert any(p.endswith(".png") for p in artifacts_logged) and any(p.endswith(".json") for p in artifacts_logged)
    versions = client.search_model_versions("name='tiny'")
    assert sorted(v.run_id for v in versions) == sorted(r.info.run_id for r in children)
    loaded = mlflow.diffusers.load_model(first["model_uri"])
    assert (Path(loaded.adapter_path) / "pytorch_lora_weights.safetensors").read_bytes() == (
        Path(first["out_dir"]) / "pytorch_lora_weights.safetensors"
    ).read_bytes()
    pipe = loaded.load_pipeline(device="cpu")  # a bare from_pretrained, though the base has no T5
    assert type(pipe).__name__ == "StableDiffusion3Pipeline"
    side = pipe.default_sample_size * pipe.vae_scale_factor
    for stage in ("s1-pick", "s2-geneval"):  # every registered model, by its stage's alias
        assert client.get_model_version_by_alias("tiny", stage).tags["vgrpo.training.stage"] == stage
        pngs = mlflow.pyfunc.load_model(f"models:/tiny@{stage}").predict(["a red circle"])
        assert len(pngs) == 1 and Image.open(io.BytesIO(pngs[0])).size == (side, side)

    # Run again: every stage and its evaluation come from the cache.
    again, tasks = _run(project)
    assert [s["hash"] for s in again["stages"]] == [s["hash"] for s in out["stages"]]
    assert not [t for t in tasks if "/rollout-" in t or "/update-" in t or t.endswith("/evaluate")], tasks
    cached = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("vgrpo.cached") == "true"]
    assert sorted(r.data.tags["vgrpo.trained_in_run"] for r in cached) == sorted(r.info.run_id for r in children)

    # A changed evaluation setting re-evaluates both stages and trains nothing.
    changed, tasks = _run(project, overrides={"evaluation": {"num_steps": 3}})
    assert [s["hash"] for s in changed["stages"]] == [s["hash"] for s in out["stages"]]
    assert not [t for t in tasks if "/rollout-" in t or "/update-" in t], tasks
    assert "s1-pick/evaluate" in tasks and "s2-geneval/evaluate" in tasks

    # A stage whose output is gone is trained again (resumed from its last checkpoint: no iteration re-run).
    shutil.rmtree(first["out_dir"])
    restored, tasks = _run(project)
    assert restored["stages"][0]["hash"] == first["hash"] and "s1-pick/export" in tasks
    assert not [t for t in tasks if "/rollout-" in t], tasks


def test_a_resumed_stage_continues_its_mlflow_run(project: Path, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tasks.stage import train
    from tasks.tracking import Tracking, tracking_uri
    from vgrpo.config import load_curriculum

    _, stages = load_curriculum(
        project / "curriculum.yaml", {"iterations": 3, "checkpoint_every": 1}, root=str(project)
    )
    stage = stages[0]
    uri = tracking_uri(tmp_path / "mlflow")
    tracking = Tracking(uri, "resume", "s1-pick")

    def die_at_update_2(phase: str, iteration: int | None, fn: Any, *args: Any) -> Any:
        if (phase, iteration) == ("update", 2):
            raise KeyboardInterrupt  # as a kill between two checkpoints
        return fn(*args)

    with pytest.raises(KeyboardInterrupt):
        train(stage, None, str(tmp_path / "run"), str(project), tracking, die_at_update_2)
    trained = train(stage, None, str(tmp_path / "run"), str(project), tracking)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert [r.info.run_id for r in runs] == [trained.run_id] and trained.resumed_from == 2
    assert runs[0].info.status == "FINISHED" and runs[0].data.tags["vgrpo.continued"] == "true"
    assert [m.step for m in client.get_metric_history(trained.run_id, "reward/total_mean")] == [0, 1, 2]


def test_ablation_sweep_runs_the_curriculum_once_per_file_nested_under_one_sweep_run(
    project: Path, harness: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from flows.sweep import ablation_sweep
    from tasks.tracking import tracking_uri
    from vgrpo.errors import ConfigError

    (project / "one.yaml").write_text(
        yaml.safe_dump(
            {"curriculum": {"name": "one", "base": ["base.yaml"], "model": "model.yaml", "stages": ["a.yaml"]}}
        )
    )
    (project / "ablations").mkdir(exist_ok=True)
    (project / "ablations/no_shared_pairs.yaml").write_text("algorithm: {share: none}\n")
    (project / "ablations/v_prediction.yaml").write_text("algorithm: {prediction: v}\n")
    (project / "ablations/typo.yaml").write_text("algorithm: {sharing: none}\n")
    uri = tracking_uri(project / "mlflow-sweep")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ConfigError, match="sharing"):  # every ablation is validated before the first stage
        ablation_sweep(
            curriculum="one.yaml",
            root=str(project),
            run_root="runs",
            ablations=["ablations/no_shared_pairs.yaml", "ablations/typo.yaml"],
        )
    ablations = ["ablations/no_shared_pairs.yaml", "ablations/v_prediction.yaml"]
    out = ablation_sweep(
        curriculum="one.yaml", root=str(project), run_root="runs", ablations=ablations, overrides={"iterations": 1}
    )
    assert set(out["ablations"]) == {"no_shared_pairs", "v_prediction"}
    adapters = {name: Path(stages[0]["out_dir"]) for name, stages in out["ablations"].items()}
    assert adapters["v_prediction"] == project / "runs/one/ablations/v_prediction/stages/s1-pick"
    assert out["ablations"]["no_shared_pairs"][0]["hash"] != out["ablations"]["v_prediction"][0]["hash"]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("one").experiment_id])
    by_id = {r.info.run_id: r for r in runs}
    sweeps = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(sweeps) == 1  # the sweep that failed validation stopped before starting a run
    variants = [r for r in runs if "vgrpo.ablation" in r.data.tags and "vgrpo.training.stage" not in r.data.tags]
    assert sorted(r.data.tags["vgrpo.ablation"] for r in variants) == ["no_shared_pairs", "v_prediction"]
    assert len({r.data.tags["mlflow.parentRunId"] for r in variants}) == 1
    stages = [r for r in runs if "vgrpo.training.stage" in r.data.tags]
    assert {by_id[r.data.tags["mlflow.parentRunId"]].data.tags["vgrpo.ablation"] for r in stages} == {
        "no_shared_pairs",
        "v_prediction",
    }
    assert sorted(r.info.run_name for r in stages) == ["no_shared_pairs/s1-pick", "v_prediction/s1-pick"]
    params = {r.data.tags["vgrpo.ablation"]: r for r in variants}
    assert params["v_prediction"].info.status == "FINISHED"
    assert params["v_prediction"].data.params["ablation.algorithm.prediction"] == "v"  # the runs table compares
    assert "final/eval/geneval_geneval_strict" in params["no_shared_pairs"].data.metrics  # ablations at the top
