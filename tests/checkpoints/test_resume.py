"""A checkpoint's state as a typed value: it is written as the same JSON bytes the stage wrote before it was typed,
checkpoints written then still resume, and one whose state lacks a field or holds the wrong type is set aside
with a message naming the file and the field."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from vgrpo.checkpoints.resume import ResumableRun, TrainingState
from vgrpo.checkpoints.state import Checkpointed, save_training_state
from vgrpo.parallel.distributed import Distributed

OLD_STATE = Path(__file__).with_name("state_4baa1d5.json")
"""A ``state.json`` as the stage wrote it before its state was typed (main at 4baa1d5): the tiny stage, its
iteration 1 skipped for a NaN PickScore and the run killed during iteration 2, with an MLflow run id."""
FINGERPRINT = "6ad1f8b9ec0ec437"  # the fingerprint OLD_STATE was stamped with


def _live(seed: int) -> Checkpointed:
    """A module and an optimizer that has taken a step: what a checkpoint's tensors hold (values set by seed)."""
    torch.manual_seed(seed)
    module = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
    module(torch.randn(4, 3)).square().sum().backward()
    optimizer.step()
    return Checkpointed(module, optimizer, {})


def _checkpoint(root: Path, iteration: int, state: Any) -> None:
    """``root/iter-<iteration>``: :func:`_live` (seeded by the iteration)'s tensors and ``state`` (JSON-able, or
    text) as its ``state.json``."""
    path = root / f"iter-{iteration}"
    save_training_state(path, _live(iteration), {})
    (path / "state.json").write_text(state if isinstance(state, str) else json.dumps(state, indent=2, sort_keys=True))


def _tensors(live: Checkpointed) -> list[torch.Tensor]:
    """The weights and the optimizer's state (each parameter's by key: a loaded state keeps the file's order)."""
    moments = [s[k].clone() for s in live.optimizer.state.values() for k in sorted(s)]
    return [p.detach().clone() for p in live.module.parameters()] + moments


HISTORY = [
    {"iteration": 0.0, "reward/total_mean": 0.123456789012345, "guard/skipped": 0.0, "time/iteration_s": 1.5},
    {"iteration": 1.0, "guard/skipped": 1.0, "guard/consecutive_skips": 1.0},
]
EVALUATIONS = [{"iteration": 0, "rewards": {"geneval": {"geneval_strict": 0.25}}, "per_prompt": {"prompt": ["a b"]}}]
SKIPPED = [
    {"iteration": 1, "quantity": "reward/pickscore", "reward_errors": ["nan"], "count": 1, "of": 8, "consecutive": 1}
]


@pytest.mark.parametrize(
    ("init_lora", "init_hash", "run_state"),
    [(None, None, None), (Path("runs/stages/s1"), "0123456789abcdef", {"mlflow_run_id": "abc"})],
)
def test_a_saved_state_is_the_json_the_stage_wrote_before_it_was_typed(
    tmp_path: Path, init_lora: Path | None, init_hash: str | None, run_state: dict[str, str] | None
) -> None:
    # What run_stage and ResumableRun.save wrote before: the stage's dict, stamped with the iteration and the run.
    kept = {
        "init_lora": str(init_lora),
        "history": HISTORY,
        "evaluations": EVALUATIONS,
        "skipped": SKIPPED,
        "consecutive_skips": 1,
        "run": dict(run_state or {}),
    }
    stamped = {**kept, "iteration": 2, "config_hash": FINGERPRINT, "init_lora_hash": init_hash}
    before = json.dumps(stamped, indent=2, sort_keys=True)

    state = TrainingState(
        iteration=2,
        init_lora=str(init_lora),
        history=tuple(HISTORY),
        evaluations=tuple(EVALUATIONS),
        skipped=tuple(SKIPPED),
        consecutive_skips=1,
        run=dict(run_state or {}),
    )
    run = ResumableRun(tmp_path, FINGERPRINT, init_hash, keep=2)
    assert (run.save(state, _live(0)) / "state.json").read_text() == before
    assert TrainingState.from_json(json.loads(before)) == state
    assert run.peek() == state
    assert run.restore(_live(1), Distributed()) == state


