"""Fault injection: a stage SIGKILLed at any point and started again ends exactly where an uninterrupted run
ends (bit-identical adapter, same history and evaluation on CPU); a half-written checkpoint is never loaded."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.tiny_world import tiny_stage_config as _config
from tests.tiny_world import write_tiny_world
from vgrpo.training.stage import StageResult, run_stage

ROOT = Path(__file__).resolve().parents[2]
LORA = "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("faults"))


def _untimed(result: StageResult) -> dict[str, Any]:
    history = [{k: v for k, v in h.items() if not k.startswith("time/")} for h in result.history]
    evaluations = [{k: v for k, v in e.items() if k != "seconds"} for e in result.evaluations]
    return json.loads(json.dumps({"history": history, "evaluations": evaluations}))


@pytest.fixture(scope="module")
def reference(world: Path) -> dict[str, Any]:
    result = run_stage(
        _config(), pipeline_dir=Path("base"), work_dir=world / "ref", out_dir=world / "ref-lora", root=world
    )
    return {"lora": (world / "ref-lora" / LORA).read_bytes(), **_untimed(result)}


def _killed_run(world: Path, name: str, fault: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "tests.fault_runner",
        str(world),
        str(world / name),
        str(world / f"{name}-lora"),
        "--fault",
        fault,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("fault", "resumes_from"),
    [
        ("rollout:2", 1),  # sampling iteration 1 (iteration 0 was checkpointed)
        ("update:3", 2),  # the gradient step of iteration 2
        ("checkpoint:5", 1),  # inside iteration 2's checkpoint write: its second file
        ("eval:1", 3),  # the final evaluation, after the last checkpoint and the export
    ],
)
def test_a_killed_stage_resumes_to_the_uninterrupted_result(
    world: Path, reference: dict[str, Any], fault: str, resumes_from: int
) -> None:
    name = "kill-" + fault.replace(":", "-")
    _killed_run(world, name, fault)
    exported = world / f"{name}-lora" / LORA  # the export precedes only the final evaluation, and is atomic
    assert exported.is_file() if fault.startswith("eval") else not exported.parent.exists()
    resumed = run_stage(
        _config(), pipeline_dir=Path("base"), work_dir=world / name, out_dir=world / f"{name}-lora", root=world
    )
    assert resumed.resumed_from == resumes_from
    assert (world / f"{name}-lora" / LORA).read_bytes() == reference["lora"]
    assert _untimed(resumed) == {k: reference[k] for k in ("history", "evaluations")}


def test_a_half_written_checkpoint_is_left_aside(world: Path) -> None:
    """The checkpoint killed mid-write is a hidden temporary directory; no iter-N directory holds a partial one."""
    _killed_run(world, "half", "checkpoint:2")  # iteration 0's checkpoint: one file of three written
    entries = sorted(p.name for p in (world / "half" / "checkpoints").iterdir())
    assert not any(e.startswith("iter-") for e in entries), entries
    assert any(e.startswith(".iter-1.tmp-") for e in entries), entries
    resumed = run_stage(
        _config(iterations=1),
        pipeline_dir=Path("base"),
        work_dir=world / "half",
        out_dir=world / "half-lora",
        root=world,
    )
    assert resumed.resumed_from == 0


def test_a_corrupt_checkpoint_is_set_aside_and_an_older_one_resumed(
    world: Path, reference: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(keep_checkpoints=3)
    run_stage(cfg, pipeline_dir=Path("base"), work_dir=world / "corrupt", out_dir=world / "corrupt-first", root=world)
    ckpts = world / "corrupt" / "checkpoints"
    weights = ckpts / "iter-3" / "trainable.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated, as by a full disk
    with caplog.at_level(logging.WARNING, logger="vgrpo"):
        resumed = run_stage(
            cfg, pipeline_dir=Path("base"), work_dir=world / "corrupt", out_dir=world / "corrupt-lora", root=world
        )
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "iter-3/trainable.safetensors: unreadable" in warned[0], warned
    assert f"the stage resumes from the older checkpoint {ckpts / 'iter-2'} (iteration 2)" in warned[0]
    assert resumed.resumed_from == 2
    assert (ckpts / ".corrupt-iter-3").is_dir()  # kept for inspection, never loaded again
    assert (world / "corrupt-lora" / LORA).read_bytes() == reference["lora"]
    assert _untimed(resumed) == {k: reference[k] for k in ("history", "evaluations")}


def test_old_checkpoints_and_dead_writers_temporaries_are_pruned(world: Path) -> None:
    ckpts = world / "prune" / "checkpoints"
    (ckpts / ".iter-7.tmp-999999").mkdir(parents=True)  # left by a writer killed mid-checkpoint
    (ckpts / "iter-50").mkdir()  # another run's checkpoint (other params): not ours to delete
    (ckpts / "iter-50" / "state.json").write_text(json.dumps({"config_hash": "other", "iteration": 50}))
    run_stage(
        _config(eval_prompts=None),
        pipeline_dir=Path("base"),
        work_dir=world / "prune",
        out_dir=world / "prune-lora",
        root=world,
    )
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter-2", "iter-3", "iter-50"]


def test_the_same_seed_and_params_give_the_same_rollouts_rewards_and_metrics(
    world: Path, reference: dict[str, Any]
) -> None:
    again = run_stage(
        _config(), pipeline_dir=Path("base"), work_dir=world / "again", out_dir=world / "again-lora", root=world
    )
    assert _untimed(again) == {k: reference[k] for k in ("history", "evaluations")}
    assert (world / "again-lora" / LORA).read_bytes() == reference["lora"]
    other = run_stage(
        _config(seed=1, iterations=1, eval_prompts=None),
        pipeline_dir=Path("base"),
        work_dir=world / "other",
        out_dir=world / "other-lora",
        root=world,
    )
    assert other.history[0]["reward/pickscore_mean"] != reference["history"][0]["reward/pickscore_mean"]
