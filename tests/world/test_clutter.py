"""Clutter: an image with more objects than its prompt names (the world's detector), measured per stage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from vgrpo.world.clutter import ClutterReward, is_cluttered, named_objects
from vgrpo.world.render import render
from vgrpo.world.scene import Scene, object_at

SQUARE = {"tag": "single_object", "include": [{"class": "square", "count": 1}], "prompt": "a photo of a square"}
RED_CIRCLE = {
    "tag": "colors",
    "include": [{"class": "circle", "count": 1, "color": "red"}],
    "prompt": "a photo of a red circle",
}
TWO = {
    "tag": "two_object",
    "include": [{"class": "square", "count": 1}, {"class": "circle", "count": 1}],
    "prompt": "a photo of a square and a circle",
}


def _image(*objects: tuple[tuple[int, int], str, str]) -> np.ndarray:
    return render(Scene(objects=tuple(object_at(cell, shape, color) for cell, shape, color in objects), text=None))


def test_a_second_shape_beside_the_named_square_is_clutter_and_the_square_alone_is_not() -> None:
    alone = _image(((0, 0), "square", "green"))
    with_extra = _image(((0, 0), "square", "green"), ((2, 2), "circle", "blue"))
    assert named_objects(SQUARE) == 1 and named_objects(TWO) == 2
    assert not is_cluttered(alone, SQUARE) and is_cluttered(with_extra, SQUARE)
    # Another shape of the same kind is clutter too, and so is a second red circle for "a red circle".
    assert is_cluttered(_image(((0, 0), "square", "green"), ((2, 0), "square", "yellow")), SQUARE)
    circles = _image(((0, 1), "circle", "red"), ((2, 1), "circle", "red"))
    assert is_cluttered(circles, RED_CIRCLE) and not is_cluttered(_image(((1, 1), "circle", "red")), RED_CIRCLE)
    # Two objects for a prompt that names two: not clutter.
    assert not is_cluttered(with_extra, TWO)

    reward = ClutterReward()
    images = np.stack([alone, with_extra, circles])
    out = reward(images, [SQUARE["prompt"], SQUARE["prompt"], RED_CIRCLE["prompt"]], [SQUARE, SQUARE, RED_CIRCLE])
    assert out.scores.tolist() == [0.0, 1.0, 1.0] and out.sub_scores["objects"].tolist() == [1.0, 2.0, 2.0]
    assert reward.applies_to("", SQUARE) and reward.applies_to("", RED_CIRCLE) and not reward.applies_to("", TWO)


def test_measure_and_figure_on_a_tiny_curriculum_run(tmp_path: Path) -> None:
    from benchmarks.clutter import clutter_config, main, measure
    from tests.tiny_world import tiny_stage_config, write_tiny_world
    from vgrpo.training.stage import run_stage

    root = write_tiny_world(tmp_path)
    stage = tiny_stage_config(iterations=1, eval_prompts=None)
    run_stage(
        stage, pipeline_dir=Path("base"), work_dir=root / "run/work/tiny", out_dir=root / "run/stages/tiny", root=root
    )
    (root / "stage.yaml").write_text(yaml.safe_dump({**stage.model_dump(mode="json"), "pipeline": "base"}))
    curriculum = {"name": "one", "base": [], "model": "stage.yaml", "stages": ["stage.yaml"]}
    (root / "one.yaml").write_text(yaml.safe_dump({"curriculum": curriculum}))
    rows = measure(root / "run", root / "one.yaml", root / "test.jsonl", root, clutter_config(num_steps=2))
    assert [r["stage"] for r in rows] == ["base", "tiny"] and rows[1]["adapter"] == str(root / "run/stages/tiny")
    assert all(r["images"] == 12 and 0.0 <= r["clutter"] <= 1.0 for r in rows)  # test.jsonl: 3 of its 8 rows x 4
    (tmp_path / "a.json").write_text(json.dumps({"stages": rows}))
    assert main(["figure", str(tmp_path / "a.json"), "--out", str(tmp_path / "clutter.png")]) == 0
    assert (tmp_path / "clutter.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit, match="no adapter of"):
        measure(root / "nowhere", root / "one.yaml", root / "test.jsonl", root)
