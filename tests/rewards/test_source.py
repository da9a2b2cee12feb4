"""The editing reward source_similarity (vgrpo/rewards/source.py): the negative mean absolute pixel difference to each
row's source image, resized to the sample's size; built by name, reading the rows' condition-image paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vgrpo.rewards import build_reward


def test_source_similarity_is_zero_for_the_source_and_falls_with_the_pixel_difference(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    source = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    Image.fromarray(source).save(tmp_path / "s.png")
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / "black.png")
    reward = build_reward("source_similarity", {})
    rows = [{"prompt": "p", "image": str(tmp_path / "s.png")}, {"prompt": "p", "image": str(tmp_path / "black.png")}]
    images = np.stack([source, np.full((8, 8, 3), 51, dtype=np.uint8)])
    out = reward(images, ["p", "p"], rows)
    # The source itself scores 0; a flat grey 51 against a black source (upsized to 8 x 8) scores -51 / 255.
    np.testing.assert_allclose(out.scores, [0.0, -0.2], atol=1e-12)
    assert reward.applies_to("p", rows[0]) and not reward.applies_to("p", {"prompt": "p"})
    with pytest.raises(ValueError, match="needs per-image metadata"):
        reward(images, ["p", "p"])


def test_a_prompt_file_for_source_similarity_names_a_source_image_in_every_row() -> None:
    from vgrpo.rewards.registry import reward_class

    cls = reward_class("source_similarity")
    assert cls.check_prompts([{"prompt": "p", "image": "/x.png"}], "f.jsonl", {}) == []
    problems = cls.check_prompts([{"prompt": "p", "image": "/x.png"}, {"prompt": "q"}], "f.jsonl", {})
    assert problems == ["f.jsonl: 1 rows name no source image ('image'), the first row 2"]
