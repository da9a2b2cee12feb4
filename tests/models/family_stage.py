"""What the model families' stage tests share: a world folder beside a saved tiny pipeline, a two-iteration stage
config, the export check (a plain diffusers pipeline loads the LoRA; full fine-tuning exports a whole pipeline) and
the kill-and-resume check (bit-identical LoRA weights)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models.family_training import tiny_rollout
from tests.tiny_world import KillAt, Killed
from vgrpo.models.registry import FAMILIES


def world_with_pipeline(root: Path, build: Callable[[list[str]], Any]) -> Path:
    """``root`` with the world's train and test prompt files (12 and 2 prompts) and the pipeline ``build`` makes
    from their prompts (a tokenizer's corpus) saved as ``base``."""
    from vgrpo.world import make_splits, write_jsonl

    train, test = make_splits(0, 12, 2)
    write_jsonl(root / "train.jsonl", [md for md, _ in train])
    write_jsonl(root / "test.jsonl", [md for md, _ in test])
    build([md["prompt"] for md, _ in train + test]).save_pretrained(root / "base")
    return root


def stage_config(
    family: str, *, shift: float | None = None, rollout: dict[str, Any] | None = None, **overrides: Any
) -> Any:
    """A two-iteration V-GRPO stage on ``family``'s LoRA targets (2 prompts x 3 samples, 3 steps at 16 px), scored by
    the world's PickScore and evaluated by GenEval at 2 steps. ``shift``: the static sigma shift of rollouts and
    evaluation, or None for the pipeline's dynamic one; ``rollout`` updates the rollout section, ``overrides`` the
    top level."""
    from tests.tiny_world import WORLD_PICK
    from vgrpo.config import StageConfig

    data: dict[str, Any] = {
        "name": f"{family}-tiny",
        "prompts": "train.jsonl",
        "iterations": 2,
        "checkpoint_every": 1,
        "rollout": tiny_rollout(shift) | (rollout or {}),
        "optim": {"lr": 1e-2, "micro_batch_size": 6},
        "algorithm": {"name": "vgrpo", "n_mc": 2},
        "lora": {"rank": 4, "alpha": 8, "target_modules": list(FAMILIES[family].lora_targets)},
        "rewards": [{"name": "pickscore", "options": {"path": str(WORLD_PICK)}}],
        "eval_prompts": "test.jsonl",
        "evaluation": {
            "group_size": 1,
            "num_steps": 2,
            "shift": "dynamic" if shift is None else shift,
            "rewards": [{"name": "geneval"}],
        },
    }
    return StageConfig.model_validate(data | overrides)


def full_fine_tuning(config: Any) -> Any:
    """``config`` training every transformer weight (at a tenth of the LoRA's rate) instead of a LoRA."""
    return config.model_copy(update={"lora": None, "optim": config.optim.model_copy(update={"lr": 1e-3})})


def run_two_iterations(world: Path, config: Any, tag: str) -> Any:
    """``config``'s stage on ``world/base`` (work in ``run-<tag>``, export to ``out-<tag>``), checked to have run
    two finite iterations."""
    from vgrpo.training.stage import run_stage

    result = run_stage(
        config, pipeline_dir=Path("base"), work_dir=world / f"run-{tag}", out_dir=world / f"out-{tag}", root=world
    )
    assert len(result.history) == 2 and all(math.isfinite(h["train/loss"]) for h in result.history)
    assert result.evaluations == [] or result.evaluations[-1]["iteration"] == 2
    return result


def spy_on_forward(
    monkeypatch: pytest.MonkeyPatch, velocity_class: type, see: Callable[[torch.Tensor, Any], Any]
) -> list[Any]:
    """Patches ``velocity_class.forward`` to record ``see(latents, cond)`` on every call (rollout, update and
    evaluation alike) before it runs; returns the list the records go to."""
    seen: list[Any] = []
    forward = velocity_class.forward

    def spying(self: Any, latents: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        seen.append(see(latents, cond))
        return forward(self, latents, t, cond)

    monkeypatch.setattr(velocity_class, "forward", spying)
    return seen


def assert_export_loads(world: Path, tag: str, pipeline_class: Any, *, lora: bool) -> None:
    """``out-<tag>`` is a LoRA the family's plain diffusers pipeline loads, or (full fine-tuning) a whole pipeline
    of that class whose transformer differs from the base's."""
    from vgrpo.checkpoints.state import LORA_FILE
    from vgrpo.models.pipeline import load_pipeline

    out = world / f"out-{tag}"
    base = pipeline_class.from_pretrained(world / "base", local_files_only=True)
    if lora:
        assert (out / LORA_FILE).is_file()
        base.load_lora_weights(out)  # the export loads in a plain diffusers script
        assert any("lora" in name for name, _ in base.transformer.named_parameters())
        return
    trained = load_pipeline(out)  # full fine-tuning exports a whole pipeline the loader reads
    assert isinstance(trained, pipeline_class)
    a, b = base.transformer.state_dict(), trained.transformer.state_dict()
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)


def assert_killed_stage_resumes(world: Path, config: Any) -> None:
    """``config`` run whole, and killed after its first iteration then run again: the second resumes from
    iteration 1 and exports the same LoRA weights, bit for bit, away from their zero init."""
    from safetensors.torch import load_file

    from vgrpo.checkpoints.state import LORA_FILE
    from vgrpo.training.stage import run_stage

    def run(tag: str, **kwargs: Any) -> Any:
        return run_stage(
            config, pipeline_dir=Path("base"), work_dir=world / tag, out_dir=world / f"{tag}-lora", root=world, **kwargs
        )

    run("whole")
    with pytest.raises(Killed):
        run("cut", callbacks=KillAt(1))
    assert run("cut").resumed_from == 1
    a, b = load_file(world / "whole-lora" / LORA_FILE), load_file(world / "cut-lora" / LORA_FILE)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert any(bool(a[k].abs().max() > 0) for k in a if "lora_B" in k)  # trained: B left its zero init


# The newer families' recipe precision (params/models/flux2.yaml, qwen-image.yaml): bf16 autocast over a bf16 LoRA
# base, gradient checkpointing, the text encoders dropped once the stage's prompts are encoded.
RECIPE_PRECISION = {
    "autocast": "bf16",
    "lora_base_dtype": "bf16",
    "gradient_checkpointing": True,
    "text_encoders": "drop_after_encoding",
}


def assert_trains_at_recipe_precision(world: Path, config: Any, pipeline_class: Any) -> None:
    """``config``'s LoRA stage at :data:`RECIPE_PRECISION` on the device the stage picks (CUDA where there is one,
    as in the GPU check): two finite iterations, LoRA weights that left their zero init, an export the family's
    plain diffusers pipeline loads, and on CUDA, memory the CUDA allocator handed out."""
    from safetensors.torch import load_file

    from vgrpo.checkpoints.state import LORA_FILE

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    data = config.model_dump(mode="json") | {"precision": RECIPE_PRECISION}
    run_two_iterations(world, type(config).model_validate(data), "recipe-precision")
    if torch.cuda.is_available():
        assert torch.cuda.max_memory_allocated() > 0
    weights = load_file(world / "out-recipe-precision" / LORA_FILE)
    assert all(v.dtype == torch.float32 for v in weights.values())  # trained in fp32 over the bf16 base
    assert any(bool(weights[k].abs().max() > 0) for k in weights if "lora_B" in k)
    assert_export_loads(world, "recipe-precision", pipeline_class, lora=True)
