"""Z-Image in the pipeline, on a tiny ZImagePipeline built offline: a stage on a saved directory trains its LoRA
(exported for a plain ZImagePipeline) or every weight (exported as a whole pipeline), and a killed stage resumes to
the weights of the uninterrupted one, bit for bit."""

from __future__ import annotations

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
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny import tiny_z_image_pipeline


@pytest.fixture(scope="module")
def z_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """World prompt files and a tiny Z-Image pipeline (its byte-level tokenizer reads any prompt)."""
    return world_with_pipeline(tmp_path_factory.mktemp("z-world"), lambda prompts: tiny_z_image_pipeline(seed=0))


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_run_stage_trains_a_saved_z_image_pipeline(z_world: Path, lora: bool) -> None:
    from diffusers import ZImagePipeline

    config = stage_config("z-image", shift=3.0)
    result = run_two_iterations(z_world, config if lora else full_fine_tuning(config), f"{lora}")
    assert result.evaluations[-1]["sampling"]["shift"] == 3.0
    assert_export_loads(z_world, f"{lora}", ZImagePipeline, lora=lora)


def test_a_killed_z_image_stage_resumes_to_the_same_weights(z_world: Path) -> None:
    assert_killed_stage_resumes(z_world, stage_config("z-image", shift=3.0, eval_prompts=None))


def test_the_sd3_lora_targets_on_a_z_image_pipeline_are_refused_naming_the_family_s(z_world: Path) -> None:
    from vgrpo.checkpoints.weight_files import lora_target_problems, transformer_shapes
    from vgrpo.models.config import LoraConfig

    pipeline = z_world / "base"
    shapes = transformer_shapes(pipeline)
    assert shapes is not None
    assert lora_target_problems(FAMILIES["z-image"].lora_targets, shapes, pipeline) == []
    (problem,) = lora_target_problems(LoraConfig().target_modules, shapes, pipeline)
    assert problem.startswith("lora.target_modules: ['add_q_proj', 'add_k_proj', 'add_v_proj', 'to_add_out'] name no")
    assert problem.endswith("the z-image family's: ['to_q', 'to_k', 'to_v', 'to_out.0'])")


@pytest.mark.gpu
def test_a_z_image_stage_trains_on_cuda_at_the_newer_families_precision(z_world: Path) -> None:
    from diffusers import ZImagePipeline

    assert_trains_at_recipe_precision(z_world, stage_config("z-image", shift=3.0), ZImagePipeline)
