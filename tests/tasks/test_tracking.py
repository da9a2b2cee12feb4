"""tasks.tracking: log to a SQLite store through MlflowClient with explicit run ids and read everything back."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient
from PIL import Image

from tasks.tracking import (
    NONFINITE_METRIC,
    PARAM_VALUE_LIMIT,
    TRUNCATION_MARKER,
    artifact_root,
    end_run,
    git_commit,
    log_artifact_dir,
    log_image,
    log_json,
    log_metrics,
    log_params,
    sanitize_key,
    start_run,
    tracked_run,
    tracking_uri,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(scope="module")
def client(store: Path) -> MlflowClient:
    return MlflowClient(tracking_uri(store))  # creating the SQLite schema costs a few seconds: once per module


@pytest.fixture
def run_id(client: MlflowClient) -> Iterator[str]:
    run = start_run(client, "tests", "unit")
    yield run
    end_run(client, run)


def _download(client: MlflowClient, run_id: str, path: str, dst: Path) -> Path:
    return Path(client.download_artifacts(run_id, path, str(dst)))


def test_tracking_uri_relative_root_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert tracking_uri(Path("runs")) == f"sqlite:///{tmp_path.resolve()}/runs/mlflow.db"
    assert tracking_uri(Path("runs")).startswith("sqlite:////")


def test_start_run_new_experiment_artifacts_under_root(client: MlflowClient, store: Path, run_id: str) -> None:
    run = client.get_run(run_id)
    assert run.info.run_name == "unit"
    assert run.info.artifact_uri.startswith(artifact_root(store).as_uri())  # not ./mlruns of the cwd


def test_start_run_parent_nested_tags_and_git_commit(client: MlflowClient) -> None:
    with tracked_run(client, "tests", "parent", tags={"stage": "1"}) as parent:
        child = start_run(client, "tests", "child", parent_run_id=parent)
        end_run(client, child)
    parent_run, child_run = client.get_run(parent), client.get_run(child)
    assert child_run.data.tags["mlflow.parentRunId"] == parent
    assert "mlflow.parentRunId" not in parent_run.data.tags
    assert parent_run.data.tags["stage"] == "1"
    assert parent_run.info.status == "FINISHED"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:
        assert parent_run.data.tags["mlflow.source.git.commit"] == head.stdout.strip()
    runs = client.search_runs([parent_run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    assert [r.info.run_id for r in runs] == [child]


def test_git_commit_outside_repo_none(tmp_path: Path) -> None:
    assert git_commit(tmp_path) is None


def test_start_run_outside_git_no_commit_tag(client: MlflowClient, tmp_path: Path) -> None:
    run = start_run(client, "tests", "nogit", source_dir=tmp_path)
    assert "mlflow.source.git.commit" not in client.get_run(run).data.tags
    end_run(client, run)


def test_tracked_run_exception_failed(client: MlflowClient) -> None:
    with pytest.raises(RuntimeError), tracked_run(client, "tests", "boom") as run:
        raise RuntimeError("boom")
    assert client.get_run(run).info.status == "FAILED"


def test_end_run_bad_status_raises(client: MlflowClient, run_id: str) -> None:
    with pytest.raises(ValueError, match="FINISHED"):
        end_run(client, run_id, "DONE")


def test_log_params_long_value_truncated_full_json(client: MlflowClient, run_id: str, tmp_path: Path) -> None:
    long = "x" * 800
    params = {"optim": {"lr": 1e-4, "betas": [0.9, 0.999]}, "prompt": long, "name": "vgrpo", "flag": True}
    truncated = log_params(client, run_id, params)
    assert truncated == ["prompt"]
    logged = client.get_run(run_id).data.params
    assert logged["optim.lr"] == "0.0001" and logged["optim.betas"] == "[0.9, 0.999]"
    assert logged["flag"] == "True" and logged["name"] == "vgrpo"
    assert len(logged["prompt"]) == PARAM_VALUE_LIMIT and logged["prompt"].endswith(TRUNCATION_MARKER)
    full = json.loads(_download(client, run_id, "params.json", tmp_path).read_text())
    assert full["prompt"] == long and full["optim"]["betas"] == [0.9, 0.999]


def test_a_credentials_value_never_reaches_mlflow(
    client: MlflowClient, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # a short setting named like one is left alone
    params = {"pipeline": f"s3://bucket/{secret}/model", "rewards": [{"name": "x", "token": secret}], "flag": "false"}
    log_params(client, run_id, params, artifact_file="secret-check.json")
    logged = client.get_run(run_id).data.params
    assert logged["pipeline"] == "s3://bucket/<redacted>/model" and secret not in json.dumps(logged)
    assert logged["flag"] == "false"
    artifact = _download(client, run_id, "secret-check.json", tmp_path).read_text()
    assert secret not in artifact and "<redacted>" in artifact


def test_log_params_many_keys_batched(client: MlflowClient, run_id: str) -> None:
    log_params(client, run_id, {"grid": {f"k{i}": i for i in range(250)}}, artifact_file="grid.json")
    assert len([k for k in client.get_run(run_id).data.params if k.startswith("grid.")]) == 250


def test_log_metrics_nan_inf_dropped_and_counted(client: MlflowClient, run_id: str) -> None:
    series = [{"loss": 1.0, "kl": 0.1}, {"loss": math.nan, "kl": 0.2}, {"loss": 0.5, "kl": math.inf}]
    dropped = [log_metrics(client, run_id, m, step=i) for i, m in enumerate(series)]
    assert dropped == [0, 1, 1]
    loss = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in sorted(loss, key=lambda m: m.step)] == [(0, 1.0), (2, 0.5)]
    kl = client.get_metric_history(run_id, "kl")
    assert sorted(m.step for m in kl) == [0, 1]
    counts = client.get_metric_history(run_id, NONFINITE_METRIC)
    assert sorted((m.step, m.value) for m in counts) == [(1, 1.0), (2, 1.0)]


def test_log_metrics_keys_sanitised(client: MlflowClient, run_id: str) -> None:
    log_metrics(client, run_id, {"train/ratio[max]": 1.5, "reward:ocr": np.float32(0.25)}, step=3)
    metrics = client.get_run(run_id).data.metrics
    assert metrics["train/ratio_max_"] == 1.5 and metrics["reward_ocr"] == 0.25


def test_log_metrics_colliding_keys_raise(client: MlflowClient, run_id: str) -> None:
    with pytest.raises(ValueError, match="both sanitise"):
        log_metrics(client, run_id, {"a:b": 1.0, "a_b": 2.0}, step=0)


def test_sanitize_key_paths_and_unicode() -> None:
    assert sanitize_key("/train//loss/./x") == "train/loss/x"
    assert sanitize_key("../up") == "up"
    assert sanitize_key("α-β") == "_-_"
    assert len(sanitize_key("k" * 400)) == 250
    with pytest.raises(ValueError, match="no usable"):
        sanitize_key("//")


def test_log_image_array_and_file_round_trip(client: MlflowClient, run_id: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    array = rng.integers(0, 256, size=(8, 12, 3), dtype=np.uint8)
    log_image(client, run_id, array, "samples/step_0.png")
    source = tmp_path / "grid_source.png"
    Image.fromarray(array[::-1]).save(source)
    log_image(client, run_id, source, "grids/base.png")
    back = np.asarray(Image.open(_download(client, run_id, "samples/step_0.png", tmp_path / "a")))
    np.testing.assert_array_equal(back, array)
    copied = _download(client, run_id, "grids/base.png", tmp_path / "b")
    assert copied.read_bytes() == source.read_bytes()
    with pytest.raises(FileNotFoundError):
        log_image(client, run_id, tmp_path / "missing.png", "x.png")


def test_log_json_and_dir_round_trip(client: MlflowClient, run_id: str, tmp_path: Path) -> None:
    data = {"overall": 0.039, "path": tmp_path, "tags": {"counting": 0.007}}
    log_json(client, run_id, data, "eval/base_eval.json")
    back = json.loads(_download(client, run_id, "eval/base_eval.json", tmp_path / "j").read_text())
    assert back == {"overall": 0.039, "path": str(tmp_path), "tags": {"counting": 0.007}}
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    (folder / "sub" / "b.txt").write_text("b")
    log_artifact_dir(client, run_id, folder, "checkpoint")
    assert {f.path for f in client.list_artifacts(run_id, "checkpoint")} == {"checkpoint/a.txt", "checkpoint/sub"}
    assert [f.path for f in client.list_artifacts(run_id, "checkpoint/sub")] == ["checkpoint/sub/b.txt"]
    with pytest.raises(NotADirectoryError):
        log_artifact_dir(client, run_id, folder / "a.txt")
