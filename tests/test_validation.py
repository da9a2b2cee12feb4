"""Bad input is refused before any compute with one message naming the file, the key or line, and what was
expected; ``python -m vgrpo.cli train`` exits 2 and writes nothing."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.tiny_world import tiny_stage_config as _config
from tests.tiny_world import write_tiny_world
from vgrpo.cli import main


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_tiny_world(tmp_path_factory.mktemp("validation"))
    (root / "empty.txt").write_text("\n  \n")
    (root / "broken.jsonl").write_text('{"prompt": "a cat", "tag": "single_object", "include": []}\n{"prompt": \n')
    rows = [{"prompt": "two cats", "tag": "counting", "include": [{"class": "cat", "count": 0}]}]
    (root / "bad_clause.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cat = {"class": "cat", "count": 1, "position": ["left of", 1]}  # refers to a later clause
    rows = [{"prompt": "a cat left of a dog", "tag": "position", "include": [cat, {"class": "dog", "count": 1}]}]
    (root / "bad_position.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "half_pipeline").mkdir()
    index = json.loads((root / "base" / "model_index.json").read_text())
    (root / "half_pipeline" / "model_index.json").write_text(json.dumps(index))
    return root


def _valid() -> dict[str, Any]:
    return _config().model_dump(mode="json") | {"pipeline": "base"}


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


def _train(world: Path, tmp_path: Path, stage: dict[str, Any]) -> int:
    """``vgrpo train`` on ``stage`` written to ``tmp_path/stage.yaml``, rooted in the world, with ``tmp_path/out`` and
    ``tmp_path/work`` as its output and work folders: the exit status."""
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    argv = ["train", "--params", str(tmp_path / "stage.yaml"), "--root", str(world)]
    return main([*argv, "--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work")])


CASES = [
    ("unknown key", "rollout.groupsize", 4, ["stage.yaml", "rollout.groupsize", "Extra inputs"]),
    ("wrong type", "rollout.group_size", "four", ["stage.yaml", "rollout.group_size", "integer"]),
    ("group of one", "rollout.group_size", 1, ["stage.yaml", "rollout.group_size", "greater than or equal to 2"]),
    ("no Monte Carlo pairs", "algorithm.n_mc", 0, ["stage.yaml", "algorithm.vgrpo.n_mc", "greater than or equal to 1"]),
    ("clip range zero", "algorithm.clip_range", 0, ["stage.yaml", "algorithm.vgrpo.clip_range", "greater than 0"]),
    ("unknown algorithm", "algorithm.name", "ppo", ["stage.yaml", "algorithm", "vgrpo"]),
    ("unknown reward", "rewards", [{"name": "hps"}], ["stage.yaml", "unknown reward 'hps'"]),
    ("no skips allowed", "max_consecutive_skips", 0, ["stage.yaml", "max_consecutive_skips"]),
    ("missing prompt file", "prompts", "nope.jsonl", ["nope.jsonl", "not found"]),
    ("empty prompt file", "prompts", "empty.txt", ["empty.txt", "empty"]),
    ("unparsable metadata line", "prompts", "broken.jsonl", ["broken.jsonl:2", "not valid JSON"]),
    ("impossible GenEval count", "prompts", "bad_clause.jsonl", ["bad_clause.jsonl", "row 1", "include[0].count"]),
    ("position without target", "prompts", "bad_position.jsonl", ["bad_position.jsonl", "include[0].position"]),
    ("missing pipeline", "pipeline", "nowhere", ["nowhere", "pipeline directory not found"]),
    ("pipeline without components", "pipeline", "half_pipeline", ["half_pipeline", "component folder transformer/"]),
]


@pytest.mark.parametrize(("case", "key", "value", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_naming_the_culprit(
    world: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    key: str,
    value: Any,
    expected: list[str],
) -> None:
    code = _train(world, tmp_path, _set(_valid(), key, value))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") <= 3, err  # one message, not a traceback
    for part in expected:
        assert part in err, (part, err)
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_the_valid_stage_file_passes_validation(world: Path, tmp_path: Path) -> None:
    """The cases above differ from this file in one entry each, so each failure is that entry's."""
    assert _train(world, tmp_path, _set(_valid(), "iterations", 1) | {"eval_prompts": None}) == 0
    assert (tmp_path / "out" / "pytorch_lora_weights.safetensors").is_file()
