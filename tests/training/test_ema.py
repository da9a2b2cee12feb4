"""The policy EMA: its decay schedule, that it never feeds back into training, that evaluation and export read it
(LoRA and full fine-tuning), and that a killed stage resumes it bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.tiny_world import KillAt, Killed, write_tiny_world
from tests.tiny_world import tiny_stage_config as _config
from vgrpo.config import StageConfig
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import trainable_parameters
from vgrpo.training.ema import EMAConfig, PolicyEMA
from vgrpo.training.phases import setup_policy
from vgrpo.training.stage import StageCallbacks, StageOptions, run_stage

EMA = {"enabled": True, "decay": 0.5, "warmup": False}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"))


def test_decay_warms_up_as_flow_grpo_and_updates_every_period() -> None:
    layer = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.0)
    ema = PolicyEMA(list(layer.parameters()), EMAConfig(enabled=True, decay=0.9, every=2))
    assert [ema.decay_at(n) for n in (0, 1, 2)] == [pytest.approx(1 / 10), pytest.approx(2 / 11), pytest.approx(3 / 12)]
    assert ema.decay_at(1000) == 0.9  # capped
    with torch.no_grad():
        layer.weight.fill_(1.0)
    assert ema.step(0) == {}  # iteration 0 does not close a period of 2
    assert torch.equal(ema.snapshot.values[0], torch.zeros(1, 2))
    assert ema.step(1) == {"ema/decay": pytest.approx(0.1)}  # update 0: 0.1 * 0 + 0.9 * 1
    torch.testing.assert_close(ema.snapshot.values[0], torch.full((1, 2), 0.9))
    with ema.swapped_in():
        torch.testing.assert_close(layer.weight.detach(), torch.full((1, 2), 0.9))
    assert torch.equal(layer.weight.detach(), torch.ones(1, 2))  # the live weights come back
    assert PolicyEMA(list(layer.parameters()), EMAConfig(decay=0.9, warmup=False)).decay_at(0) == 0.9


def test_ema_is_off_by_default_and_rejects_a_decay_of_one() -> None:
    assert not _config().ema.enabled
    with pytest.raises(ValueError, match="decay"):
        EMAConfig(decay=1.0)


class _Trainables(StageCallbacks):
    """Each checkpoint's trainable weights and snapshots, by iteration."""

    def __init__(self) -> None:
        self.trainable: dict[int, dict[str, torch.Tensor]] = {}
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def on_checkpoint(self, path: Path, iteration: int) -> None:
        self.trainable[iteration] = load_file(path / "trainable.safetensors")
        self.snapshots[iteration] = load_file(path / "snapshots.safetensors")


def _initial(config: StageConfig, world: Path) -> tuple[list[str], list[torch.Tensor]]:
    """The names and starting values of the stage's trainable parameters (the seeded LoRA)."""
    stage = setup_policy(config, world / "base", None, Distributed())
    names = [n for n, p in stage.transformer.named_parameters() if p.requires_grad]
    return names, [p.detach().clone() for p in trainable_parameters(stage.policy)]


def _run(config: StageConfig, world: Path, name: str, **kwargs: Any) -> Any:
    return run_stage(
        config, pipeline_dir=Path("base"), work_dir=world / name, out_dir=world / f"{name}-out", root=world, **kwargs
    )