def test_a_checkpoint_written_before_the_state_was_typed_resumes_and_saves_back_the_same_bytes(tmp_path: Path) -> None:
    old = OLD_STATE.read_text()
    _checkpoint(tmp_path / "old", 2, old)
    run = ResumableRun(tmp_path / "old", FINGERPRINT, None, keep=2)
    live = _live(7)
    state = run.restore(live, Distributed())
    assert state is not None and run.peek() == state
    assert (state.iteration, state.init_lora, state.consecutive_skips) == (2, "None", 1)
    assert state.run == {"mlflow_run_id": "0123abcd"}
    assert [h["guard/skipped"] for h in state.history] == [0.0, 1.0]
    assert [e["iteration"] for e in state.evaluations] == [0, 2]
    assert [(e["iteration"], e["quantity"]) for e in state.skipped] == [(1, "reward/pickscore")]
    assert all(torch.equal(a, b) for a, b in zip(_tensors(live), _tensors(_live(2)), strict=True))
    again = ResumableRun(tmp_path / "again", FINGERPRINT, None, keep=2).save(state, _live(0))
    assert (again / "state.json").read_text() == old


def test_a_state_from_before_the_non_finite_guards_resumes_with_no_skips(tmp_path: Path) -> None:
    """Checkpoints written before the stage kept its skips and the caller's run state lack those keys."""
    old = json.loads(OLD_STATE.read_text())
    for key in ("skipped", "consecutive_skips", "run"):
        del old[key]
    _checkpoint(tmp_path, 2, old)
    state = ResumableRun(tmp_path, FINGERPRINT, None, keep=2).restore(_live(7), Distributed())
    assert state is not None and (state.skipped, state.consecutive_skips, state.run) == ((), 0, {})


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda state: state.update({key: value})


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda state: state.pop("history"), r"iter-2/state.json: no field 'history'"),
        (lambda state: state.pop("iteration"), r"iter-2/state.json: no field 'iteration'"),
        (_set("history", "[]"), r"iter-2/state.json: field 'history' is a string, expected a list"),
        (_set("iteration", "2"), r"iter-2/state.json: field 'iteration' is a string, expected an integer"),
        (_set("iteration", True), r"iter-2/state.json: field 'iteration' is a boolean, expected an integer"),
        (_set("consecutive_skips", 1.0), r"field 'consecutive_skips' is a number, expected an integer"),
        (_set("evaluations", [1.5]), r"iter-2/state.json: field 'evaluations'\[0\] is a number, expected an object"),
        (_set("skipped", None), r"iter-2/state.json: field 'skipped' is null, expected a list"),
        (_set("run", []), r"iter-2/state.json: field 'run' is a list, expected an object"),
        (_set("init_lora", None), r"iter-2/state.json: field 'init_lora' is null, expected a string"),
    ],
)
def test_a_checkpoint_whose_state_lacks_a_field_or_has_a_wrong_type_is_set_aside(
    tmp_path: Path, spoil: Callable[[dict[str, Any]], Any], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    older, newer = json.loads(OLD_STATE.read_text()), json.loads(OLD_STATE.read_text())
    older["iteration"] = 1
    spoil(newer)
    _checkpoint(tmp_path, 1, older)
    _checkpoint(tmp_path, 2, newer)
    run = ResumableRun(tmp_path, FINGERPRINT, None, keep=2)
    assert run.peek() == TrainingState.from_json(older)  # what the restore below resumes
    live = _live(7)
    with caplog.at_level(logging.WARNING, logger="vgrpo"):
        state = run.restore(live, Distributed())
    moved = rf"; moved to {re.escape(str(tmp_path / '.corrupt-iter-2'))}; "
    resumes = rf"the stage resumes from the older checkpoint {re.escape(str(tmp_path / 'iter-1'))} \(iteration 1\)"
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert re.search(message + ".*" + moved + resumes, caplog.records[0].getMessage())
    assert state == TrainingState.from_json(older)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(live), _tensors(_live(1)), strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".corrupt-iter-2", "iter-1"]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("{", r"state.json: unreadable \(JSONDecodeError"),
        ([], r"state.json: is a list, expected an object"),
        ({"iteration": 2, "config_hash": FINGERPRINT, "init_lora_hash": None}, r"state.json: no field 'init_lora'"),
    ],
)
def test_a_malformed_state_changes_no_weight_and_the_stage_starts_over(
    tmp_path: Path, state: Any, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    _checkpoint(tmp_path, 2, state)
    run = ResumableRun(tmp_path, FINGERPRINT, None, keep=2)
    assert run.peek() is None
    live = _live(7)
    before = _tensors(live)
    with caplog.at_level(logging.WARNING, logger="vgrpo"):
        assert run.restore(live, Distributed()) is None
    assert re.search(message + ".*; the stage starts over from iteration 0", caplog.text)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(live), before, strict=True))
    assert (tmp_path / ".corrupt-iter-2").is_dir()
