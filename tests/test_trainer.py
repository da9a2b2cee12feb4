"""The trainer API: built from params files or Python objects (a user's reward function and Reward instance), it
trains, evaluates and exports; it trains exactly what :func:`vgrpo.training.stage.run_stage` trains from the same
params."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from tests.rewards.custom import Brightness, redness
from tests.tiny_world import tiny_stage_config as _config
from tests.tiny_world import write_tiny_world
from vgrpo import Trainer
from vgrpo.errors import ConfigError
from vgrpo.models.pipeline import load_pipeline
from vgrpo.rewards.multi import RewardTerm
from vgrpo.training.stage import StageOptions, run_stage

LORA = "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def params(world: Path) -> Path:
    path = world / "stage.yaml"
    path.write_text(yaml.safe_dump(_config(iterations=2).model_dump(mode="json")))
    return path


def test_a_trainer_from_params_trains_what_run_stage_trains(world: Path, params: Path) -> None:
    trainer = Trainer.from_params(params, pipeline="base", work_dir=world / "api", root=world)
    result = trainer.train(final_evaluation=False)
    run_stage(
        _config(iterations=2),
        pipeline_dir=Path("base"),
        work_dir=world / "plain",
        out_dir=world / "plain-out",
        root=world,
        options=StageOptions(final_evaluation=False),
    )
    assert result.iterations == 2 and trainer.out_dir == world / "api" / "export"
    assert (world / "api" / "export" / LORA).read_bytes() == (world / "plain-out" / LORA).read_bytes()
    table = trainer.evaluate()
    assert table is not None and table[0]["iteration"] == 2 and "geneval" in str(table[0])


def test_a_users_reward_function_and_reward_object_train_and_name_themselves(world: Path, params: Path) -> None:
    trainer = Trainer.from_params(
        params,
        overrides={"eval_prompts": None},
        pipeline="base",
        work_dir=world / "mine",
        root=world,
        rewards={"red": redness, "bright": RewardTerm(Brightness(gain=2.0), weight=0.5)},
    )
    assert [(r.name, r.key, r.weight) for r in trainer.config.rewards] == [
        ("tests.rewards.custom:redness", "red", 1.0),
        ("tests.rewards.custom:Brightness", "bright", 0.5),
    ]
    result = trainer.train()
    assert {"reward/red_mean", "reward/bright_mean"} <= set(result.history[-1])
    assert result.history[-1]["reward/bright_raw_mean"] > 0
    assert trainer.evaluate() is None  # no evaluation prompts


def test_export_copies_the_adapter_or_merges_it_into_a_plain_pipeline(world: Path, params: Path) -> None:
    trainer = Trainer.from_params(params, pipeline="base", work_dir=world / "api", root=world)
    if not (world / "api" / "export" / LORA).is_file():
        trainer.train(final_evaluation=False)
    copied = trainer.export(world / "copied")
    assert (copied / LORA).read_bytes() == (world / "api" / "export" / LORA).read_bytes()
    merged = load_pipeline(trainer.export(world / "merged", merged=True)).transformer
    assert not any("lora" in name for name, _ in merged.named_parameters())
    plain = load_pipeline(world / "base").transformer
    assert any(not torch.equal(a, b) for a, b in zip(merged.parameters(), plain.parameters(), strict=True))


def test_bad_rewards_and_stages_are_config_errors_naming_them(world: Path, params: Path) -> None:
    def local(images, prompts, metadata):  # type: ignore[no-untyped-def]
        return [0.0] * len(images)

    with pytest.raises(ConfigError, match=r"rewards\['mine'\].*module level"):
        Trainer.from_params(params, pipeline="base", work_dir=world / "x", root=world, rewards={"mine": local})
    with pytest.raises(ConfigError, match="no exported weights"):
        Trainer.from_params(params, pipeline="base", work_dir=world / "never", root=world).export(world / "y")
    curriculum = Path(__file__).resolve().parents[1] / "params" / "curricula" / "embedded.yaml"
    root = curriculum.parents[2]
    second = Trainer.from_curriculum(curriculum, 2, work_dir=world / "c", root=root)
    assert (
        Trainer.from_curriculum(curriculum, second.config.name, work_dir=world / "c", root=root).config == second.config
    )
    with pytest.raises(ConfigError, match="no stage 'nope'"):
        Trainer.from_curriculum(curriculum, "nope", work_dir=world / "c", root=root)


def test_progress_true_shows_the_live_line_on_stderr(world: Path, params: Path, capsys: pytest.CaptureFixture) -> None:
    trainer = Trainer.from_params(
        params,
        overrides={"eval_prompts": None},
        pipeline="base",
        work_dir=world / "progress",
        root=world,
        progress=True,
    )
    result = trainer.train()
    lines = [line for line in capsys.readouterr().err.splitlines() if " | iteration " in line]  # not diffusers' bars
    assert len(lines) == 2  # off a terminal: the first iteration, then the last (no 30 s passed between)
    rewards = [f"{h['reward/total_mean']:.3f}" for h in result.history]
    assert re.fullmatch(
        rf"{trainer.config.name} \| iteration 1/2 \| \d+\.\d s/it \| ETA \d+s \| reward {rewards[0]}", lines[0]
    )
    assert re.fullmatch(rf".* \| iteration 2/2 \| .* \| ETA 0s \| reward {rewards[0]} {rewards[1]}", lines[1])
