"""Preflight: every bad input of a run listed in one message before any compute (planted together here), what the
files say checked and not only that they exist, the weights' folder set by one environment variable, and the entry
points (the flow, DVC's stage command) refusing before any MLflow run or training."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.tiny_world import TINY_MODEL_PARAMS, WORLD_PICK, write_tiny_world
from tests.tiny_world import tiny_stage_config as _config
from vgrpo.checkpoints.weight_files import weights_problem
from vgrpo.config import load_curriculum
from vgrpo.rewards.checks import url_problem
from vgrpo.training.checkpoint_disk import checkpoint_estimate
from vgrpo.training.preflight import PreflightError, check_or_raise, preflight

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("preflight"))


def _stage(**overrides: Any) -> Any:
    """A valid tiny stage on :func:`write_tiny_world`'s pipeline (``base``), with ``overrides``."""
    return _config(**{"pipeline": "base", **overrides})


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_one_error_lists_every_planted_problem(world: Path, tmp_path: Path) -> None:
    no_vae = tmp_path / "no-vae"
    shutil.copytree(world / "base", no_vae)
    shutil.rmtree(no_vae / "vae")
    corrupt_pick = tmp_path / "corrupt-pickscore"
    shutil.copytree(WORLD_PICK, corrupt_pick)
    _truncate(corrupt_pick / "model.safetensors")
    cats = tmp_path / "cats.jsonl"  # GenEval clauses the world detector (circles, squares, triangles) cannot see
    rows = [
        {"prompt": "a photo of a cat", "tag": "single_object", "include": [{"class": "cat", "count": 1}]},
        {"prompt": "a purple square", "tag": "colors", "include": [{"class": "square", "count": 1, "color": "purple"}]},
    ]
    cats.write_text("".join(json.dumps(r) + "\n" for r in rows))
    missing_dir = tmp_path / "no-such-reward-model"
    first = _stage(
        pipeline=str(no_vae),
        prompts=str(cats),
        rewards=[{"name": "geneval"}, {"name": "pickscore", "options": {"path": str(corrupt_pick)}}],
    )
    second = _stage(
        name="second",
        prompts=str(tmp_path / "stage-2-prompts.jsonl"),
        rewards=[
            {"name": "pickscore", "options": {"path": str(missing_dir)}},
            {"name": "unifiedreward", "options": {"base_url": "http://localhost:port"}},
        ],
    )

    with pytest.raises(PreflightError) as raised:
        check_or_raise([first, second], world, checkpoint_dir=tmp_path / "work")
    message = str(raised.value)
    expected = {
        "component": f"{no_vae}: component folder vae/ is missing",
        "truncated": f"{corrupt_pick / 'model.safetensors'}: does not open",
        "vocabulary": f"{cats}: GenEval clauses name 'cat'",
        "missing prompts": f"{tmp_path / 'stage-2-prompts.jsonl'}: prompt file not found (second: prompts)",
        "missing model": f"{missing_dir}: not found (second: rewards[0].options.path)",
        "url": "http://localhost:port: not a well-formed URL",
    }
    for what, part in expected.items():
        assert part in message, (what, message)
    assert "'purple'" in message  # the colour too, in the same line as the class
    assert len(raised.value.problems) == len(expected), message
    assert message.startswith(f"preflight found {len(expected)} problems before any compute:")


def test_the_shipped_embedded_curriculum_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not (REPO / "data/world/train.jsonl").is_file():
        pytest.skip("the world's prompt files are DVC outputs: dvc pull (or dvc repro world_splits)")
    monkeypatch.chdir(REPO)  # the curriculum's paths are relative to the project root
    _, stages = load_curriculum("params/curricula/embedded.yaml")
    assert preflight(stages, ".", checkpoint_dir=tmp_path) == []


def test_the_weights_folder_is_one_environment_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("VGRPO_MODELS", raising=False)
    _, stages = load_curriculum("params/curricula/sd35.yaml")  # loads: a config that never reads the paths is fine
    assert stages[0].pipeline == "${VGRPO_MODELS}/stable-diffusion-3.5-medium"
    (unset,) = [p for p in preflight(stages) if "VGRPO_MODELS" in p.message]
    assert unset.used_by.startswith("read by s1-preference: pipeline, rewards[0].options.path")  # one line in all
    assert "s2-geneval: pipeline, rewards[0].options.detector_options.config_path" in unset.used_by
    monkeypatch.setenv("VGRPO_MODELS", str(tmp_path))
    _, stages = load_curriculum("params/curricula/sd35.yaml")
    messages = [str(p) for p in preflight(stages)]
    pipeline = f"{tmp_path}/stable-diffusion-3.5-medium: pipeline directory not found"
    assert f"{pipeline} (s1-preference: pipeline, and 4 more)" in messages
    assert any("prompts/flow_grpo/geneval/train_metadata.jsonl: prompt file not found" in m for m in messages)
    assert not any("VGRPO_MODELS" in m for m in messages)


