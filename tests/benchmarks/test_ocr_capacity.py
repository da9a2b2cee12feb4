"""The OCR capacity check: its paired interval, its refusals, and a tiny run's invariants."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.ocr_capacity import main, paired_interval
from tests.tiny_world import TINY_MODEL_PARAMS, write_tiny_world


def test_paired_interval_of_a_constant_shift_is_the_shift() -> None:
    a = np.array([0.5, 0.25, 1.0, 0.0])
    assert paired_interval(a + 0.125, a) == [0.125, 0.125, 0.125]
    assert paired_interval(a, a) == [0.0, 0.0, 0.0]


def test_paired_interval_brackets_the_mean_difference() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.random(200), rng.random(200)
    mean, lo, hi = paired_interval(a, b)
    assert lo < mean < hi
    assert mean == pytest.approx(float((a - b).mean()), abs=1e-4)
    # the width for a mean of 200 differences of uniforms (sd 1/sqrt(6) = 0.41): 2 * 1.96 * 0.41 / sqrt(200) = 0.113
    assert 0.09 < hi - lo < 0.14


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ranks", "0"], "--ranks: '0' is neither a positive rank nor 'full'"),
        (["--eval-prompts", "data/world/test.jsonl"], "--eval-prompts: the test split is read by final reports only"),
        (["--train-prompts", "absent.jsonl"], "--train-prompts: absent.jsonl does not exist"),
    ],
)
def test_bad_input_is_refused_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["models/embedded-base", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_renamed_copy_of_the_test_split_is_refused_by_its_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = tmp_path / "world"
    world.mkdir()
    (world / "train.jsonl").write_text('{"tag": "ocr", "text": "a", "prompt": "a sign that says \\"a\\""}\n')
    (world / "test.jsonl").write_text('{"tag": "ocr", "text": "b", "prompt": "a sign that says \\"b\\""}\n')
    copy = tmp_path / "held.jsonl"
    copy.write_bytes((world / "test.jsonl").read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        main(["models/embedded-base", "--train-prompts", str(world / "train.jsonl"), "--eval-prompts", str(copy)])
    assert exit_info.value.code == 2
    assert "--eval-prompts: the test split is read by final reports only" in capsys.readouterr().err


def test_a_tiny_run_starts_every_arm_from_the_same_scores(tmp_path: Path) -> None:
    from vgrpo.world import make_splits, write_jsonl

    world = write_tiny_world(tmp_path)
    train, held = make_splits(0, 8, 4, tags=("ocr",))
    write_jsonl(world / "ocr-train.jsonl", [md for md, _ in train])
    write_jsonl(world / "ocr-eval.jsonl", [md for md, _ in held])
    out = tmp_path / "capacity.json"
    main(
        [
            str(world / "base"),
            "--ranks",
            "2",
            "full",
            "--steps",
            "2",
            "--eval-every",
            "1",
            "--batch",
            "2",
            "--eval-group",
            "1",
            "--eval-steps",
            "2",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--targets",
            *TINY_MODEL_PARAMS["lora"]["target_modules"],
            "--train-prompts",
            str(world / "ocr-train.jsonl"),
            "--eval-prompts",
            str(world / "ocr-eval.jsonl"),
            "--out",
            str(out),
        ]
    )
    record = json.loads(out.read_text())
    lora, full = record["arms"]
    # the same base and the same noise: before any step the arms score alike, prompt by prompt
    assert lora["per_prompt"]["0"] == full["per_prompt"]["0"]
    assert lora["minus_full"]["0"] == [0.0, 0.0, 0.0]
    assert [p["step"] for p in lora["curve"]] == [0, 1, 2]
    # a LoRA trains far fewer weights than the whole transformer
    assert 0 < lora["trained_parameters"] < full["trained_parameters"]
