"""FLUX.1-Kontext in the pipeline, on a tiny FluxKontextPipeline built offline: a stage on the world's counting-edit
set (prompt rows name source images relative to the prompt file) feeds them to every forward of the policy (rollout,
update, evaluation), scores the samples by the edit's GenEval verdict and against their sources (source_similarity),
exports a LoRA a plain FluxKontextPipeline loads, and a killed stage
resumes to bit-identical LoRA weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models import family_stage
from vgrpo.models.tiny_flux_kontext import tiny_flux_kontext_pipeline


@pytest.fixture(scope="module")
def edit_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The world's counting-edit set (rows naming their source images under ``images/``) and a tiny Kontext
    pipeline."""
    from vgrpo.world.edits import write_counting_edits
    from vgrpo.world.prompts import make_splits

    root = tmp_path_factory.mktemp("kontext-world")
    train, test = make_splits(seed=0, n_train=30, n_test=15)
    write_counting_edits({"train": train, "test": test}, root, size=16)
    test_rows = (root / "test.jsonl").read_text().splitlines(keepends=True)
    (root / "test.jsonl").write_text("".join(test_rows[:2]))
    tiny_flux_kontext_pipeline(seed=0).save_pretrained(root / "base")
    return root


def _stage_config(**overrides: Any) -> Any:
    """The counting-edit stage's rewards (params/stages/flux-kontext/counting-edit.yaml) on a tiny stage."""
    rewards = [
        {"name": "geneval", "weight": 0.5, "options": {"reward": "strict"}},
        {"name": "source_similarity", "weight": 0.5},
    ]
    evaluation = {"group_size": 1, "num_steps": 2, "shift": "dynamic", "rewards": rewards}
    return family_stage.stage_config("flux-kontext", **({"rewards": rewards, "evaluation": evaluation} | overrides))


def test_a_kontext_stage_feeds_the_rows_source_images_to_every_forward_and_scores_against_them(
    edit_world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import FluxKontextPipeline

    from vgrpo.models.flux_kontext import FluxKontextVelocity

    def with_sources(latents: torch.Tensor, cond: Any) -> bool:
        return cond.image_latents is not None and cond.image_latents.shape[0] == latents.shape[0]

    seen = family_stage.spy_on_forward(monkeypatch, FluxKontextVelocity, with_sources)
    result = family_stage.run_two_iterations(edit_world, _stage_config(), "edits")  # two finite iterations
    assert all(-1.0 <= h["reward/source_similarity_raw_mean"] < 0.0 for h in result.history)
    assert all(0.0 <= h["reward/geneval_raw_mean"] <= 1.0 for h in result.history)
    final = result.evaluations[-1]
    assert final["iteration"] == 2 and -1.0 <= final["rewards"]["source_similarity"]["mean"] < 0.0
    assert 0.0 <= final["rewards"]["geneval"]["mean"] <= 1.0
    assert len(seen) > 10 and all(seen)  # rollouts, V-GRPO's prepare and update, and the evaluation
    family_stage.assert_export_loads(edit_world, "edits", FluxKontextPipeline, lora=True)


def test_a_killed_kontext_stage_resumes_to_the_same_weights(edit_world: Path) -> None:
    family_stage.assert_killed_stage_resumes(edit_world, _stage_config(eval_prompts=None))


@pytest.mark.gpu
def test_a_kontext_stage_trains_on_cuda_at_the_newer_families_precision(edit_world: Path) -> None:
    from diffusers import FluxKontextPipeline

    family_stage.assert_trains_at_recipe_precision(edit_world, _stage_config(), FluxKontextPipeline)
