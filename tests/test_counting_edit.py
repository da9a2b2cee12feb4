"""A real model's counting-edit set from its samples (vgrpo/counting_edit.py): only the samples of counting rows
that GenEval credits become edits, each asking for another count of the source's class with GenEval's clauses for
it, the sources copied byte for byte, the source prompts split 80/10/10 by the seed with each prompt's samples in
one split; the source prompts are worded as GenEval's own counting prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vgrpo.counting_edit import SPLITS, counting_edit_row, counting_prompts, geneval_plural, write_edit_set
from vgrpo.errors import UserError
from vgrpo.prompts import CONDITION_IMAGE_KEY, load_prompts

NUMBERS = {2: "two", 3: "three", 4: "four"}


def _png(path: Path, i: int, k: int, size: int = 8) -> None:
    """A ``size`` px PNG whose pixels are ``(i, k, 0)``: which sample it is, read back by :func:`_sample_of`."""
    Image.fromarray(np.full((size, size, 3), (i, k, 0), dtype=np.uint8)).save(path)


def _sample_of(path: str | Path) -> tuple[int, int]:
    with Image.open(path) as image:
        i, k, _ = np.asarray(image)[0, 0]
    return int(i), int(k)


def _sources(root: Path, n: int = 40, group: int = 2) -> Path:
    """An evaluation as ``vgrpo evaluate --images`` writes it: GenEval counting rows (every fifth a single-object
    row), ``group`` samples each, sample k of row i credited when (i + k) % 3 == 0."""
    rows, credited = [], []
    (root / "samples").mkdir()
    for i in range(n):
        count = 2 + i % 3
        if i % 5 == 4:
            dog = {"class": "dog", "count": 1}
            rows.append({"tag": "single_object", "include": [dog], "prompt": "a photo of a dog"})
        else:
            include, exclude = [{"class": "wine glass", "count": count}], [{"class": "wine glass", "count": count + 1}]
            prompt = f"a photo of {NUMBERS[count]} wine glasses"
            rows.append({"tag": "counting", "include": include, "exclude": exclude, "prompt": prompt})
        credited.append([(i + k) % 3 == 0 for k in range(group)])
        for k in range(group):
            _png(root / "samples" / f"{i:05d}-{k}.png", i, k)
    (root / "counting.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = {"prompt_file": str(root / "counting.jsonl"), "images_dir": str(root / "samples"), "rewards": {}}
    (root / "sources.json").write_text(json.dumps(table))
    (root / "sources.scores.json").write_text(json.dumps({"credited": credited}))
    return root / "sources.json"


def test_credited_counting_samples_become_edits_split_by_prompt(tmp_path: Path) -> None:
    sources = _sources(tmp_path)
    written = write_edit_set(sources, tmp_path / "set", seed=1)
    kept = [(i, k) for i in range(40) for k in range(2) if (i + k) % 3 == 0 and i % 5 != 4]
    assert sum(written[s] for s in SPLITS) == len(kept) == 22 and written["dropped"] == 80 - 22
    splits = {s: load_prompts(tmp_path / "set" / f"{s}.jsonl") for s in SPLITS}
    sources_of = {s: [_sample_of(r[CONDITION_IMAGE_KEY]) for r in rows] for s, rows in splits.items()}
    assert sorted(ik for ids in sources_of.values() for ik in ids) == kept  # each credited sample
    for r in splits["train"]:  # byte for byte
        i, k = _sample_of(r[CONDITION_IMAGE_KEY])
        assert Path(r[CONDITION_IMAGE_KEY]).read_bytes() == (tmp_path / "samples" / f"{i:05d}-{k}.png").read_bytes()
    prompts_of = {s: {i for i, _ in ids} for s, ids in sources_of.items()}
    assert not (prompts_of["train"] & prompts_of["test"]) and not (prompts_of["train"] & prompts_of["validation"])
    for rows, ids in zip(splits.values(), sources_of.values(), strict=True):
        for row, (i, _) in zip(rows, ids, strict=True):
            assert row["source_count"] == 2 + i % 3 and row["t2i_prompt"].endswith("wine glasses")
            target = row["include"][0]["count"]
            assert target != row["source_count"] and row["exclude"] == [{"class": "wine glass", "count": target + 1}]
            assert row["prompt"].startswith("Change the number of wine glasses in the image to ")
    assert write_edit_set(sources, tmp_path / "again", seed=1) == written
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


def test_the_source_prompts_are_worded_as_genevals_counting_prompts() -> None:
    """Every counting prompt of GenEval's and Flow-GRPO's metadata is one :func:`counting_prompts` writes."""
    names, published = set(), []
    for path in ("prompts/geneval/evaluation_metadata.jsonl", "prompts/flow_grpo/geneval/test_metadata.jsonl"):
        published += [r for r in load_prompts(path) if r["tag"] == "counting"]
    names = sorted({r["include"][0]["class"] for r in published})
    ours = {json.dumps(r, sort_keys=True) for r in counting_prompts(names)}
    assert len(published) == 400 and all(json.dumps(r, sort_keys=True) in ours for r in published)
    assert [geneval_plural(n) for n in ("bus", "bench", "wine glass")] == ["buses", "benchs", "wine glasses"]


def _edit_set(capsys: pytest.CaptureFixture[str], sources: Path, out: Path) -> tuple[int, str]:
    """``vgrpo edit-set`` through the command line: its exit status and stderr."""
    from vgrpo.cli import main

    code = main(["edit-set", "--sources", str(sources), "--out", str(out)])
    return code, capsys.readouterr().err


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_moved_broken_or_resized_sources_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = _sources(tmp_path)
    samples = tmp_path / "samples"
    (samples / "00000-0.png").unlink()  # credited: moved away
    broken = samples / "00002-1.png"
    broken.write_bytes(broken.read_bytes()[:40])  # credited: truncated
    _png(samples / "00003-0.png", 3, 0, size=12)  # credited: not the evaluation's size
    (samples / "00002-0.png").write_text("not an image")  # not credited: never read
    before = _tree(tmp_path)
    code, err = _edit_set(capsys, sources, tmp_path / "out" / "set")
    assert code == 2 and "Traceback" not in err and "edit-set found 3 problems before writing anything" in err
    assert f"source image {samples / '00000-0.png'} not found" in err
    assert f"source image {broken} is not an image that opens" in err
    assert f"source image {samples / '00003-0.png'} is 12x12 pixels, expected 8x8" in err
    assert _tree(tmp_path) == before  # not even --out's parent folder
    _png(samples / "00000-0.png", 0, 0)
    _png(broken, 2, 1)
    _png(samples / "00003-0.png", 3, 0)
    assert _edit_set(capsys, sources, tmp_path / "out" / "set")[0] == 0
    assert len(load_prompts(tmp_path / "out" / "set" / "train.jsonl")) > 0


def test_an_out_overlapping_the_sources_images_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = _sources(tmp_path)
    samples = tmp_path / "samples"
    before = _tree(tmp_path)
    for out, relation in ((samples, "is"), (samples / "set", "lies inside"), (tmp_path, "contains")):
        code, err = _edit_set(capsys, sources, out)
        assert code == 2 and "Traceback" not in err, err
        assert f"--out {out} {relation} an input (--sources images folder" in err, err
        assert _tree(tmp_path) == before
    assert _edit_set(capsys, sources, tmp_path / "edits")[0] == 0


def test_a_malformed_sources_file_is_named_as_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = _sources(tmp_path)
    good = sources.read_text()
    sources.write_text("{not json")
    code, err = _edit_set(capsys, sources, tmp_path / "set")
    assert code == 2 and "Traceback" not in err and "--baseline" not in err
    assert f"--sources {sources}: not JSON" in err and not (tmp_path / "set").exists()
    sources.write_text("[1, 2]")
    code, err = _edit_set(capsys, sources, tmp_path / "set")
    assert code == 2 and f"--sources {sources}: not an evaluation" in err
    sources.write_text(good)
    assert _edit_set(capsys, sources, tmp_path / "set")[0] == 0


def test_a_failed_write_leaves_no_partial_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    sources = _sources(tmp_path)
    copies: list[str] = []
    copy = shutil.copyfile

    def copy_then_fail(src: str, dst: str) -> None:
        copies.append(dst)
        if len(copies) == 3:
            raise OSError(28, "No space left on device")
        copy(src, dst)

    monkeypatch.setattr("vgrpo.counting_edit.shutil.copyfile", copy_then_fail)
    with pytest.raises(OSError, match="No space"):
        write_edit_set(sources, tmp_path / "set")
    assert not (tmp_path / "set").exists() and not list(tmp_path.glob(".set*"))
