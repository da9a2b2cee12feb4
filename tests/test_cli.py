"""The command line: split files, evaluation JSON and grid, and clear errors for bad params, prompt files and
pipeline directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgrpo.cli import main
from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
from vgrpo.world import GENEVAL_TAGS, read_jsonl

from .models.test_embedded import TINY

PARAMS = Path(__file__).parents[1] / "params" / "embedded" / "pretrain.yaml"


def test_world_splits_are_seeded_and_hold_out_pairs(tmp_path: Path) -> None:
    args = ["world-splits", "--params", str(PARAMS), "--set", "train_prompts=70", "test_prompts=35"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    train, test = read_jsonl(tmp_path / "a" / "train.jsonl"), read_jsonl(tmp_path / "a" / "test.jsonl")
    assert len(train) == 70 and len(test) == 35
    assert (tmp_path / "a" / "test.jsonl").read_bytes() == (tmp_path / "b" / "test.jsonl").read_bytes()
    assert {r["tag"] for r in test} == {*GENEVAL_TAGS, "ocr"}
    named = {(c["color"], c["class"]) for r in train for c in r.get("include", []) if "color" in c}
    assert not named & {("red", "triangle"), ("blue", "circle")}


def test_evaluate_writes_the_table_and_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["world-splits", "--params", str(PARAMS), "--set", "test_prompts=14",
                 "train_prompts=1", "--out", str(tmp_path / "world")]) == 0  # fmt: skip
    prompts = [r["prompt"] for r in read_jsonl(tmp_path / "world" / "test.jsonl")]
    pipe = build_pipeline(TINY, train_clip_tokenizer(prompts, TINY))
    pipe.save_pretrained(tmp_path / "pipe")
    out = tmp_path / "eval.json"
    prompts_file = str(tmp_path / "world" / "test.jsonl")
    grid = str(tmp_path / "grid.png")
    code = main(["evaluate", str(tmp_path / "pipe"), "--prompts", prompts_file, "--out", str(out), "--grid", grid,
                 "--group-size", "2", "--steps", "2"])  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["per_tag"]) == set(GENEVAL_TAGS)
    assert result["prompts"] == 14 and result["group_size"] == 2 and result["ocr_images"] == 4
    assert 0 <= result["geneval_strict"] <= result["geneval_partial"] <= 1 and 0 <= result["ocr"] <= 1
    assert (tmp_path / "grid.png").stat().st_size > 0
    assert "overall" in capsys.readouterr().out


def test_bad_inputs_exit_2_naming_the_culprit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["world-splits", "--params", str(PARAMS), "--set", "batchsize=3", "--out", str(tmp_path)]) == 2
    assert "batchsize" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("pretrain:\n  model:\n    patch_size: 3\n")
    assert main(["world-splits", "--params", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "patch_size" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["evaluate", str(tmp_path), "--prompts", str(empty), "--out", str(tmp_path / "x.json")]) == 2
    assert "prompt file is empty" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"tag": "single_object", "include": [{"class": "ring", "count": 1}], "prompt": "a photo of a ring"}\n'
    )
    assert main(["evaluate", str(tmp_path / "none"), "--prompts", str(good), "--out", str(tmp_path / "x.json")]) == 2
    assert "pipeline directory not found" in capsys.readouterr().err
