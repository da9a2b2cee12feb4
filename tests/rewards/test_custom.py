"""A user's own reward without forking: ``module:Class``, ``module:function`` and an entry point, checked when the
params are validated and used by a training stage."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.rewards.custom import redness, trl_prompts_first
from tests.tiny_world import write_tiny_world
from vgrpo.config import StageConfig
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward
from vgrpo.rewards.registry import ENTRY_POINT_GROUP, build_reward, function_problem

IMAGES = np.stack([np.full((8, 8, 3), 255, np.uint8), np.zeros((8, 8, 3), np.uint8)])
IMAGES[1, ..., 0] = 255  # white, then red


def test_a_reward_class_and_a_reward_function_from_the_users_module() -> None:
    rewards = MultiReward.from_configs(
        [
            RewardConfig(name="tests.rewards.custom:Brightness", options={"gain": 2.0}),
            RewardConfig(name="tests.rewards.custom:redness", weight=0.5),
        ]
    )
    out = rewards(IMAGES, ["a", "b"])
    assert rewards.weights == {"Brightness": 1.0, "redness": 0.5}  # the attribute names the reward in logs
    np.testing.assert_allclose(out.scores["Brightness"], [2.0, 2 / 3])
    np.testing.assert_allclose(out.scores["redness"], [1 / 3, 1.0], atol=1e-6)
    assert RewardConfig(name="tests.rewards.custom:redness").resolved_key == "redness"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("tests.rewards.custom:Missing", "module 'tests.rewards.custom' has no attribute 'Missing'"),
        ("tests.rewards.no_such_module:Brightness", "cannot import module 'tests.rewards.no_such_module'"),
        ("tests.rewards.custom:NotAReward", "NotAReward is not a vgrpo.rewards.base.Reward subclass"),
        ("tests.rewards.custom:DEFAULT_GAIN", "neither a Reward subclass nor a function"),
        ("brightness", "unknown reward 'brightness'.*entry points"),
    ],
)
def test_a_bad_custom_reward_is_named_when_the_params_are_validated(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RewardConfig(name=name)


def test_trl_and_flow_grpo_reward_functions_are_adapted() -> None:
    """trl's ``fn(completions, **kwargs) -> list[float]`` and flow_grpo's ``(scores, metadata)`` give the scores
    vgrpo's own signature gives."""
    expected = build_reward("tests.rewards.custom:redness")(IMAGES, ["a", "b"]).scores
    for name in ("tests.rewards.custom:trl_redness", "tests.rewards.custom:flow_grpo_redness"):
        np.testing.assert_allclose(build_reward(name)(IMAGES, ["a", "b"]).scores, expected, rtol=1e-12)
    assert list(expected.round(6)) == [0.333333, 1.0]


