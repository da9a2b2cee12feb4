"""What a user must be told reaches the console of ``vgrpo train`` at its default verbosity, as a WARNING line on
stderr: a checkpoint set aside as corrupt and what the stage resumes from instead (an older checkpoint, or iteration
0), and an iteration skipped for a reward's NaN scores (docs/reliability.md). The command runs in a process of its
own, so that its logging is set up as a user's is (in-process, pytest's handlers on the root logger would take the
place of the command's)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.tiny_world import tiny_stage_config, write_tiny_world
from vgrpo.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny world, a two-iteration stage's params (``stage.yaml``) and its checkpoints ``work/checkpoints/iter-1``
    and ``iter-2``."""
    root = write_tiny_world(tmp_path_factory.mktemp("console"), n_train=8, n_test=2)
    stage = tiny_stage_config(iterations=2, eval_prompts=None).model_dump(mode="json") | {"pipeline": "base"}
    (root / "stage.yaml").write_text(yaml.safe_dump(stage))
    Trainer.from_params(root / "stage.yaml", work_dir=root / "work", out_dir=root / "first", root=root).train()
    return root


def _train(world: Path, params: Path, work: Path) -> tuple[list[str], str]:
    """``vgrpo train`` at the default verbosity in its own process: its ``WARNING`` lines on stderr, and stderr."""
    argv = ["train", "--params", str(params), "--root", str(world), "--work-dir", str(work), "--out", str(work / "out")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the NaN reward is tests.rewards.misbehaving's
    done = subprocess.run(
        [sys.executable, "-m", "vgrpo.cli", *argv], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("WARNING vgrpo")], done.stderr


def _spoil(checkpoint: Path, key: str, value: object = None) -> None:
    """Set ``key`` of the checkpoint's ``state.json`` to ``value``, or drop it when ``value`` is None."""
    state = json.loads((checkpoint / "state.json").read_text())
    if value is None:
        del state[key]
    else:
        state[key] = value
    (checkpoint / "state.json").write_text(json.dumps(state))


def test_a_corrupt_only_checkpoint_is_reported_with_where_it_went_and_the_start_over(
    world: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "work" / "checkpoints"
    shutil.copytree(world / "work", tmp_path / "work")
    shutil.rmtree(checkpoints / "iter-1")
    _spoil(checkpoints / "iter-2", "iteration", "one")
    warnings, stderr = _train(world, world / "stage.yaml", tmp_path / "work")
    assert len(warnings) == 1, stderr
    for part in [
        f"{checkpoints / 'iter-2' / 'state.json'}: field 'iteration' is a string, expected an integer",
        f"moved to {checkpoints / '.corrupt-iter-2'}",
        "the stage starts over from iteration 0",
    ]:
        assert part in warnings[0], (part, warnings[0])
    assert (checkpoints / ".corrupt-iter-2").is_dir()


def test_a_resume_from_an_older_checkpoint_than_the_newest_is_reported(world: Path, tmp_path: Path) -> None:
    checkpoints = tmp_path / "work" / "checkpoints"
    shutil.copytree(world / "work", tmp_path / "work")
    _spoil(checkpoints / "iter-2", "history")
    warnings, stderr = _train(world, world / "stage.yaml", tmp_path / "work")
    assert len(warnings) == 1, stderr
    for part in [
        f"{checkpoints / 'iter-2' / 'state.json'}: no field 'history'",
        f"moved to {checkpoints / '.corrupt-iter-2'}",
        f"the stage resumes from the older checkpoint {checkpoints / 'iter-1'} (iteration 1)",
    ]:
        assert part in warnings[0], (part, warnings[0])
    assert "resumed from the checkpoint of iteration 1" in stderr


def test_an_iteration_skipped_for_a_rewards_nan_scores_is_reported(world: Path, tmp_path: Path) -> None:
    stage = yaml.safe_load((world / "stage.yaml").read_text())
    stage |= {"iterations": 1, "rewards": [{"name": "tests.rewards.misbehaving:nan_scores"}]}
    (tmp_path / "nan.yaml").write_text(yaml.safe_dump(stage))
    warnings, stderr = _train(world, tmp_path / "nan.yaml", tmp_path / "work")
    assert len(warnings) == 1, stderr
    for part in ["stage tiny, iteration 0 skipped (no update applied)", "non-finite reward/nan_scores, 8 of 8 values"]:
        assert part in warnings[0], (part, warnings[0])
