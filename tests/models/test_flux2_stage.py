"""FLUX.2 in the pipeline, on a tiny Flux2Pipeline built offline: a stage on a saved directory trains its
LoRA (exported for a plain Flux2Pipeline) or every weight (exported as a whole pipeline), and a killed stage
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
from vgrpo.models.tiny_flux2 import tiny_flux2_pipeline


@pytest.fixture(scope="module")
def f2_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """World prompt files and a tiny FLUX.2 pipeline (its byte-level tokenizer reads any prompt)."""
    return world_with_pipeline(tmp_path_factory.mktemp("flux2-world"), lambda prompts: tiny_flux2_pipeline(seed=0))


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_run_stage_trains_a_saved_flux2_pipeline(f2_world: Path, lora: bool) -> None:
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    config = stage_config("flux2")
    result = run_two_iterations(f2_world, config if lora else full_fine_tuning(config), f"{lora}")
    # The evaluation samples at FLUX.2's shift for its own 2 steps (the rollouts' 3 steps give another one).
    final, rollout_shift = result.evaluations[-1], math.exp(compute_empirical_mu(16, 3))
    assert final["sampling"]["shift"] == pytest.approx(math.exp(compute_empirical_mu(16, 2)))
    assert final["sampling"]["shift"] == pytest.approx(7.1020, abs=1e-4) and rollout_shift == pytest.approx(
        7.0484, abs=1e-4
    )
    assert_export_loads(f2_world, f"{lora}", Flux2Pipeline, lora=lora)


def test_a_killed_flux2_stage_resumes_to_the_same_weights(f2_world: Path) -> None:
    assert_killed_stage_resumes(f2_world, stage_config("flux2", eval_prompts=None))


@pytest.mark.gpu
def test_a_flux2_stage_trains_on_cuda_at_its_recipes_precision(f2_world: Path) -> None:
    from diffusers import Flux2Pipeline

    assert_trains_at_recipe_precision(f2_world, stage_config("flux2"), Flux2Pipeline)
