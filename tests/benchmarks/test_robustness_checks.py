"""``python -m benchmarks.robustness grid`` refuses bad arguments and curricula that cannot run before it starts a
run's process: exit 2, one message naming every problem, nothing written (:mod:`benchmarks.robustness_checks`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import robustness
from tests.benchmarks.robustness_world import CURRICULUM, write_robustness_world

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny world with a two-stage curriculum (``curriculum.yaml``) and its test evaluation's params, as the
    grid test of tests/benchmarks/test_robustness.py runs them; ``bad-hold.yaml``'s second stage holds a reward
    its checks do not compute."""
    root = write_robustness_world(tmp_path_factory.mktemp("robustness"))
    hold = {"rewards": {"hps": 0.1}, "every": 1, "prompts": "validation.jsonl"}
    (root / "s2-hold.yaml").write_text(yaml.safe_dump({**yaml.safe_load((root / "s2.yaml").read_text()), "hold": hold}))
    # A stage that evaluates on the test split, and curricula for the final report: without choices, with a choice
    # that read validation, and with one that is the report's own records file.
    on_test = {**yaml.safe_load((root / "s2.yaml").read_text()), "eval_prompts": "test.jsonl"}
    (root / "s2-on-test.yaml").write_text(yaml.safe_dump(on_test))
    (root / "choice.json").write_text(json.dumps({"split": {"prompt_file": "validation.jsonl", "sha256": "-"}}))
    for name, extra in (
        ("bad-hold", {"stages": ["s1.yaml", "s2-hold.yaml"]}),
        ("on-test", {"stages": ["s1.yaml", "s2-on-test.yaml"]}),
        ("chosen", {"choices": ["choice.json"]}),
        ("chosen-on-out", {"choices": ["choice.json", "records.json"]}),
    ):
        (root / f"{name}.yaml").write_text(yaml.safe_dump({"curriculum": CURRICULUM | extra}))
    return root


def _args(world: Path, written: Path, **changed: str) -> list[str]:
    """The grid's arguments on ``world``, writing under ``written``; ``changed`` replaces some (``test_prompts=``)."""
    given = {
        "--root": str(world),
        "--curriculum": "curriculum.yaml",
        "--evaluate-params": "evaluate.yaml",
        "--validation-params": "validation-eval.yaml",
        "--test-prompts": "test.jsonl",
        "--validation-prompts": "validation.jsonl",
        "--run-root": str(written / "runs"),
        "--out": str(written / "runs.json"),
    } | {f"--{k.replace('_', '-')}": v for k, v in changed.items()}
    return [part for flag, value in given.items() for part in (flag, value)]


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The run processes the grid starts, recorded instead of started."""
    started: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        started.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(robustness.subprocess, "run", run)
    return started


def test_bad_arguments_exit_2_with_one_message_naming_each_before_any_run(world: Path, tmp_path: Path) -> None:
    args = _args(world, tmp_path, curriculum="nowhere.yaml", validation_prompts="missing.jsonl")
    cmd = [sys.executable, "-m", "benchmarks.robustness", "grid", "--seeds", "-1", "0", "--threads", "0", "2", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and out.stderr.startswith("error: preflight found 5 problems")
    for part in ("--seeds -1: each must be >= 0", "--threads 0: each must be >= 1", "--threads 2: given twice"):
        assert part in out.stderr, (part, out.stderr)
    assert f"{world / 'nowhere.yaml'}: params file not found" in out.stderr
    assert f"{world / 'missing.jsonl'}: prompt file not found (--validation-prompts)" in out.stderr
    assert "running" not in out.stdout and sorted(tmp_path.iterdir()) == []  # no run started, nothing written


def test_a_stage_that_cannot_run_is_refused_naming_its_file_and_key(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], spawned: list[list[str]]
) -> None:
    assert (
        robustness.main(["grid", "--seeds", "0", "--threads", "1", *_args(world, tmp_path, curriculum="bad-hold.yaml")])
        == 2
    )
    err = capsys.readouterr().err
    assert str(world / "s2-hold.yaml") in err and "hold.rewards.hps: not computed by the hold checks" in err, err
    assert "(--curriculum)" in err and "Traceback" not in err
    assert spawned == [] and sorted(tmp_path.iterdir()) == []


def test_outputs_over_inputs_and_a_missing_pipeline_are_refused(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], spawned: list[list[str]]
) -> None:
    (tmp_path / "root").mkdir()
    for file in world.iterdir():  # the world without its base pipeline
        if file.name != "base":
            (tmp_path / "root" / file.name).symlink_to(file)
    args = _args(tmp_path / "root", tmp_path, out=str(tmp_path / "root" / "validation.jsonl"))
    assert robustness.main(["one", "--seed", "0", "--threads", "1", *args]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'root' / 'base'}: pipeline directory not found (s1: pipeline" in err, err
    assert "--out" in err and "is an input (--validation-prompts)" in err, err
    assert spawned == [] and not (tmp_path / "runs").exists()


def test_a_good_grid_passes_every_check_and_starts_one_process_per_run(
    world: Path, tmp_path: Path, spawned: list[list[str]]
) -> None:
    assert robustness.main(["grid", "--seeds", "0", "1", "--threads", "1", *_args(world, tmp_path)]) == 0
    assert [cmd[cmd.index("--seed") + 1] for cmd in spawned] == ["0", "1"]


def test_a_tuning_grid_refuses_the_test_split_before_any_run(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], spawned: list[list[str]]
) -> None:
    args = _args(world, tmp_path, curriculum="on-test.yaml", validation_prompts="test.jsonl")
    assert robustness.main(["grid", "--seeds", "0", "--threads", "1", *args]) == 2
    err = capsys.readouterr().err
    rule = "the test split; recipe selection reads the validation split, and only the final report reads test"
    assert f"on-test.yaml: s2: eval_prompts {world / 'test.jsonl'}: {rule}" in err, err
    assert f"--validation-prompts {world / 'test.jsonl'}: {rule}" in err, err
    assert spawned == [] and sorted(tmp_path.iterdir()) == []


def test_a_final_report_needs_its_recipes_choices_on_record_on_validation(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], spawned: list[list[str]]
) -> None:
    grid = ["grid", "--seeds", "0", "--threads", "1", "--final-report"]
    assert robustness.main([*grid, *_args(world, tmp_path)]) == 2  # the curriculum names no choice
    assert "curriculum.choices (curriculum.yaml): empty; a final report needs the tuning records" in (
        capsys.readouterr().err
    )
    out = str(world / "records.json")  # the report's own records named as a choice
    assert robustness.main([*grid, *_args(world, tmp_path, curriculum="chosen-on-out.yaml", out=out)]) == 2
    err = capsys.readouterr().err
    assert "curriculum.choices (chosen-on-out.yaml): records.json: is --out; the final report's records" in err, err
    assert spawned == [] and sorted(tmp_path.iterdir()) == []
    # Choices on record on validation: the runs start, each told it is the final report.
    assert robustness.main([*grid, *_args(world, tmp_path, curriculum="chosen.yaml")]) == 0
    assert [cmd[cmd.index("--seed") + 1] for cmd in spawned] == ["0"] and "--final-report" in spawned[0]