def test_lora_ema_is_the_average_of_the_trained_weights_and_is_what_is_exported(world: Path) -> None:
    plain_cfg = _config(eval_prompts=None, keep_checkpoints=5)
    ema_cfg = _config(eval_prompts=None, keep_checkpoints=5, ema=EMA)
    plain, averaged = _Trainables(), _Trainables()
    _run(plain_cfg, world, "plain", callbacks=plain)
    _run(ema_cfg, world, "ema", callbacks=averaged)
    names, expected = _initial(ema_cfg, world)
    for it in (1, 2, 3):  # the EMA never feeds back: training takes the same steps bit for bit
        assert all(torch.equal(plain.trainable[it][k], averaged.trainable[it][k]) for k in names)
        expected = [0.5 * e + 0.5 * averaged.trainable[it][k] for e, k in zip(expected, names, strict=True)]
    snapshot = averaged.snapshots[3]
    for i, value in enumerate(expected):
        torch.testing.assert_close(snapshot[f"{PolicyEMA.SNAPSHOT_NAME}/{i}"], value, rtol=0, atol=1e-7)
    # the export is the EMA (loaded back into a fresh LoRA), not the live weights
    from vgrpo.checkpoints.state import load_lora_into

    stage = setup_policy(ema_cfg, world / "base", None, Distributed())
    load_lora_into(stage.transformer, world / "ema-out")
    exported = dict(stage.transformer.named_parameters())
    for i, k in enumerate(names):
        torch.testing.assert_close(exported[k].detach(), snapshot[f"{PolicyEMA.SNAPSHOT_NAME}/{i}"])
    assert not all(torch.equal(exported[k].detach(), averaged.trainable[3][k]) for k in names)


def test_in_stage_evaluation_reads_the_ema(world: Path) -> None:
    seen: dict[int, list[torch.Tensor]] = {}

    def runner(phase: str, iteration: int | None, fn: Any, /, *args: Any) -> Any:
        if phase != "evaluate":
            return fn(*args)
        stage, evaluator, it = args

        def recording(adapter: Any, policy: nn.Module, at: int) -> Any:
            seen[at] = [p.detach().clone() for p in trainable_parameters(policy)]
            return evaluator(adapter, policy, at)

        return fn(stage, recording, it)

    saved = _Trainables()
    cfg = _config(iterations=2, eval_every=1, keep_checkpoints=5, ema=EMA)
    result = _run(cfg, world, "eval-ema", callbacks=saved, options=StageOptions(phases=runner))
    assert [e["iteration"] for e in result.evaluations] == [0, 1, 2] and result.history[-1]["ema/decay"] == 0.5
    names, initial = _initial(cfg, world)
    assert all(torch.equal(a, b) for a, b in zip(seen[0], initial, strict=True))  # the EMA starts at the start
    for it in (1, 2):
        ema = [saved.snapshots[it][f"{PolicyEMA.SNAPSHOT_NAME}/{i}"] for i in range(len(names))]
        assert all(torch.equal(a, b) for a, b in zip(seen[it], ema, strict=True))
        assert not all(torch.equal(a, saved.trainable[it][k]) for a, k in zip(seen[it], names, strict=True))


def test_killed_stage_resumes_its_ema_bit_for_bit(world: Path) -> None:
    cfg = _config(eval_prompts=None, ema={"enabled": True, "decay": 0.7})

    _run(cfg, world, "whole")
    with pytest.raises(Killed):
        _run(cfg, world, "cut", callbacks=KillAt(1))
    assert _run(cfg, world, "cut").resumed_from == 1
    whole = (world / "whole-out" / "pytorch_lora_weights.safetensors").read_bytes()
    assert whole == (world / "cut-out" / "pytorch_lora_weights.safetensors").read_bytes()


def test_full_fine_tuning_exports_the_ema_pipeline(world: Path) -> None:
    cfg = _config(eval_prompts=None, iterations=2, lora=None, optim={"lr": 1e-4, "micro_batch_size": 8}, ema=EMA)
    saved = _Trainables()
    _run(cfg, world, "full", callbacks=saved)
    names, _ = _initial(cfg, world)
    from diffusers import SD3Transformer2DModel

    exported = dict(SD3Transformer2DModel.from_pretrained(world / "full-out" / "transformer").named_parameters())
    snapshot = saved.snapshots[2]
    for i, k in enumerate(names):
        torch.testing.assert_close(exported[k].detach(), snapshot[f"{PolicyEMA.SNAPSHOT_NAME}/{i}"])
    assert not all(torch.equal(exported[k].detach(), saved.trainable[2][k]) for k in names)
