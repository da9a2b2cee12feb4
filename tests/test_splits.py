"""The rule that recipe selection never reads the test split (vgrpo.splits): which files are the test split, and
which choice records a final report accepts."""

from __future__ import annotations

import json
from pathlib import Path

from vgrpo.splits import choice_record_problems, is_test_split, split_record, tuning_prompt_problems


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_test_split_by_name_or_by_bytes(tmp_path: Path) -> None:
    test = _write(tmp_path / "test.jsonl", '{"prompt": "a photo of a square"}\n')
    copy = _write(tmp_path / "held.jsonl", test.read_text())
    validation = _write(tmp_path / "validation.jsonl", '{"prompt": "a photo of a circle"}\n')
    assert is_test_split(test)
    assert not is_test_split(copy)  # no known test file to compare with
    assert is_test_split(copy, [test])  # a renamed copy is still the test split
    assert not is_test_split(validation, [test])
    assert not is_test_split(tmp_path / "absent.jsonl", [test])
    problems = tuning_prompt_problems(
        {"--prompts": copy, "--validation": validation}, [test], final_report="the final report"
    )
    assert problems == [
        f"--prompts {copy}: the test split; recipe selection reads the validation split, and only the final report "
        "reads test (the final report)"
    ]


def test_split_record_names_the_bytes(tmp_path: Path) -> None:
    rows = _write(tmp_path / "validation.jsonl", '{"prompt": "a photo of a circle"}\n')
    record = split_record(rows, "validation")
    assert record["role"] == "validation" and record["prompt_file"] == str(rows)
    # sha256 of the line above, computed independently
    import hashlib

    assert record["sha256"] == hashlib.sha256(rows.read_bytes()).hexdigest()


def test_a_final_report_needs_every_choice_on_record_on_validation(tmp_path: Path) -> None:
    good = {"split": {"prompt_file": "data/world/validation.jsonl", "sha256": "ab"}, "runs": {}}
    on_test = {"split": {"prompt_file": "data/world/test.jsonl", "sha256": "cd"}}
    _write(tmp_path / "good.json", json.dumps(good))
    _write(tmp_path / "runs.json", json.dumps([good, good]))  # a list of run records, each with its split
    _write(tmp_path / "table.json", json.dumps({"prompt_file": "data/world/validation.jsonl"}))  # an evaluation
    _write(tmp_path / "test.json", json.dumps(on_test))
    _write(tmp_path / "silent.json", json.dumps([good, {"seed": 0}]))
    _write(tmp_path / "broken.json", "{")
    field = "curriculum.choices (c.yaml)"
    assert choice_record_problems(["good.json", "runs.json", "table.json"], field=field, root=tmp_path) == []
    assert choice_record_problems([], field=field, root=tmp_path) == [
        f"{field}: empty; a final report needs the tuning records its recipe was chosen on"
    ]
    problems = choice_record_problems(
        ["good.json", "test.json", "silent.json", "broken.json", "absent.json"], field=field, root=tmp_path
    )
    assert problems[0] == f"{field}: test.json: its numbers read the test split; re-choose on validation"
    assert problems[1] == f"{field}: silent.json: does not say which prompts its numbers read (no 'split')"
    assert problems[2].startswith(f"{field}: broken.json: not JSON (")
    assert problems[3] == f"{field}: absent.json: no such record"
    assert len(problems) == 4
