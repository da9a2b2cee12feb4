"""Editing prompt rows' source images are opened before any compute: a row whose ``image`` is not an image (text
under a .png name, a truncated PNG) is refused by the train and evaluate preflights with its file and line, every
such row in one message, and ``vgrpo evaluate`` exits 2 without a traceback or a written result; real images pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tiny_world import tiny_stage_config, write_tiny_world
from vgrpo.cli import main
from vgrpo.models.tiny_flux_kontext import write_condition_image
from vgrpo.prompts import PromptFileError, load_prompts
from vgrpo.training.preflight import preflight

SOURCE_SIMILARITY = [{"name": "source_similarity"}]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("condition-images"))


def _edits(root: Path) -> Path:
    """Three editing rows naming ``images/{0,1,2}.png`` (written as real 16 px images)."""
    for i in range(3):
        write_condition_image(root / "images" / f"{i}.png", seed=i)
    rows = [{"prompt": f"make shape {i} red", "image": f"images/{i}.png"} for i in range(3)]
    (root / "edits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "edits.jsonl"


def _break(root: Path) -> None:
    """Row 2's image is text, row 3's a truncated PNG."""
    (root / "images" / "1.png").write_text("not an image\n")
    truncated = root / "images" / "2.png"
    truncated.write_bytes(truncated.read_bytes()[:60])


def test_load_prompts_opens_every_source_image_only_when_asked(tmp_path: Path) -> None:
    edits = _edits(tmp_path)
    assert len(load_prompts(edits, open_images=True)) == 3
    _break(tmp_path)
    assert len(load_prompts(edits)) == 3  # the rollout's read: the files exist, the preflight opened them
    with pytest.raises(PromptFileError) as raised:
        load_prompts(edits, open_images=True)
    lines = str(raised.value).splitlines()
    assert lines[0].startswith(f"{edits}:2: condition image 'images/1.png' is not an image that opens")
    assert lines[1].startswith(f"{edits}:3: condition image 'images/2.png' is not an image that opens")
    assert len(lines) == 2


def test_the_train_preflight_names_each_bad_source_image(world: Path, tmp_path: Path) -> None:
    edits = _edits(tmp_path)
    stage = tiny_stage_config(pipeline="base", prompts=str(edits), rewards=SOURCE_SIMILARITY, eval_prompts=None)
    assert preflight([stage], world) == []
    _break(tmp_path)
    messages = [str(p) for p in preflight([stage], world)]
    assert len(messages) == 2 and all(m.endswith("(tiny: prompts)") for m in messages), messages
    assert messages[0].startswith(f"{edits}:2: condition image 'images/1.png' is not an image that opens")


def test_evaluate_refuses_a_bad_source_image_before_any_compute(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edits = _edits(tmp_path)
    _break(tmp_path)
    out = tmp_path / "eval.json"
    args = ["evaluate", str(world / "base"), "--prompts", str(edits), "--out", str(out)]
    args += ["--set", "rewards=[{name: source_similarity}]", "group_size=1", "num_steps=1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "preflight found 2 problems before any compute" in err
    assert f"{edits}:2: condition image 'images/1.png' is not an image" in err
    assert f"{edits}:3: condition image 'images/2.png' is not an image" in err
    assert not out.exists()
    _edits(tmp_path)  # the images written again: the same command runs
    assert main(args) == 0 and out.is_file()
