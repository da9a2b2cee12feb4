"""FLUX.1-Kontext in the pipeline, on a tiny FluxKontextPipeline built offline: a stage whose prompt rows name source
images (relative to the prompt file) feeds them to every forward of the policy (rollout, update, evaluation), scores
the samples against them (source_similarity), exports a LoRA a plain FluxKontextPipeline loads, and a killed stage
resumes to bit-identical LoRA weights."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models.family_stage import assert_killed_stage_resumes, assert_trains_at_recipe_precision, stage_config
from vgrpo.models.tiny_flux_kontext import tiny_flux_kontext_pipeline, write_condition_image

PROMPTS = ("a photo of a red circle", "two blue squares", "a green triangle left of a yellow star")


@pytest.fixture(scope="module")
def edit_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prompt files whose rows name source images under ``images/``, and a tiny Kontext pipeline."""
    import json

    root = tmp_path_factory.mktemp("kontext-world")
    rows = []
    for i in range(4):
        write_condition_image(root / "images" / f"{i}.png", seed=i)
        rows.append({"prompt": PROMPTS[i % len(PROMPTS)], "image": f"images/{i}.png"})
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    tiny_flux_kontext_pipeline(seed=0).save_pretrained(root / "base")
    return root


def _stage_config(**overrides: Any) -> Any:
    similarity = [{"name": "source_similarity"}]
    evaluation = {"group_size": 1, "num_steps": 2, "shift": "dynamic", "rewards": similarity}
    return stage_config("flux-kontext", **({"rewards": similarity, "evaluation": evaluation} | overrides))


def test_a_kontext_stage_feeds_the_rows_source_images_to_every_forward_and_scores_against_them(
    edit_world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import FluxKontextPipeline

    from vgrpo.checkpoints.state import LORA_FILE
    from vgrpo.models.flux_kontext import FluxKontextVelocity
    from vgrpo.training.stage import run_stage

    seen: list[bool] = []
    forward = FluxKontextVelocity.forward

    def spying(self: Any, latents: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        seen.append(cond.image_latents is not None and cond.image_latents.shape[0] == latents.shape[0])
        return forward(self, latents, t, cond)

    monkeypatch.setattr(FluxKontextVelocity, "forward", spying)
    out = edit_world / "out"
    result = run_stage(
        _stage_config(), pipeline_dir=Path("base"), work_dir=edit_world / "run", out_dir=out, root=edit_world
    )
    assert len(result.history) == 2 and all(math.isfinite(h["train/loss"]) for h in result.history)
    assert all(-1.0 <= h["reward/source_similarity_raw_mean"] < 0.0 for h in result.history)
    final = result.evaluations[-1]
    assert final["iteration"] == 2 and -1.0 <= final["rewards"]["source_similarity"]["mean"] < 0.0
    assert len(seen) > 10 and all(seen)  # rollouts, V-GRPO's prepare and update, and the evaluation
    base = FluxKontextPipeline.from_pretrained(edit_world / "base", local_files_only=True)
    assert (out / LORA_FILE).is_file()
    base.load_lora_weights(out)  # the export loads in a plain diffusers script
    assert any("lora" in name for name, _ in base.transformer.named_parameters())


def test_a_killed_kontext_stage_resumes_to_the_same_weights(edit_world: Path) -> None:
    assert_killed_stage_resumes(edit_world, _stage_config(eval_prompts=None))


@pytest.mark.gpu
def test_a_kontext_stage_trains_on_cuda_at_the_newer_families_precision(edit_world: Path) -> None:
    from diffusers import FluxKontextPipeline

    assert_trains_at_recipe_precision(edit_world, _stage_config(), FluxKontextPipeline)
