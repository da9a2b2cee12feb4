"""A real model's counting-edit set from its samples (vgrpo/counting_edit.py): only the counting rows whose source
GenEval credits become edits, each asking for another count of the source's class with GenEval's clauses for it,
the sources copied byte for byte, split 80/10/10 by the seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgrpo.counting_edit import SPLITS, counting_edit_row, write_edit_set
from vgrpo.errors import UserError
from vgrpo.prompts import CONDITION_IMAGE_KEY, load_prompts

NUMBERS = {2: "two", 3: "three", 4: "four"}


def _sources(root: Path, n: int = 40) -> Path:
    """An evaluation as ``vgrpo evaluate --images`` writes it: GenEval counting rows (every fifth a single-object
    row), one sample each, every third credited."""
    rows, credited = [], []
    for i in range(n):
        count = 2 + i % 3
        if i % 5 == 4:
            dog = {"class": "dog", "count": 1}
            rows.append({"tag": "single_object", "include": [dog], "prompt": "a photo of a dog"})
        else:
            include, exclude = [{"class": "clock", "count": count}], [{"class": "clock", "count": count + 1}]
            rows.append(
                {
                    "tag": "counting",
                    "include": include,
                    "exclude": exclude,
                    "prompt": f"a photo of {NUMBERS[count]} clocks",
                }
            )
        credited.append([i % 3 == 0])
        (root / "samples").mkdir(exist_ok=True)
        (root / "samples" / f"{i:05d}-0.png").write_bytes(f"png {i}".encode())
    (root / "counting.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = {"prompt_file": str(root / "counting.jsonl"), "images_dir": str(root / "samples"), "rewards": {}}
    (root / "sources.json").write_text(json.dumps(table))
    (root / "sources.scores.json").write_text(json.dumps({"credited": credited}))
    return root / "sources.json"


def test_credited_counting_sources_become_edits_split_by_the_seed(tmp_path: Path) -> None:
    sources = _sources(tmp_path)
    written = write_edit_set(sources, tmp_path / "set", seed=1)
    kept = [i for i in range(40) if i % 3 == 0 and i % 5 != 4]
    assert len(kept) == 11 and written == {"train": 9, "validation": 1, "test": 1, "dropped": 40 - len(kept)}
    assert round(SPLITS["train"] * len(kept)) == 9
    rows = [row for split in SPLITS for row in load_prompts(tmp_path / "set" / f"{split}.jsonl")]
    assert sorted(Path(r[CONDITION_IMAGE_KEY]).read_bytes() for r in rows) == sorted(f"png {i}".encode() for i in kept)
    for row in rows:
        source = int(Path(row[CONDITION_IMAGE_KEY]).read_bytes().split()[1])
        assert row["source_count"] == 2 + source % 3 and row["t2i_prompt"].endswith("clocks")
        target = row["include"][0]["count"]
        assert target != row["source_count"] and row["exclude"] == [{"class": "clock", "count": target + 1}]
        assert row["prompt"].startswith("Change the number of clocks in the image to ")
    again = write_edit_set(sources, tmp_path / "again", seed=1)
    assert again == written
    assert (tmp_path / "again" / "train.jsonl").read_text() == (tmp_path / "set" / "train.jsonl").read_text()


def test_an_evaluation_without_images_or_credit_marks_is_refused(tmp_path: Path) -> None:
    sources = _sources(tmp_path)
    with pytest.raises(UserError, match=r"--sources .*does not exist"):
        write_edit_set(tmp_path / "none.json", tmp_path / "set")
    table = json.loads(sources.read_text())
    del table["images_dir"]
    sources.write_text(json.dumps(table))
    with pytest.raises(UserError, match="--images and a GenEval reward"):
        write_edit_set(sources, tmp_path / "set")


def test_an_edit_must_change_the_count() -> None:
    row = {"tag": "counting", "include": [{"class": "clock", "count": 2}], "prompt": "a photo of two clocks"}
    with pytest.raises(ValueError, match="not an edit"):
        counting_edit_row(row, 2, "images/0.png", "clocks")
    with pytest.raises(ValueError, match="not a GenEval counting row"):
        counting_edit_row(row | {"tag": "colors"}, 3, "images/0.png", "clocks")