def test_the_geneval_vocabulary_is_the_scoring_detectors(world: Path) -> None:
    """COCO classes pass Mask2Former and fail the world detector; the world's shapes the other way round."""
    shipped = REPO / "prompts/geneval/evaluation_metadata.jsonl"
    mask2former = {"name": "geneval", "options": {"detector": "mask2former"}}
    coco = _stage(prompts=str(shipped), rewards=[mask2former], eval_prompts=None)
    assert preflight([coco], world) == []
    (problem,) = preflight([_stage(prompts=str(shipped), rewards=[{"name": "geneval"}], eval_prompts=None)], world)
    assert str(shipped) in problem.message and "unknown to the world detector" in problem.message
    (problem,) = preflight([_stage(prompts="train.jsonl", rewards=[mask2former], eval_prompts=None)], world)
    assert "'circle'" in problem.message or "'square'" in problem.message or "'triangle'" in problem.message


def test_weights_files_are_opened_without_unpickling(tmp_path: Path) -> None:
    import torch

    good = tmp_path / "good.pth"
    torch.save({"w": torch.zeros(64, 64)}, good)  # the zip format
    assert weights_problem(good) is None
    bad = tmp_path / "bad.pth"
    bad.write_bytes(good.read_bytes()[:-200])  # the archive's directory is at the end
    assert "does not open (BadZipFile" in str(weights_problem(bad))
    with zipfile.ZipFile(tmp_path / "other.pt", "w") as z:
        z.writestr("readme.txt", "not a checkpoint")
    assert "without data.pkl" in str(weights_problem(tmp_path / "other.pt"))
    (tmp_path / "config.py").write_text("model = dict(type='Mask2Former'\n")
    assert "SyntaxError" in str(weights_problem(tmp_path / "config.py"))  # compiled, never run
    assert weights_problem(tmp_path / "absent.safetensors") == "not found"


def test_server_urls() -> None:
    assert url_problem("http://127.0.0.1:17140") is None and url_problem("https://reward.example/v1") is None
    assert "well-formed" in str(url_problem("127.0.0.1:17140"))
    assert "well-formed" in str(url_problem("ftp://host:21"))
    assert "well-formed URL" in str(url_problem("http://host:99999"))
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
        assert url_problem(closed) is None  # no connection unless asked for
        assert "no server accepts a connection" in str(url_problem(closed, connect=True, timeout=1))


def test_checkpoint_estimate_counts_the_trainable_parameters(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vgrpo.models.lora import add_lora
    from vgrpo.models.pipeline import load_pipeline

    config = _stage()
    assert config.lora is not None
    estimate = checkpoint_estimate(config, world / "base")
    assert estimate is not None
    transformer = load_pipeline(world / "base").transformer
    add_lora(transformer, rank=config.lora.rank, alpha=config.lora.alpha, target_modules=config.lora.target_modules)
    trainable = sum(p.numel() for p in transformer.parameters() if p.requires_grad)
    assert f"{trainable:,} trainable fp32 parameters" in estimate[1]
    kept = config.keep_checkpoints + 1
    assert estimate[0] == 4 * trainable * (3 * kept + 1)  # weights + 2 Adam moments per checkpoint, + the export

    from types import SimpleNamespace

    monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(total=2000, used=1000, free=1000))
    (problem,) = preflight([config], world, checkpoint_dir=world / "work")
    assert "0.00 GB free on its disk, but the checkpoints need about" in problem.message
    assert "2 Adam moments" in problem.message


def test_processes_against_the_batch_and_the_devices(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _stage()  # 2 prompts per iteration
    (problem,) = preflight([config], world, world_size=4)
    assert "prompts_per_iteration=2 must be divisible by the 4 processes" in problem.message
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    (problem,) = preflight([config], world, world_size=2)
    assert "2 processes per machine, but 1 CUDA devices are visible" in problem.message


def test_the_flow_stops_at_preflight_before_any_mlflow_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("prefect")
    from mlflow import MlflowClient

    from flows.curriculum import curriculum_flow
    from tasks.tracking import tracking_uri

    stages: dict[str, Any] = {
        "a.yaml": {"name": "s1", "prompts": "train.jsonl", "iterations": 1, "rewards": [{"name": "geneval"}]},
        "b.yaml": {"name": "s2", "prompts": "later.jsonl", "iterations": 1, "rewards": [{"name": "geneval"}]},
    }
    (tmp_path / "base.yaml").write_text("seed: 0\n")
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(TINY_MODEL_PARAMS))  # its pipeline `base` does not exist
    for name, data in stages.items():
        (tmp_path / name).write_text(yaml.safe_dump(data))
    curriculum = {"name": "tiny", "base": ["base.yaml"], "model": "model.yaml", "stages": ["a.yaml", "b.yaml"]}
    (tmp_path / "curriculum.yaml").write_text(yaml.safe_dump({"curriculum": curriculum}))
    uri = tracking_uri(tmp_path / "mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(PreflightError) as raised:
        curriculum_flow.fn(curriculum="curriculum.yaml", root=str(tmp_path), run_root="runs")  # the flow's body
    for part in (
        "base: pipeline directory not found",
        "train.jsonl: prompt file not found",
        "later.jsonl: prompt file not found (s2: prompts)",
    ):
        assert part in str(raised.value)
    assert MlflowClient(uri).get_experiment_by_name("tiny") is None
    assert not (tmp_path / "runs").exists()
