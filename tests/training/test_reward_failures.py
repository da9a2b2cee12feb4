"""A reward that misbehaves at run time (raises, returns the wrong count, strings or None) stops the stage with one line
naming the reward, the iteration and what it returned or raised, and leaves every checkpoint as it was; a rerun with
the reward fixed resumes from the last one. A reward returning NaN skips iterations, then the stage diverges (exit 3)
naming the reward and how many of its scores were not finite. The rewards are tests/rewards/misbehaving.py's."""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.rewards import misbehaving
from tests.tiny_world import tiny_stage_config, write_tiny_world
from vgrpo.cli import main
from vgrpo.config import StageConfig
from vgrpo.errors import UserError
from vgrpo.rewards.base import RewardFailed, TransientRewardError, TransientRewardFailed
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward
from vgrpo.trainer import Trainer
from vgrpo.training.guards import TrainingDiverged
from vgrpo.training.stage import StageCallbacks, StageRewardFailed

MODULE = "tests.rewards.misbehaving"
SAMPLES = 8  # 2 prompts x group_size 4: the count a reward is asked for


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("reward-failures"), n_train=8, n_test=2)


def _line(marker: str) -> int:
    """The line of tests/rewards/misbehaving.py that carries ``# marker``."""
    lines = inspect.getsource(misbehaving).splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(f"# {marker}"))


def _config(reward: str, **overrides: Any) -> StageConfig:
    """A stage training on ``tests.rewards.misbehaving:REWARD`` alone, without evaluation."""
    data: dict[str, Any] = {
        "iterations": 1,
        "rewards": [{"name": f"{MODULE}:{reward}"}],
        "eval_prompts": None,
        **overrides,
    }
    return tiny_stage_config(**data)


# reward -> (exit code, iterations, what the one line says besides the stage, the reward and its import name)
CASES: dict[str, tuple[int, int, list[str]]] = {
    "raises": (
        2,
        1,
        [
            "iteration 0:",
            "raised ZeroDivisionError: integer division or modulo by zero at ",
            f"tests/rewards/misbehaving.py:{_line('RAISES HERE')}",
            "no checkpoint was written yet",
        ],
    ),
    "wrong_count": (2, 1, ["iteration 0:", f"returned ndarray of shape (7,), expected ({SAMPLES},) numbers: array(["]),
    "strings": (2, 1, ["iteration 0:", "returned list ['", f"], expected ({SAMPLES},) numbers"]),
    "nothing": (2, 1, ["iteration 0:", f"returned NoneType None, expected ({SAMPLES},) numbers"]),
    "nan_scores": (
        3,
        2,
        [
            "2 consecutive iterations skipped",
            f"reward/nan_scores at iterations [0, 1]: {SAMPLES} of {SAMPLES} non-finite each",
            "checkpoints/iter-1, is intact",  # iteration 1 diverged before its checkpoint
        ],
    ),
}


def _expected(reward: str) -> list[str]:
    code, _, parts = CASES[reward]
    named = [] if code == 3 else [f"reward '{reward}' ({MODULE}:{reward})"]
    return ["stage tiny", *named, *parts]


