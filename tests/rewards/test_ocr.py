"""Flow-GRPO's OCR reward formula on hand-made cases, and the PP-OCR engine on the world's text renders."""

from __future__ import annotations

import numpy as np
import pytest

from vgrpo.rewards import build_reward
from vgrpo.rewards.ocr import OCRReward, levenshtein, ocr_score, ocr_target
from vgrpo.world import make_splits, render


@pytest.mark.parametrize(
    ("recognised", "target", "expected"),
    [
        ("STOP", "stop", 1.0),  # case ignored
        ("++STOP!", "stop", 1.0),  # substring -> distance 0
        ("s t o p", "stop", 1.0),  # spaces removed on both sides
        ("stap", "stop", 0.75),  # one substitution out of 4
        ("", "stop", 0.0),  # nothing read: distance 4 = len
        ("completely different", "no", 0.0),  # distance capped at the target length
        ("sal", "sale", 0.75),
        ("20 24", "2024", 1.0),
        ("yes", "yes sir", 1 - 3 / 6),  # target "yessir" (6), distance 3
    ],
)
def test_ocr_score_matches_flow_grpo(recognised: str, target: str, expected: float) -> None:
    assert ocr_score(recognised, target) == pytest.approx(expected)


def test_levenshtein_and_target_extraction() -> None:
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3 and levenshtein("abc", "abc") == 0
    assert ocr_target('a sign that says "open" in red') == "open"
    assert ocr_target('a "two" and "three"') == "two"  # the first quoted span, as Flow-GRPO
    with pytest.raises(ValueError, match="no double-quoted"):
        ocr_target("a sign that says open")
    with pytest.raises(ValueError, match="empty"):
        ocr_score("abc", " ")


def test_ocr_reward_on_ground_truth_renders_is_at_least_09() -> None:
    _, test = make_splits(3, 1, 24, tags=("ocr",))
    reward = build_reward("ocr")
    out = reward(np.stack([render(scene) for _, scene in test]), [md["prompt"] for md, _ in test])
    assert out.scores.mean() >= 0.9, out.scores
    assert out.sub_scores["exact"].mean() >= 0.8
    blank = reward(np.zeros((2, 32, 32, 3), dtype=np.uint8), ['a sign that says "stop"'] * 2)
    assert blank.scores.tolist() == [0.0, 0.0]
    assert reward.applies_to('a sign that says "stop"', None) and not reward.applies_to("a photo of a ring", None)


LINE_BOX = [0.0, 0.72, 1.0, 1.0]  # the world's text band (params/embedded/evaluate.yaml)


def test_line_reader_reads_every_world_word_exactly_and_noise_as_nothing() -> None:
    from vgrpo.world.prompts import OCR_WORDS
    from vgrpo.world.scene import Scene

    reward = build_reward("ocr", {"line_box": LINE_BOX})
    prompts = [f'a sign that says "{w}"' for w in OCR_WORDS]
    out = reward(np.stack([render(Scene(objects=(), text=w)) for w in OCR_WORDS]), prompts)
    assert out.scores.tolist() == [1.0] * len(OCR_WORDS)
    noise = np.random.default_rng(0).integers(0, 256, (len(prompts), 32, 32, 3), dtype=np.uint8)
    assert reward(noise, prompts).scores.mean() <= 0.05
    _, test = make_splits(3, 1, 16, tags=("ocr",))  # objects above the band do not disturb the read
    scenes = np.stack([render(scene) for _, scene in test])
    assert reward(scenes, [md["prompt"] for md, _ in test]).scores.tolist() == [1.0] * 16


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"line_box": [0.0, 0.8, 1.0, 0.7]}, "line_box"),
        ({"line_box": [0.0, 0.72, 1.0]}, "line_box"),
        ({"line_box": LINE_BOX, "engine": "paddleocr"}, "rapidocr recogniser only"),
    ],
)
def test_line_reader_rejects_bad_boxes(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OCRReward(**options)


def test_ocr_reward_takes_any_reader() -> None:
    class Fixed:
        def read(self, images: np.ndarray) -> list[str]:
            return ["STOP", "stap"][: len(images)]

    out = OCRReward(engine=Fixed())(np.zeros((2, 8, 8, 3), np.uint8), ['say "stop"', 'say "stop"'])
    assert out.scores.tolist() == [1.0, 0.75] and out.sub_scores["exact"].tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="no double-quoted"):
        OCRReward(engine=Fixed())(np.zeros((1, 8, 8, 3), np.uint8), ["say stop"])
    with pytest.raises(ValueError, match="'rapidocr' or 'paddleocr'"):
        OCRReward(engine="tesseract")
