"""A reward's ``prompt_tags``: a preference + OCR stage scores its OCR prompts by OCR alone and the others by the
preference rewards alone (which rewards give NaN to which samples, and the advantages that follow), a set whose tags
leave a prompt tag unscored is refused naming it (the stage's config and the prompt file's rows), and a config
without the option scores as before."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from vgrpo.advantages import compute_advantages
from vgrpo.config import StageConfig
from vgrpo.rewards.config import RewardConfig, prompt_problems
from vgrpo.rewards.multi import MultiReward
from vgrpo.rewards.ocr import OCRReward

DELTA = 1e-4
"""compute_advantages' default std guard."""


class _BrightReader:
    """Reads "hi" in a bright image and nothing in a dark one."""

    def read(self, images: Sequence[np.ndarray] | np.ndarray) -> list[str]:
        return ["hi" if np.asarray(image).mean() > 127 else "" for image in images]


class BrightOCR(OCRReward):
    """The OCR reward (its own ``applies_to``: a quoted text; its score) on :class:`_BrightReader`."""

    def __init__(self) -> None:
        super().__init__(engine=_BrightReader())


PREFERENCE_TAGS = ["single_object", "counting"]
OCR = "tests.rewards.test_prompt_tags:BrightOCR"
CONFIGS = [
    # Stand-ins of world PickScore and world CLIPScore: rewards that score any prompt they are given.
    {"name": "tests.rewards.custom:Brightness", "key": "pick", "weight": 0.5, "prompt_tags": PREFERENCE_TAGS},
    {"name": "tests.rewards.custom:redness", "key": "clip", "weight": 0.5, "prompt_tags": PREFERENCE_TAGS},
    {"name": OCR, "key": "ocr", "weight": 1.0, "prompt_tags": ["ocr"]},
]
ROWS = [
    {"tag": "single_object", "prompt": "a photo of a square"},
    {"tag": "ocr", "prompt": 'a sign that says "hi"'},
    {"tag": "counting", "prompt": "a photo of two circles"},
]
GROUP = 2
# Two samples a prompt: prompt 0 dark grey then light red (brighter and redder), prompt 1 bright then dark,
# prompt 2 two equal greys.
IMAGES = np.stack(
    [
        np.full((4, 4, 3), rgb, np.uint8)
        for rgb in [(60,) * 3, (240, 120, 120), (200,) * 3, (20,) * 3, (102,) * 3, (102,) * 3]
    ]
)
PROMPTS = [row["prompt"] for row in ROWS for _ in range(GROUP)]
METADATA = [row for row in ROWS for _ in range(GROUP)]


def _rewards(configs: Sequence[dict]) -> MultiReward:
    return MultiReward.from_configs([RewardConfig.model_validate(c) for c in configs])


def _plus_minus(half_gap: float) -> np.ndarray:
    """A group of two's advantages, the lower sample first: +-(half the gap) / (its std, the half gap, + delta)."""
    a = half_gap / (half_gap + DELTA)
    return np.array([-a, a])


