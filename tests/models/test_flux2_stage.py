"""FLUX.2 in the pipeline, on a tiny Flux2Pipeline built offline: a stage on a saved directory trains its
LoRA (exported for a plain Flux2Pipeline) or every weight (exported as a whole pipeline), and a killed stage
resumes to the weights of the uninterrupted one, bit for bit."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tiny_world import KillAt, Killed
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny_flux2 import tiny_flux2_pipeline


@pytest.fixture(scope="module")
def f2_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """World prompt files and a tiny FLUX.2 pipeline (its byte-level tokenizer reads any prompt)."""
    from vgrpo.world import make_splits, write_jsonl

    root = tmp_path_factory.mktemp("flux2-world")
    train, test = make_splits(0, 12, 2)
    write_jsonl(root / "train.jsonl", [md for md, _ in train])
    write_jsonl(root / "test.jsonl", [md for md, _ in test])
    tiny_flux2_pipeline(seed=0).save_pretrained(root / "base")
    return root


def _stage_config(**overrides: Any) -> Any:
    from tests.tiny_world import WORLD_PICK
    from vgrpo.config import StageConfig

    data: dict[str, Any] = {
        "name": "flux2-tiny",
        "prompts": "train.jsonl",
        "iterations": 2,
        "checkpoint_every": 1,
        "rollout": {
            "prompts_per_iteration": 2,
            "group_size": 3,
            "num_steps": 3,
            "shift": None,
            "dynamic_shift": True,
            "resolution": 16,
            "micro_batch_size": 6,
        },
        "optim": {"lr": 1e-2, "micro_batch_size": 6},
        "algorithm": {"name": "vgrpo", "n_mc": 2},
        "lora": {"rank": 4, "alpha": 8, "target_modules": list(FAMILIES["flux2"].lora_targets)},
        "rewards": [{"name": "pickscore", "options": {"path": str(WORLD_PICK)}}],
        "eval_prompts": "test.jsonl",
        "evaluation": {"group_size": 1, "num_steps": 2, "shift": "dynamic", "rewards": [{"name": "geneval"}]},
    }
    return StageConfig.model_validate(data | overrides)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_run_stage_trains_a_saved_flux2_pipeline(f2_world: Path, lora: bool) -> None:
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    from vgrpo.checkpoints.state import LORA_FILE
    from vgrpo.models.pipeline import load_pipeline
    from vgrpo.training.stage import run_stage

    out = f2_world / f"out-{lora}"
    config = _stage_config(**({} if lora else {"lora": None, "optim": {"lr": 1e-3, "micro_batch_size": 6}}))
    result = run_stage(config, pipeline_dir=Path("base"), work_dir=f2_world / f"run-{lora}", out_dir=out, root=f2_world)
    assert len(result.history) == 2 and all(math.isfinite(h["train/loss"]) for h in result.history)
    # The evaluation samples at FLUX.2's shift for its own 2 steps (the rollouts' 3 steps give another one).
    final, rollout_shift = result.evaluations[-1], math.exp(compute_empirical_mu(16, 3))
    assert final["iteration"] == 2 and final["sampling"]["shift"] == pytest.approx(
        math.exp(compute_empirical_mu(16, 2))
    )
    assert final["sampling"]["shift"] == pytest.approx(7.1020, abs=1e-4) and rollout_shift == pytest.approx(
        7.0484, abs=1e-4
    )
    base = Flux2Pipeline.from_pretrained(f2_world / "base", local_files_only=True)
    if lora:
        assert (out / LORA_FILE).is_file()
        base.load_lora_weights(out)  # the export loads in a plain diffusers script
        assert any("lora" in name for name, _ in base.transformer.named_parameters())
        return
    trained = load_pipeline(out)  # full fine-tuning exports a whole pipeline the loader reads
    assert isinstance(trained, Flux2Pipeline)
    a, b = base.transformer.state_dict(), trained.transformer.state_dict()
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)


def test_a_killed_flux2_stage_resumes_to_the_same_weights(f2_world: Path) -> None:
    from safetensors.torch import load_file

    from vgrpo.training.stage import run_stage

    config = _stage_config(eval_prompts=None)
    run_stage(
        config, pipeline_dir=Path("base"), work_dir=f2_world / "whole", out_dir=f2_world / "whole_lora", root=f2_world
    )
    with pytest.raises(Killed):
        run_stage(
            config,
            pipeline_dir=Path("base"),
            work_dir=f2_world / "cut",
            out_dir=f2_world / "cut_lora",
            root=f2_world,
            callbacks=KillAt(1),
        )
    resumed = run_stage(
        config, pipeline_dir=Path("base"), work_dir=f2_world / "cut", out_dir=f2_world / "cut_lora", root=f2_world
    )
    assert resumed.resumed_from == 1
    a = load_file(f2_world / "whole_lora" / "pytorch_lora_weights.safetensors")
    b = load_file(f2_world / "cut_lora" / "pytorch_lora_weights.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert any(bool(a[k].abs().max() > 0) for k in a if "lora_B" in k)  # trained: B left its zero init
