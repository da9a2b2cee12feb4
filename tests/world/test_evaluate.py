"""World evaluation: the per-tag table on ground-truth renders and hand-made rows."""

from __future__ import annotations

import numpy as np
import pytest

from vgrpo.world import GENEVAL_TAGS, make_splits, render
from vgrpo.world.evaluate import evaluate_world, score_world_images, summarise


def test_ground_truth_renders_score_one_on_every_tag() -> None:
    _, test = make_splits(5, 1, 42, tags=GENEVAL_TAGS)
    lookup = {md["prompt"]: scene for md, scene in test}

    def oracle(prompts: list[str]) -> np.ndarray:
        return np.stack([render(lookup[p]) for p in prompts])

    summary, images = evaluate_world(oracle, [md for md, _ in test], group_size=2)
    assert images.shape == (84, 32, 32, 3)
    assert set(summary["per_tag"]) == set(GENEVAL_TAGS)
    assert summary["geneval_strict"] == 1.0 and summary["geneval_partial"] == 1.0
    assert summary["varied_group_frac"] == 0.0  # identical samples in each group give GRPO no signal


def test_summary_is_the_mean_of_per_tag_means() -> None:
    rows = [
        {"tag": "counting", "strict": 1.0, "partial": 1.0},
        {"tag": "counting", "strict": 0.0, "partial": 0.5},
        {"tag": "position", "strict": 0.0, "partial": 0.5},
        {"tag": "position", "strict": 0.0, "partial": 0.5},
        {"tag": "ocr", "ocr": 0.25},
        {"tag": "ocr", "ocr": 0.75},
    ]
    out = summarise(rows, group_size=2)
    assert out["per_tag"]["counting"] == {"strict": 0.5, "partial": 0.75, "images": 2}
    assert out["geneval_strict"] == pytest.approx(0.25)  # (0.5 + 0.0) / 2, not 1 / 4 of the images
    assert out["geneval_partial"] == pytest.approx(0.625)
    assert out["varied_group_frac"] == 0.5  # counting group varies, position group does not
    assert out["ocr"] == 0.5 and out["ocr_images"] == 2


def test_noise_scores_near_zero() -> None:
    _, test = make_splits(6, 1, 60, tags=GENEVAL_TAGS)
    noise = np.random.default_rng(0).integers(0, 256, (60, 32, 32, 3), dtype=np.uint8)
    rows = score_world_images([md for md, _ in test], noise)
    assert summarise(rows, group_size=1)["geneval_strict"] <= 0.05
