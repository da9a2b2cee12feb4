"""Qwen-Image in the pipeline, on a tiny QwenImagePipeline built offline: a stage on a saved directory trains its
LoRA (exported for a plain QwenImagePipeline) or every weight (exported as a whole pipeline), and a killed stage
resumes to the weights of the uninterrupted one, bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.models.family_stage import (
    assert_export_loads,
    assert_killed_stage_resumes,
    assert_trains_at_recipe_precision,
    full_fine_tuning,
    run_two_iterations,
    stage_config,
    world_with_pipeline,
)
from vgrpo.models.tiny import tiny_qwen_image_pipeline


@pytest.fixture(scope="module")
def q_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """World prompt files and a tiny Qwen-Image pipeline (its byte-level tokenizer reads any prompt)."""
    return world_with_pipeline(tmp_path_factory.mktemp("qwen-world"), lambda prompts: tiny_qwen_image_pipeline(seed=0))


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_run_stage_trains_a_saved_qwen_image_pipeline(q_world: Path, lora: bool) -> None:
    from diffusers import QwenImagePipeline

    config = stage_config("qwen-image")
    result = run_two_iterations(q_world, config if lora else full_fine_tuning(config), f"{lora}")
    final = result.evaluations[-1]  # calculate_shift(16 tokens; 256 / 8192, 0.5 / 0.9) as a static shift e^mu
    assert final["sampling"]["shift"] == pytest.approx(math.exp(0.5 - 240 * 0.4 / 7936))
    assert_export_loads(q_world, f"{lora}", QwenImagePipeline, lora=lora)


def test_a_killed_qwen_image_stage_resumes_to_the_same_weights(q_world: Path) -> None:
    assert_killed_stage_resumes(q_world, stage_config("qwen-image", eval_prompts=None))


@pytest.mark.gpu
def test_a_qwen_image_stage_trains_on_cuda_at_its_recipes_precision(q_world: Path) -> None:
    from diffusers import QwenImagePipeline

    assert_trains_at_recipe_precision(q_world, stage_config("qwen-image"), QwenImagePipeline)
