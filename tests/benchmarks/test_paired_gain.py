"""benchmarks.paired_gain: a stage run's gains over the base, paired image by image, with the colour prompts split
into held-out and seen colour-shape pairs."""

from __future__ import annotations

import pytest

from benchmarks import paired_gain


def test_paired_gain_pairs_images_and_splits_the_colour_prompts() -> None:
    prompts = ["a photo of a red triangle", "a photo of a green square", "a photo of two circles", "a sign"]
    tags = ["colors", "colors", "counting", "ocr"]
    base = {
        "prompt": [*prompts, "not evaluated by the run"],
        "tag": [*tags, "counting"],
        "geneval": {"strict": [0.25, 0.5, 0.5, None, 0.0]},
        "ocr": {"mean": [None, None, None, 0.5, None]},
    }
    run = {
        "prompt": prompts,
        "tag": tags,
        "geneval": {"strict": [0.0, 1.0, 0.75, None]},
        "ocr": {"mean": [None, None, None, 0.75]},
    }
    row = paired_gain.paired_row(run, base, [("red", "triangle")])
    # strict is the mean over tags: colors (0 + 1) / 2, counting 0.75; the base's (0.25 + 0.5) / 2 and 0.5
    assert row["strict"] == pytest.approx((0.5 + 0.75) / 2) and row["base_strict"] == pytest.approx((0.375 + 0.5) / 2)
    assert row["gain"] == pytest.approx(row["strict"] - row["base_strict"])
    assert row["per_tag_gain"] == pytest.approx({"colors": 0.125, "counting": 0.25})
    assert row["held_out_colour_gain"] == pytest.approx(-0.25) and row["seen_colour_gain"] == pytest.approx(0.5)
    assert row["ocr_gain"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="first prompts"):
        paired_gain.paired_row({**run, "prompt": prompts[::-1]}, base, [])
