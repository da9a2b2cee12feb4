"""Prompt files: JSONL metadata and plain text, read with a size cap and errors naming the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgrpo.prompts import PromptFileError, load_prompts

PROMPTS = Path(__file__).parents[1] / "prompts"


def test_shipped_prompt_files_load() -> None:
    assert len(load_prompts(PROMPTS / "geneval" / "evaluation_metadata.jsonl")) == 553
    ocr = load_prompts(PROMPTS / "flow_grpo" / "ocr" / "test.txt")
    assert len(ocr) == 1018 and all(set(row) == {"prompt"} and row["prompt"].count('"') >= 2 for row in ocr)
    assert len(load_prompts(PROMPTS / "flow_grpo" / "pickscore" / "train.txt")) == 25432


def test_bad_prompt_files_are_named(tmp_path: Path) -> None:
    cases = {
        "missing.txt": (None, "prompt file not found"),
        "empty.txt": ("\n\n", "prompt file is empty"),
        "latin1.txt": ("caf\xe9".encode("latin-1"), "not UTF-8"),
        "list.jsonl": ('["a photo"]\n', ":1: expected a JSON object"),
        "blank_prompt.jsonl": ('{"prompt": "a"}\n{"prompt": " "}\n', ":2: expected a JSON object"),
        "long.txt": ("x" * 3000 + "\n", ":1: prompt of 3000 characters"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
        with pytest.raises(PromptFileError, match=message) as info:
            load_prompts(path)
        assert str(path) in str(info.value)
    big = tmp_path / "big.txt"
    big.write_text("a photo\n" * 100)
    with pytest.raises(PromptFileError, match="over the 64-byte limit"):
        load_prompts(big, max_bytes=64)


def test_a_rows_condition_image_is_resolved_against_the_prompt_file_and_must_exist(tmp_path):
    from vgrpo.prompts import CONDITION_IMAGE_KEY

    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"png")
    absolute = tmp_path / "images" / "a.png"
    path = tmp_path / "edits.jsonl"
    path.write_text(
        '{"prompt": "make it red", "image": "images/a.png"}\n'
        f'{{"prompt": "make it blue", "image": "{absolute}"}}\n'
        '{"prompt": "no source"}\n'
    )
    rows = load_prompts(path)
    assert CONDITION_IMAGE_KEY == "image"
    assert [r.get("image") for r in rows] == [str(absolute), str(absolute), None]
    path.write_text('{"prompt": "x", "image": "images/missing.png"}\n')
    with pytest.raises(PromptFileError, match=r"edits.jsonl:1: condition image 'images/missing.png' not found"):
        load_prompts(path)
    path.write_text('{"prompt": "x", "image": 3}\n')
    with pytest.raises(PromptFileError, match=r"edits.jsonl:1: 'image' must be a non-empty path string"):
        load_prompts(path)