@pytest.mark.parametrize("reward", list(CASES))
def test_the_cli_prints_one_line_naming_the_reward_the_iteration_and_what_it_did(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], reward: str
) -> None:
    code, iterations, _ = CASES[reward]
    stage = _config(reward, iterations=iterations, max_consecutive_skips=2).model_dump(mode="json")
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage | {"pipeline": "base"}))
    argv = ["train", "--params", str(tmp_path / "stage.yaml"), "--root", str(world), "--out", str(tmp_path / "out")]
    assert main([*argv, "--work-dir", str(tmp_path / "work")]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    for part in _expected(reward):
        assert part in errors[0], (part, errors[0])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("reward", list(CASES))
def test_the_trainer_raises_the_same_message(world: Path, tmp_path: Path, reward: str) -> None:
    code, iterations, _ = CASES[reward]
    config = _config(reward, iterations=iterations, max_consecutive_skips=2)
    trainer = Trainer(config, work_dir=tmp_path / "work", pipeline=Path("base"), out_dir=tmp_path / "out", root=world)
    expected = TrainingDiverged if code == 3 else StageRewardFailed
    with pytest.raises(expected) as raised:
        trainer.train()
    message = str(raised.value)
    assert "\n" not in message
    for part in _expected(reward):
        assert part in message, (part, message)
    if code == 2:
        failure = raised.value
        assert isinstance(failure, StageRewardFailed) and isinstance(failure, UserError)
        assert (failure.reward, failure.source, failure.iteration) == (reward, f"{MODULE}:{reward}", 0)
        assert isinstance(failure.__cause__, RewardFailed)  # the reward set's, chained to the reward's own error
    if reward == "raises":
        cause = raised.value.__cause__
        assert cause is not None and isinstance(cause.__cause__, ZeroDivisionError)  # the bug's traceback is kept


class _BreakAfter(StageCallbacks):
    """Breaks the reward (creates its flag file) once checkpoint ``iteration`` is written, and keeps that
    checkpoint's bytes."""

    def __init__(self, iteration: int, flag: Path) -> None:
        self.iteration, self.flag = iteration, flag
        self.written: dict[str, bytes] = {}

    def on_checkpoint(self, path: Path, iteration: int) -> None:
        if iteration == self.iteration:
            self.written = {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}
            self.flag.touch()


def test_a_failure_leaves_the_checkpoints_intact_and_a_rerun_with_the_reward_fixed_resumes(
    world: Path, tmp_path: Path
) -> None:
    flag = tmp_path / "server-down"
    config = tiny_stage_config(
        iterations=3,
        keep_checkpoints=3,
        eval_prompts=None,
        rewards=[{"name": f"{MODULE}:broken_while_flagged", "options": {"flag": str(flag)}}],
    )
    broken = _BreakAfter(2, flag)

    def trainer(callbacks: StageCallbacks | None = None) -> Trainer:
        work, out = tmp_path / "work", tmp_path / "out"
        return Trainer(config, work_dir=work, pipeline=Path("base"), out_dir=out, root=world, callbacks=callbacks)

    with pytest.raises(StageRewardFailed) as raised:
        trainer(broken).train()
    checkpoints = tmp_path / "work" / "checkpoints"
    message = str(raised.value)
    for part in [
        "stage tiny, iteration 2: reward 'broken_while_flagged'",
        "raised RuntimeError: broken while server-down exists at ",
        f"tests/rewards/misbehaving.py:{_line('FLAGGED HERE')}",
        f"the last checkpoint, {checkpoints / 'iter-2'}, is intact and the stage resumes from it when rerun",
    ]:
        assert part in message, (part, message)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["iter-1", "iter-2"]  # no partial iter-3
    assert broken.written and broken.written == {
        p.name: p.read_bytes() for p in sorted((checkpoints / "iter-2").iterdir()) if p.is_file()
    }
    assert not (tmp_path / "out").exists()

    flag.unlink()  # the reward is fixed: the same reward, so the checkpoint's fingerprint matches
    result = trainer().train()
    assert result.resumed_from == 2 and len(result.history) == 3
    assert [h["guard/skipped"] for h in result.history] == [0.0, 0.0, 0.0]
    assert (tmp_path / "out" / "pytorch_lora_weights.safetensors").is_file()


def test_an_evaluation_reward_that_fails_names_the_evaluation_and_its_iteration(world: Path, tmp_path: Path) -> None:
    config = tiny_stage_config(
        iterations=1,
        rewards=[{"name": f"{MODULE}:broken_while_flagged"}],
        evaluation={"group_size": 1, "num_steps": 2, "rewards": [{"name": f"{MODULE}:strings"}]},
        eval_at_start=False,
    )
    trainer = Trainer(config, work_dir=tmp_path / "work", pipeline=Path("base"), out_dir=tmp_path / "out", root=world)
    with pytest.raises(StageRewardFailed) as raised:
        trainer.train()
    message = str(raised.value)
    for part in [
        "stage tiny, evaluation at iteration 1: reward 'strings'",
        "returned list ['",
        f"the last checkpoint, {tmp_path / 'work' / 'checkpoints' / 'iter-1'}, is intact",
    ]:
        assert part in message, (part, message)


def test_an_unreachable_reward_server_is_named_in_one_line_and_still_retried() -> None:
    """The Prefect score phase retries a TransientRewardError (tasks.phase_tasks.is_transient); once the retries are
    spent it is a one-line UserError too."""
    rewards = MultiReward.from_configs([RewardConfig(name=f"{MODULE}:unreachable", key="judge")])
    with pytest.raises(TransientRewardFailed) as raised:
        rewards(np.zeros((2, 8, 8, 3), np.uint8), ["a", "b"])
    failure = raised.value
    assert isinstance(failure, TransientRewardError) and isinstance(failure, UserError)
    message = str(failure)  # the file relative to the working directory, when under it
    assert message.startswith(
        f"reward 'judge' ({MODULE}:unreachable) raised TransientRewardError: POST http://127.0.0.1:9/score failed "
        "after 3 attempt(s); last: ConnectionError at "
    ), message
    assert message.endswith(f"tests/rewards/misbehaving.py:{_line('UNREACHABLE HERE')}"), message
    copy = pickle.loads(pickle.dumps(failure))  # a task runner may ship it between processes
    assert type(copy) is TransientRewardFailed and str(copy) == str(failure) and copy.reward == "judge"