def test_ocr_prompts_get_only_ocr_and_the_others_only_the_preference_rewards() -> None:
    rewards = _rewards(CONFIGS)
    assert rewards.needs_metadata  # the tags are read from the prompt rows
    out = rewards(IMAGES, PROMPTS, METADATA)
    nan = {key: np.isnan(values).tolist() for key, values in out.raw.items()}
    assert nan == {
        "pick": [False, False, True, True, False, False],
        "clip": [False, False, True, True, False, False],
        "ocr": [True, True, False, False, True, True],
    }
    np.testing.assert_allclose(out.raw["pick"][[0, 1, 4, 5]], [60 / 255, 160 / 255, 0.4, 0.4])
    np.testing.assert_allclose(out.raw["clip"][[0, 1, 4, 5]], [1 / 3, 0.5, 1 / 3, 1 / 3])
    np.testing.assert_allclose(out.raw["ocr"][[2, 3]], [1.0, 0.0])

    result = compute_advantages(out.score_tensors(), group_size=GROUP, weights=rewards.weights)
    # Each prompt: the weighted sum of the normalised rewards that score it; those weights sum to 1 per prompt here.
    pick, clip, ocr = _plus_minus(50 / 255), _plus_minus(1 / 12), _plus_minus(0.5)
    expected = np.concatenate([0.5 * pick + 0.5 * clip, -ocr, [0.0, 0.0]])
    np.testing.assert_allclose(result.advantages.numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(expected[:4], [-0.999146, 0.999146, 0.9998, -0.9998], atol=1e-6)
    assert result.metrics["reward/ocr_scored_frac"] == pytest.approx(1 / 3)
    assert result.metrics["reward/pick_scored_frac"] == pytest.approx(2 / 3)
    np.testing.assert_allclose(result.total_reward.numpy()[2:4], [1.0, 0.0])  # the OCR prompt's total: OCR alone

    # The weights are not renormalised per prompt: at 1 each, a prompt two rewards score moves twice as far.
    doubled = compute_advantages(out.score_tensors(), group_size=GROUP, weights={"pick": 1, "clip": 1, "ocr": 1})
    np.testing.assert_allclose(doubled.advantages.numpy()[:2], pick + clip, rtol=1e-5)


def test_the_tags_narrow_the_rewards_own_rule_and_never_widen_it() -> None:
    # OCR told to score single-object prompts too still scores only prompts with a quoted text (its own rule).
    out = _rewards([{"name": OCR, "key": "ocr", "prompt_tags": ["ocr", "single_object"]}])(IMAGES, PROMPTS, METADATA)
    assert np.isnan(out.raw["ocr"]).tolist() == [True, True, False, False, True, True]
    with pytest.raises(ValueError, match="reward 'pick' scores prompts by their tags: it needs the prompt rows"):
        _rewards(CONFIGS)(IMAGES, PROMPTS)


def test_without_prompt_tags_the_preference_rewards_score_the_ocr_prompts_as_before() -> None:
    plain = [{k: v for k, v in c.items() if k != "prompt_tags"} for c in CONFIGS]
    out = _rewards(plain)(IMAGES, PROMPTS, METADATA)
    assert not np.isnan(out.raw["pick"]).any() and not np.isnan(out.raw["clip"]).any()  # the OCR prompt bleeds
    assert np.isnan(out.raw["ocr"]).tolist() == [True, True, False, False, True, True]
    dumped = RewardConfig.model_validate(plain[0]).model_dump()
    assert "prompt_tags" not in dumped  # a config without the option dumps (and fingerprints) as before
    assert RewardConfig.model_validate(CONFIGS[0]).model_dump()["prompt_tags"] == tuple(PREFERENCE_TAGS)


def _stage(**fields: object) -> StageConfig:
    return StageConfig.model_validate({"prompts": "train.jsonl", "iterations": 1, "rewards": CONFIGS, **fields})


def test_a_stage_whose_reward_tags_leave_one_of_its_prompt_tags_unscored_is_refused_naming_it() -> None:
    assert _stage(prompt_tags=["single_object", "ocr"]).rewards[2].prompt_tags == ("ocr",)
    assert _stage().prompt_tags is None  # tags unknown to the config: the prompt file's rows are checked instead
    with pytest.raises(ValidationError, match=r"prompt tags \['colors'\] would be scored by no reward"):
        _stage(prompt_tags=["single_object", "colors", "ocr"])
    with pytest.raises(ValidationError, match=r"prompt tags \['position'\] would be scored by no reward"):
        _stage(prompt_tag_weights={"ocr": 1.0, "counting": 1.0, "position": 2.0})
    with pytest.raises(ValidationError, match="prompt_tags is empty"):
        RewardConfig(name="tests.rewards.custom:Brightness", prompt_tags=[])


def test_a_prompt_file_with_a_tag_no_reward_scores_is_refused_naming_the_tag_and_its_first_row() -> None:
    rewards = [RewardConfig.model_validate(c) for c in CONFIGS]
    rows = [*ROWS, {"tag": "colors", "prompt": "a photo of a red circle"}, {"prompt": "no tag"}]
    problems = prompt_problems(rewards, rows, "train.jsonl")
    assert problems == [
        "train.jsonl: prompts tagged 'colors' (the first: row 4) are scored by no reward: every reward's prompt_tags "
        "leaves the tag out (name it in one, or leave it out with the stage's prompt_tags)",
        "train.jsonl: prompts without a `tag` (the first: row 5) are scored by no reward: every reward's prompt_tags "
        "leaves the tag out (name it in one, or leave it out with the stage's prompt_tags)",
    ]
    assert prompt_problems(rewards, rows, "train.jsonl", kept_tags=["ocr", "counting"]) == []  # the stage's filter
    assert prompt_problems(rewards, ROWS, "train.jsonl") == []
    untagged = [RewardConfig.model_validate({k: v for k, v in c.items() if k != "prompt_tags"}) for c in CONFIGS]
    assert prompt_problems(untagged, rows, "train.jsonl") == []  # no option: every tag is scored, as before


def test_the_stage_reads_its_file_through_its_own_prompt_tags_filter(tmp_path: Path) -> None:
    """A file with a tag no reward scores trains when the stage's ``prompt_tags`` leaves that tag out (the rows it
    draws are all scored), and is refused naming the tag when the stage draws every row."""
    from vgrpo.prompts import PromptFileError
    from vgrpo.training.prompt_rows import training_rows
    from vgrpo.world import write_jsonl

    write_jsonl(tmp_path / "train.jsonl", [*ROWS, {"tag": "colors", "prompt": "a photo of a red circle"}])
    kept = training_rows(_stage(prompt_tags=["single_object", "ocr", "counting"]), tmp_path)
    assert [r["tag"] for r in kept] == ["single_object", "ocr", "counting"]
    with pytest.raises(PromptFileError, match=r"prompts tagged 'colors' .* are scored by no reward"):
        training_rows(_stage(), tmp_path)
