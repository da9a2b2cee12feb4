"""The world's counting-edit set (vgrpo/world/edits.py): every row asks for a count its source does not show, the
source is its scene's ground-truth render, and the world's GenEval reward fails the unedited source and credits a
ground-truth render of the edited scene, so the reward scores the edit and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vgrpo.counting_edit import EDIT_COUNTS, edit_instruction
from vgrpo.prompts import CONDITION_IMAGE_KEY, load_prompts
from vgrpo.rewards import build_reward
from vgrpo.rewards.clauses import GENEVAL_TAGS
from vgrpo.world.edits import counting_edit, write_counting_edits
from vgrpo.world.prompts import make_splits, scene_for, write_splits
from vgrpo.world.records import read_split
from vgrpo.world.render import render
from vgrpo.world.scene import PLURALS


@pytest.fixture(scope="module")
def edits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    train, test = make_splits(seed=0, n_train=60, n_test=30)
    out = tmp_path_factory.mktemp("edits")
    written = write_counting_edits({"train": train, "test": test}, out, seed=3)
    counting = sum(md["tag"] == "counting" for md, _ in train)
    assert written == {"train": counting, "test": sum(md["tag"] == "counting" for md, _ in test)} and counting >= 8
    return out


def test_every_edit_asks_for_another_count_of_its_sources_shape(edits: Path) -> None:
    rows = load_prompts(edits / "train.jsonl")
    for row in rows:
        (clause,) = row["include"]
        shape, target = clause["class"], clause["count"]
        assert target in EDIT_COUNTS and target != row["source_count"]
        assert row["exclude"] == [{"class": shape, "count": target + 1}] and row["tag"] == "counting"
        assert row["prompt"] == edit_instruction(PLURALS[shape], target) and shape in row["t2i_prompt"]
        assert Path(row[CONDITION_IMAGE_KEY]).is_file()  # load_prompts made the path absolute
    assert len({row["include"][0]["count"] for row in rows}) >= 3  # the targets vary


def test_the_world_geneval_reward_fails_the_source_and_credits_the_edited_scene(edits: Path) -> None:
    from PIL import Image

    rows = load_prompts(edits / "test.jsonl")
    sources = np.stack([np.asarray(Image.open(row[CONDITION_IMAGE_KEY]).convert("RGB")) for row in rows])
    rng = np.random.default_rng(0)
    edited = np.stack([render(scene_for(row, rng)) for row in rows])
    reward = build_reward("geneval", {"reward": "strict"})
    prompts = [row["prompt"] for row in rows]
    np.testing.assert_array_equal(reward(sources, prompts, rows).scores, 0.0)
    np.testing.assert_array_equal(reward(edited, prompts, rows).scores, 1.0)


def test_the_source_is_the_scenes_ground_truth_render_and_the_set_is_seeded(edits: Path, tmp_path: Path) -> None:
    from PIL import Image

    train, test = make_splits(seed=0, n_train=60, n_test=30)
    again = tmp_path / "again"
    write_counting_edits({"train": train, "test": test}, again, seed=3)
    assert (again / "train.jsonl").read_text() == (edits / "train.jsonl").read_text()
    first = next(record for record in train if record[0]["tag"] == "counting")
    source = np.asarray(Image.open(edits / "images" / "train-00000.png").convert("RGB"))
    np.testing.assert_array_equal(source, render(first[1]))
    other = tmp_path / "other"
    write_counting_edits({"train": train}, other, seed=4)
    assert (other / "train.jsonl").read_text() != (edits / "train.jsonl").read_text()


def test_a_record_that_is_not_a_counting_scene_is_refused() -> None:
    train, _ = make_splits(seed=0, n_train=10, n_test=5)
    single = next(record for record in train if record[0]["tag"] != "counting")
    with pytest.raises(ValueError, match="not a GenEval counting row"):
        counting_edit(single, np.random.default_rng(0), "images/x.png")
    metadata, scene = next(record for record in train if record[0]["tag"] == "counting")
    wrong = (metadata, type(scene)(objects=scene.objects[:1], text=None))
    with pytest.raises(ValueError, match="is not"):
        counting_edit(wrong, np.random.default_rng(0), "images/x.png")


def test_the_command_writes_the_set_from_a_worlds_split_files(tmp_path: Path) -> None:
    from vgrpo.world.cli import main

    world = tmp_path / "world"
    write_splits(world, 0, 40, 8, held_out_pairs=(), tags=GENEVAL_TAGS)
    assert main(["counting-edits", "--splits", str(world), "--out", str(tmp_path / "edits"), "--names", "train"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "edits" / "train.jsonl").read_text().splitlines()]
    counting = [record for record in read_split(world / "train.jsonl") if record[0]["tag"] == "counting"]
    assert len(rows) == len(counting) > 0
    assert main(["counting-edits", "--splits", str(tmp_path / "none"), "--out", str(tmp_path / "x")]) == 2