def test_trl_functions_get_prompts_and_the_rows_columns_by_keyword_in_any_order() -> None:
    """trl calls ``reward_funcs`` by keyword: ``prompts``, ``completions`` and each dataset column; a function
    written so (prompts first, a column through ``**kwargs``) passes the params check and scores as trl would call
    it; a misspelt option is refused naming the signatures accepted."""
    name = "tests.rewards.custom:trl_prompts_first"
    assert RewardConfig(name=name).resolved_key == "trl_prompts_first"
    assert function_problem(trl_prompts_first, name, {}) is None
    reward = build_reward(name)
    assert reward.reads_metadata  # a stage hands it the prompt rows
    rows = [{"prompt": "a", "tag": "colors"}, {"prompt": "b", "tag": "ocr"}]
    expected = build_reward("tests.rewards.custom:redness")(IMAGES, ["a", "b"]).scores
    np.testing.assert_allclose(reward(IMAGES, ["a", "b"], rows).scores, expected, rtol=1e-12)
    problem = function_problem(redness, "tests.rewards.custom:redness", {"chanel": 1})
    assert problem is not None and "the signatures accepted: fn(images, prompts, metadata" in problem


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "tests.rewards.custom:one_image_reward",
            r"one_image_reward\(image: 'np.ndarray'\) -> 'float' is not a reward function; expected "
            r"fn\(images, prompts, metadata, \*\*options\).*or fn\(completions, \*\*kwargs\) -> list\[float\]",
        ),
        ("tests.rewards.custom:HalfReward", r"class HalfReward cannot be built: it is abstract \(score\(\) not"),
    ],
)
def test_a_reward_no_caller_can_call_or_build_is_refused_in_one_line(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        RewardConfig(name=name)
    assert "bad options" not in str(info.value)


def test_a_reward_registered_by_another_package_under_the_entry_point_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = tmp_path / "my_rewards-1.0.dist-info"  # what installing a package with that entry point leaves
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-rewards\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nbright = tests.rewards.custom:Brightness\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert RewardConfig(name="bright").resolved_key == "bright"
    np.testing.assert_allclose(build_reward("bright", {"gain": 3.0})(IMAGES, ["a", "b"]).scores, [3.0, 1.0])


def _two_iteration_stage(name: str, rewards: list[dict[str, str]]) -> StageConfig:
    """A two-iteration LoRA stage on the tiny world's train prompts with ``rewards``."""
    return StageConfig.model_validate(
        {
            "name": name,
            "prompts": "train.jsonl",
            "iterations": 2,
            "checkpoint_every": 2,
            "rollout": {"prompts_per_iteration": 2, "group_size": 4, "num_steps": 4, "shift": None},
            "algorithm": {"name": "vgrpo", "n_mc": 2},
            "lora": {"rank": 4, "alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]},
            "rewards": rewards,
        }
    )


def test_a_stage_trains_on_a_users_reward(tmp_path: Path) -> None:
    from vgrpo.training.stage import run_stage

    world = write_tiny_world(tmp_path)
    config = _two_iteration_stage(
        "custom", [{"name": "tests.rewards.custom:Brightness"}, {"name": "tests.rewards.custom:redness"}]
    )
    result = run_stage(config, pipeline_dir=Path("base"), work_dir=world / "run", out_dir=world / "lora", root=world)
    assert [h["guard/skipped"] for h in result.history] == [0.0, 0.0]
    assert {"reward/Brightness_mean", "reward/redness_mean"} <= set(result.history[-1])
    assert (world / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert "tests.rewards.custom" in sys.modules


def test_a_stage_trains_on_a_trl_reward_function_through_the_trainer(tmp_path: Path) -> None:
    """``Trainer(rewards=...)`` with a function written for trl (``f(prompts, completions, **kwargs)``): it gets the
    stage's prompt rows' columns and the stage trains and exports."""
    from vgrpo.trainer import Trainer

    world = write_tiny_world(tmp_path)
    config = _two_iteration_stage("trl", [{"name": "tests.rewards.custom:redness"}])
    trainer = Trainer(
        config, work_dir=world / "run", pipeline=Path("base"), root=world, rewards={"red": trl_prompts_first}
    )
    result = trainer.train(final_evaluation=False)
    assert [h["guard/skipped"] for h in result.history] == [0.0, 0.0]
    assert "reward/red_mean" in result.history[-1]
    assert (world / "run" / "export" / "pytorch_lora_weights.safetensors").is_file()


module_lambda = lambda images, prompts, metadata: [0.0] * len(images)  # noqa: E731 -- what the refusal names


def test_a_reward_class_where_an_instance_goes_is_a_user_error_saying_to_build_it() -> None:
    """``Trainer(rewards=...)``, a :class:`RewardTerm` and a :class:`MultiReward` take reward objects: the class
    itself (``Brightness`` for ``Brightness()``) is refused with the project's user error, not a bare TypeError."""
    from tests.rewards.custom import Brightness, NotAReward, one_image_reward
    from vgrpo.errors import ConfigError, UserError
    from vgrpo.rewards.multi import RewardTerm
    from vgrpo.trainer import Trainer

    config = _two_iteration_stage("api", [{"name": "tests.rewards.custom:redness"}])
    build = "Brightness is a Reward class; pass an instance: Brightness\\(\\)"
    with pytest.raises(UserError, match=rf"rewards\['light'\]: {build}"):
        Trainer(config, work_dir=Path("unused"), rewards={"light": Brightness})
    with pytest.raises(ConfigError, match=rf"RewardTerm.reward: {build}"):
        Trainer(config, work_dir=Path("unused"), rewards={"light": RewardTerm(Brightness, weight=0.5)})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"rewards: a mapping of key -> reward .*got list"):
        Trainer(config, work_dir=Path("unused"), rewards=[Brightness])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=rf"terms\['light'\]: {build}"):
        MultiReward({"light": Brightness})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"terms\['light'\]: a RewardTerm, got Brightness"):
        MultiReward({"light": Brightness()})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"rewards\['zero'\]: tests.rewards.test_custom:<lambda> is a lambda"):
        Trainer(config, work_dir=Path("unused"), rewards={"zero": module_lambda})
    with pytest.raises(
        ConfigError, match=r"rewards\['one'\]: reward 'one': one_image_reward\(image.* is not a reward fun"
    ):
        Trainer(config, work_dir=Path("unused"), rewards={"one": one_image_reward})
    with pytest.raises(ConfigError, match=r"rewards\['other'\]: NotAReward is a class; pass a Reward instance or a"):
        Trainer(config, work_dir=Path("unused"), rewards={"other": NotAReward})
    built = Trainer(config, work_dir=Path("unused"), rewards={"light": Brightness(), "red": RewardTerm(Brightness())})
    assert [r.name for r in built.config.rewards] == ["tests.rewards.custom:Brightness"] * 2
