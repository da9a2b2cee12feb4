"""Flow-GRPO's OCR reward formula on hand-made cases, and the PP-OCR engine on the world's text renders."""

from __future__ import annotations

import numpy as np
import pytest

from vgrpo.rewards.ocr import RapidOCRReader, levenshtein, ocr_score, ocr_target
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


def test_rapidocr_reads_ground_truth_renders() -> None:
    _, test = make_splits(3, 1, 24, tags=("ocr",))
    reader = RapidOCRReader()
    texts = reader.read(np.stack([render(scene) for _, scene in test]))
    scores = [ocr_score(text, md["text"]) for (md, _), text in zip(test, texts, strict=True)]
    assert np.mean(scores) >= 0.9, list(zip([md["text"] for md, _ in test], texts, strict=True))
    blank = reader.read(np.zeros((2, 32, 32, 3), dtype=np.uint8))
    assert [ocr_score(t, "stop") for t in blank] == [0.0, 0.0]
