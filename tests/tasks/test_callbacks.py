"""tasks.callbacks: a stage's MLflow run logs each evaluation's grid with the stage's ``evaluation.grid_prompts``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient
from PIL import Image

from tasks.callbacks import StageTracker
from tasks.tracking import Tracking, tracking_uri
from tests.tiny_world import tiny_stage_config
from vgrpo.evaluation.grids import CAPTION_HEIGHT


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = tracking_uri(tmp_path_factory.mktemp("mlflow"))
    MlflowClient(uri).search_experiments()  # creating the SQLite schema costs a few seconds: once per module
    return uri


@pytest.mark.parametrize("grid_prompts", [0, 2, 3])
def test_evaluation_grid_shows_grid_prompts_prompts(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grid_prompts: int
) -> None:
    monkeypatch.setattr(StageTracker, "_start_system_metrics", lambda self, uri, resumed: None)
    evaluation = {"group_size": 1, "num_steps": 2, "rewards": [{"name": "geneval"}], "grid_prompts": grid_prompts}
    cfg = tiny_stage_config(evaluation=evaluation)
    tracker = StageTracker.open(cfg, Tracking(uri, "tests", "grid"), None)
    assert tracker.run_id is not None
    prompts = [f"prompt {i}" for i in range(10)]  # more than the 8 a grid used to show whatever the setting
    table = {"group_size": 1, "rewards": {}, "per_prompt": {"prompt": prompts, "credited": [[None]] * 10}}
    tracker.on_evaluate(table, np.zeros((10, 4, 4, 3), np.uint8), 1)
    tracker.close("FINISHED")
    client = MlflowClient(uri)
    logged = [f.path for f in client.list_artifacts(tracker.run_id, "eval")]
    assert ("eval/iter-00001.png" in logged) == (grid_prompts > 0)
    if grid_prompts:
        grid = client.download_artifacts(tracker.run_id, "eval/iter-00001.png", str(tmp_path / "back"))
        height = np.asarray(Image.open(grid)).shape[0]
        assert height == grid_prompts * ((4 + 2) * 4 + CAPTION_HEIGHT)  # a captioned row per prompt, scale 4
