"""What a reward's class answers before anything is built, so that nothing outside the reward knows it: the prompt
rows it needs (preflight and the stage's prompt preparation report them), its headline numbers (a curriculum's
summary, ``dvc metrics show``) and what an evaluation table says of its scores beyond their mean (GenEval's per-tag
accuracies and gains, recomputed here from the committed evaluations)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flows.artifacts import summary_columns, summary_table
from tasks.outcome import StageOutcome
from tests.rewards.custom import Exposure
from tests.tiny_world import tiny_stage_config, write_tiny_world
from vgrpo.config import load_config
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.evaluation.report import format_table, read_evaluation
from vgrpo.evaluation.tables import compare, flat_metrics, headline_metrics, summarise
from vgrpo.prompts import PromptFileError
from vgrpo.rewards.base import HeadlineColumn, Reward
from vgrpo.rewards.config import RewardConfig, reward_classes
from vgrpo.rewards.geneval import GenEvalReward
from vgrpo.rewards.geneval_server import GenEvalServerReward
from vgrpo.rewards.multi import MultiReward
from vgrpo.rewards.registry import FunctionReward, reward_class
from vgrpo.training.preflight import PreflightError, check_or_raise
from vgrpo.training.prompt_rows import prepare_prompts

REPO = Path(__file__).resolve().parents[2]
EXPOSURE = "tests.rewards.custom:Exposure"


def test_a_users_reward_checks_its_prompt_rows_in_the_preflight_and_the_stage(tmp_path: Path) -> None:
    world = write_tiny_world(tmp_path)
    rows = [{"prompt": "a bright scene", "target": 0.8}, {"prompt": "a dark scene"}, {"prompt": "x", "target": True}]
    (world / "exposure.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tiny_stage_config(
        pipeline="base", prompts="exposure.jsonl", rewards=[{"name": EXPOSURE}], eval_prompts=None
    )
    problem = f"{world / 'exposure.jsonl'}: rows [2, 3] have no 'target' brightness in [0, 1] (exposure)"
    with pytest.raises(PreflightError) as raised:
        check_or_raise([config], world)
    assert [str(p) for p in raised.value.problems] == [f"{problem} (tiny: prompts)"]
    with pytest.raises(PromptFileError) as refused:  # the stage refuses the file when run without the preflight
        prepare_prompts(config, world)
    assert str(refused.value) == problem
    (world / "exposure.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert prepare_prompts(config, world).train == rows[:1]


def test_a_users_reward_names_its_headline_numbers_in_the_summary_and_dvc_metrics() -> None:
    rewards = [{"name": "geneval"}, {"name": EXPOSURE, "key": "exp"}]
    stages = [tiny_stage_config(evaluation={"group_size": 1, "num_steps": 2, "rewards": rewards})]
    assert summary_columns(stages) == [
        "eval/geneval_geneval_strict",
        "eval/geneval_geneval_partial",
        "eval/exp",
        "eval/exp_hit",
    ]
    final = {"eval/exp": 0.9, "eval/exp_ci_low": 0.85, "eval/exp_ci_high": 0.95, "eval/exp_hit": 0.75}
    header, row = summary_table(stages, [StageOutcome("tiny", "out", "abc", final_eval=final)]).splitlines()
    assert "exp [95% CI]" in header and "exp_hit [95% CI]" in header
    assert row.split() == ["tiny", "-", "-", "0.900", "[0.850,", "0.950]", "0.750"]
    assert headline_metrics({**final, "eval/exp_gain": 0.1}, stages[0].evaluation.rewards) == {
        "exposure": 0.9,
        "exposure_hits": 0.75,
        "exposure_gain": 0.1,
    }


def test_a_users_reward_says_which_images_it_credits_and_keeps_its_sub_score_means() -> None:
    images = np.stack([np.full((4, 4, 3), v, np.uint8) for v in (204, 0, 51, 51)])
    metadata = [{"prompt": "bright", "target": 0.8}] * 2 + [{"prompt": "dim", "target": 0.2}] * 2
    rewards = MultiReward.from_configs([RewardConfig(name=EXPOSURE)])
    prompts = [md["prompt"] for md in metadata]
    table = summarise(rewards(images, prompts, metadata), prompts, metadata, rewards, group_size=2)
    assert table["per_prompt"]["credited"] == [[True, False], [True, True]]
    assert table["rewards"]["Exposure"]["hit"] == 0.75 and "per_tag" not in table["rewards"]["Exposure"]
    text = format_table({**table, "seconds": {"total": 1.0}}, {"Exposure": Exposure})
    assert text.startswith("Exposure: 0.8000")  # no lines of its own before its mean


def test_the_classes_answer_from_the_params_without_building_a_reward() -> None:
    assert reward_class("geneval") is GenEvalReward and reward_class("tests.rewards.custom:redness") is FunctionReward
    assert RewardConfig(name="tests.rewards.custom:redness").headline_columns() == (
        HeadlineColumn("redness", "eval/redness"),
    )
    assert RewardConfig(name="clipscore", key="world_clipscore").headline_columns() == (
        HeadlineColumn("clipscore", "eval/world_clipscore"),
    )
    # The server's overall GenEval scores exist only when it sends the official rule.
    assert [c.name for c in GenEvalServerReward.headline_columns("g", {})] == ["geneval_server"]
    assert [c.name for c in GenEvalServerReward.headline_columns("g", {"only_strict": False})] == [
        "strict",
        "partial",
        "strict_gain",
    ]
    # GenEval's clauses: malformed rows first, then the scoring detector's vocabulary (none for recorded detections).
    cats = [{"prompt": "a cat", "tag": "single_object", "include": [{"class": "cat", "count": 1}]}]
    assert GenEvalReward.check_prompts(cats, "f.jsonl", {"detector": "mask2former"}) == []
    assert GenEvalReward.check_prompts(cats, "f.jsonl", {"detector": "recorded"}) == []
    (unknown,) = GenEvalReward.check_prompts(cats, "f.jsonl", {})
    assert unknown.startswith("f.jsonl: GenEval clauses name 'cat' (in 'a cat'), unknown to the world detector")
    (unknown,) = GenEvalServerReward.check_prompts(
        [{**cats[0], "include": [{"class": "circle", "count": 1}]}], "f.jsonl", {}
    )
    assert "unknown to Mask2Former" in unknown
    bad = [{**cats[0], "include": [{"class": "cat", "count": 0}]}]
    assert GenEvalReward.check_prompts(bad, "f.jsonl", {}) == [
        "f.jsonl: row 1 ('a cat'): include[0].count must be an integer >= 1, got 0"
    ]
    assert Reward.check_prompts(bad, "f.jsonl", {}) == [] and Exposure.check_prompts([], "f.jsonl", {}) == []


def _without_gains(table: dict[str, Any]) -> dict[str, Any]:
    table = copy.deepcopy(table)
    for entry in table["rewards"].values():
        for row in [entry, *entry.get("per_tag", {}).values()]:
            for name in [n for n in row if "gain" in n]:
                del row[name]
    return table


def test_the_committed_curriculum_evaluations_gains_are_recomputed_byte_for_byte() -> None:
    """``compare`` (GenEval's per-tag gains from its reward class) on the committed per-prompt scores writes the
    committed metrics file again."""
    config = load_config([REPO / "params/embedded/evaluate.yaml"], section="evaluation", schema=EvaluationConfig)
    base = read_evaluation(REPO / "metrics/base_eval.json")
    trained = read_evaluation(REPO / "metrics/curriculum_eval.json")
    again = compare(_without_gains(trained), base, reward_classes(config.rewards))
    assert again == trained
    written = json.dumps({k: v for k, v in again.items() if k != "per_prompt"}, indent=2, sort_keys=True) + "\n"
    assert written == (REPO / "metrics/curriculum_eval.json").read_text()
    flat = flat_metrics(again)  # per tag: the scores with an interval, not the gains
    assert flat["eval/geneval_counting_strict"] == again["rewards"]["geneval"]["per_tag"]["counting"]["strict"]
    assert "eval/geneval_geneval_strict_gain" in flat and "eval/geneval_counting_strict_gain" not in flat
    assert headline_metrics(flat, config.rewards)["strict_gain"] == round(flat["eval/geneval_geneval_strict_gain"], 5)
