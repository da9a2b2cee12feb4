"""The `vgrpo` flow on a tiny two-stage curriculum through Prefect's test server: stages chained through
their adapters, one MLflow run per stage nested under the curriculum's, a re-run served from the cache, and an
ablation sweep (the curriculum once per ablation file, nested under one sweep run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from .tiny_world import WORLD_PICK, write_tiny_world


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_tiny_world(tmp_path_factory.mktemp("project"), n_test=6)
    model = {
        "pipeline": "base", "eval_prompts": "test.jsonl",
        "rollout": {"prompts_per_iteration": 2, "group_size": 4, "num_steps": 4, "shift": None},
        "lora": {"rank": 4, "alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]},
        "evaluation": {"group_size": 1, "num_steps": 2, "rewards": [{"name": "geneval"}]},
    }  # fmt: skip
    pick = {"name": "pickscore", "options": {"path": str(WORLD_PICK)}}
    stages = {
        "a.yaml": {"name": "s1-pick", "prompts": "train.jsonl", "iterations": 2, "rewards": [pick],
                   "algorithm": {"name": "vgrpo", "n_mc": 2}},
        "b.yaml": {"name": "s2-geneval", "prompts": "train.jsonl", "iterations": 1, "rewards": [{"name": "geneval"}],
                   "prompt_tags": ["counting", "colors"], "algorithm": {"name": "vgrpo", "n_mc": 2, "kl_coef": 0.3}},
    }  # fmt: skip
    (root / "base.yaml").write_text("seed: 0\n")
    (root / "model.yaml").write_text(yaml.safe_dump(model))
    for name, data in stages.items():
        (root / name).write_text(yaml.safe_dump(data))
    curriculum = {"name": "tiny", "base": ["base.yaml"], "model": "model.yaml", "stages": ["a.yaml", "b.yaml"]}
    (root / "curriculum.yaml").write_text(yaml.safe_dump({"curriculum": curriculum}))
    return root


@pytest.fixture(scope="module")
def harness() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def test_curriculum_flow_chains_stages_logs_to_mlflow_and_caches(
    project: Path, harness: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from flows.curriculum import vgrpo
    from tasks.tracking import tracking_uri

    uri = tracking_uri(project / "mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = vgrpo(curriculum="curriculum.yaml", root=str(project), run_root="runs")
    again = vgrpo(curriculum="curriculum.yaml", root=str(project), run_root="runs")
    first, second = out["stages"]
    assert [s["name"] for s in out["stages"]] == ["s1-pick", "s2-geneval"]
    assert (Path(first["out_dir"]) / "pytorch_lora_weights.safetensors").is_file()
    assert "eval/geneval_geneval_strict" in second["final_eval"]
    assert again["stages"] == out["stages"]  # served from the task cache: same hashes, same runs
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    first_parent = min(parents, key=lambda r: r.info.start_time)  # the re-run's stages came from the cache
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first_parent.info.run_id]
    assert len(parents) == 2 and len(runs) == 4
    assert {r.data.tags["vgrpo.stage"] for r in children} == {"s1-pick", "s2-geneval"}
    pick_run = next(r for r in children if r.data.tags["vgrpo.stage"] == "s1-pick")
    history = client.get_metric_history(pick_run.info.run_id, "reward/pickscore_raw_mean")
    assert [m.step for m in history] == [0, 1]
    assert "prefect.flow_run_id" in first_parent.data.tags
    artifacts = [a.path for a in client.list_artifacts(pick_run.info.run_id, "eval")]
    assert any(p.endswith(".png") for p in artifacts) and any(p.endswith(".json") for p in artifacts)


def test_ablation_sweep_runs_the_curriculum_once_per_file_nested_under_one_sweep_run(
    project: Path, harness: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from flows.curriculum import vgrpo
    from tasks.tracking import tracking_uri
    from vgrpo.config import ConfigError

    (project / "one.yaml").write_text(yaml.safe_dump({"curriculum": {
        "name": "one", "base": ["base.yaml"], "model": "model.yaml", "stages": ["a.yaml"]}}))  # fmt: skip
    (project / "ablations").mkdir(exist_ok=True)
    (project / "ablations/no_shared_pairs.yaml").write_text("algorithm: {share: none}\n")
    (project / "ablations/v_prediction.yaml").write_text("algorithm: {prediction: v}\n")
    (project / "ablations/typo.yaml").write_text("algorithm: {sharing: none}\n")
    uri = tracking_uri(project / "mlflow-sweep")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ConfigError, match="sharing"):  # every ablation is validated before the first stage
        vgrpo(curriculum="one.yaml", root=str(project), run_root="runs",
              ablations=["ablations/no_shared_pairs.yaml", "ablations/typo.yaml"])  # fmt: skip
    ablations = ["ablations/no_shared_pairs.yaml", "ablations/v_prediction.yaml"]
    out = vgrpo(curriculum="one.yaml", root=str(project), run_root="runs", ablations=ablations,
                overrides={"iterations": 1})  # fmt: skip
    assert set(out["ablations"]) == {"no_shared_pairs", "v_prediction"}
    adapters = {name: Path(stages[0]["out_dir"]) for name, stages in out["ablations"].items()}
    assert adapters["v_prediction"] == project / "runs/one/ablations/v_prediction/stages/s1-pick"
    assert out["ablations"]["no_shared_pairs"][0]["hash"] != out["ablations"]["v_prediction"][0]["hash"]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("one").experiment_id])
    by_id = {r.info.run_id: r for r in runs}
    sweeps = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(sweeps) == 1  # the sweep that failed validation stopped before starting a run
    variants = [r for r in runs if "vgrpo.ablation" in r.data.tags]
    assert sorted(r.data.tags["vgrpo.ablation"] for r in variants) == ["no_shared_pairs", "v_prediction"]
    assert len({r.data.tags["mlflow.parentRunId"] for r in variants}) == 1
    stages = [r for r in runs if "vgrpo.stage" in r.data.tags]
    assert {by_id[r.data.tags["mlflow.parentRunId"]].data.tags["vgrpo.ablation"] for r in stages} == {
        "no_shared_pairs", "v_prediction"}  # fmt: skip
    params = {r.data.tags["vgrpo.ablation"]: r for r in variants}
    assert params["v_prediction"].info.status == "FINISHED"
