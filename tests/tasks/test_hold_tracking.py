"""A holding stage as the pipeline runs it (tasks.stage.train_and_track): its MLflow run, the stage table, the Prefect
artifact's Markdown and DVC's metrics say which checkpoint was kept and why."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient

from flows.artifacts import hold_markdown, summary_table
from tasks.callbacks import StageTracker
from tasks.dvc_stage import stage_details, stage_metrics
from tasks.stage import train_and_track
from tasks.tracking import Tracking, tracking_uri
from tests.training.test_hold import _config, drop_from_2, world  # noqa: F401  (the tiny world, the drop)
from vgrpo.checkpoints.state import LORA_FILE


def test_the_kept_checkpoint_and_why_reach_mlflow_the_stage_table_and_dvc(
    world: Path,  # noqa: F811
    drop_from_2: None,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(StageTracker, "_start_system_metrics", lambda self, uri, resumed: None)
    uri = tracking_uri(tmp_path / "mlflow")
    cfg = _config().model_copy(update={"pipeline": "base"})  # breaks its hold at iteration 2 (drop_from_2)
    outcome = train_and_track(cfg, None, str(tmp_path / "runs"), str(world), Tracking(uri, "tests", cfg.name))
    assert outcome is not None and outcome.hold is not None and outcome.hold["kept_iteration"] == 1
    kept = tmp_path / "runs" / "work" / cfg.name / "hold" / "iter-00001" / LORA_FILE
    assert (Path(outcome.out_dir) / LORA_FILE).read_bytes() == kept.read_bytes()

    run = MlflowClient(uri).get_run(str(outcome.run_id))
    assert run.data.tags["vgrpo.hold.kept_iteration"] == "1" and run.data.tags["vgrpo.hold.stopped_at"] == "None"
    assert run.data.tags["vgrpo.hold.reason"].startswith("iteration 1 is the last check that holds; iteration 2 broke")
    history = MlflowClient(uri).get_metric_history(str(outcome.run_id), "hold/holds")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 1.0), *((i, 0.0) for i in range(2, 7))]
    assert "hold.json" in [f.path for f in MlflowClient(uri).list_artifacts(str(outcome.run_id))]

    evaluated = outcome.replace(final_eval={"eval/world_pickscore": -5.8})
    table = summary_table([cfg], [evaluated]).splitlines()
    assert table[0].split()[-1] == "kept" and table[1].split()[-2:] == ["iteration", "1"]
    markdown = hold_markdown(cfg.name, outcome.hold)
    assert "Exported: **iteration 1**. iteration 1 is the last check that holds" in markdown
    assert markdown.count("| no |") == 5 and markdown.count("| yes |") == 2

    details = stage_details(evaluated, 1)
    assert details["hold"]["kept_iteration"] == 1
    assert stage_metrics(details, cfg.evaluation.rewards)["kept_iteration"] == 1
