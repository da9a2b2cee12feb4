"""A setting's effect on a stage's validation numbers, paired by seed (benchmarks/curriculum_runs.py,
`python -m benchmarks.robustness compare`): per-seed differences, their mean with a t interval over seeds, and the
float-order spread beside them, on records built by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.curriculum_runs import HEADLINE, paired_stage_table
from benchmarks.robustness import main


def _record(seed: int, threads: int, strict: float) -> dict:
    stage = dict.fromkeys(HEADLINE, 1.0) | {"stage": "s2", "geneval_strict": strict}
    return {"seed": seed, "threads": threads, "stages": [dict(stage, stage="base"), stage]}


def test_the_paired_differences_their_t_interval_and_the_float_order_spread() -> None:
    setting = [_record(s, 1, 0.50 + d) for s, d in ((0, 0.01), (1, 0.03), (2, 0.02))]
    reference = [_record(s, 1, 0.50) for s in range(3)] + [_record(s, 2, 0.49) for s in range(3)]
    table = paired_stage_table(setting, reference, "s2", 1)
    # mean 0.02, sd 0.01 over 3 seeds: half-width t(0.975, 2) 4.303 x 0.01 / sqrt 3 = 0.0248
    assert "| geneval_strict | +0.010 +0.030 +0.020 | +0.020 [-0.005, +0.045] | -0.010 -0.010 -0.010 |" in table
    assert "| ocr | +0.000 +0.000 +0.000 | +0.000 [+0.000, +0.000] |" in table
    with pytest.raises(ValueError, match="no seed has stage 's9'"):
        paired_stage_table(setting, reference, "s9", 1)


def test_the_command_reads_several_record_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text(json.dumps([_record(0, 1, 0.6)]))
    (tmp_path / "b.json").write_text(json.dumps([_record(1, 1, 0.7)]))
    (tmp_path / "ref.json").write_text(json.dumps([_record(0, 1, 0.5), _record(1, 1, 0.5)]))
    args = ["compare", "--setting", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert main([*args, "--reference", str(tmp_path / "ref.json"), "--stage", "s2"]) == 0
    assert "| geneval_strict | +0.100 +0.200 | +0.150 [" in capsys.readouterr().out
