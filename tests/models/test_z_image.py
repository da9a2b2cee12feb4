"""The Z-Image family on a tiny ZImagePipeline built offline (vgrpo/models/z_image.py, tiny.py): prompts encoded as
the pipeline encodes them (each at its own length), sampling that reproduces ``ZImagePipeline.__call__`` (its
``1 - t`` timestep, negated output and shifted sigmas), rollout -> score -> update for V-GRPO and Flow-GRPO, and
the LoRA export loaded by a plain ``ZImagePipeline`` sampling the same latents as the project's sampler."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models.family_training import train_two_iterations
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny import tiny_z_image_pipeline
from vgrpo.models.z_image import ZImageAdapter, ZImageVelocity, captions
from vgrpo.policy import Conditioning

PROMPTS = ["a photo of a red circle", "two blue squares"]
LATENT_TOLERANCE = 1e-5
"""Max-abs difference allowed between this project's sampler and ``ZImagePipeline.__call__`` on the same noise."""


@pytest.fixture(scope="module")
def saved_z_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("z_image") / "pipeline"
    tiny_z_image_pipeline(seed=0).save_pretrained(path)
    return path


def _pipeline_latents(pipe: Any, noise: torch.Tensor, steps: int) -> torch.Tensor:
    return pipe(
        prompt=list(PROMPTS),  # ZImagePipeline writes the chat-templated prompts into the list it is given
        height=16,
        width=16,
        num_inference_steps=steps,
        guidance_scale=0.0,  # Z-Image-Turbo samples without CFG
        latents=noise.clone(),
        output_type="latent",
    ).images


def test_adapter_encodes_each_prompt_at_its_own_length_as_the_pipeline_does(saved_z_image: Path) -> None:
    pipe = load_pipeline(saved_z_image)
    adapter, policy = build_adapter(pipe, resolution=16)
    assert isinstance(adapter, ZImageAdapter) and isinstance(policy, ZImageVelocity)
    assert adapter.latent_shape == (4, 8, 8) and adapter.scheduler_shift == 3.0 and adapter.default_resolution == 1024
    with pytest.raises(ValueError, match="not a positive multiple of 4"):
        ZImageAdapter(pipe, resolution=18)
    cond = adapter.encode_prompts([PROMPTS[0], PROMPTS[1], PROMPTS[0]])
    theirs = pipe.encode_prompt(list(PROMPTS), do_classifier_free_guidance=False)[0]
    lengths = [t.shape[0] for t in theirs]
    assert lengths[0] != lengths[1] and cond.pooled_prompt_embeds is None and cond.prompt_mask is not None
    assert cond.prompt_embeds.shape == (3, max(lengths), 16)
    assert cond.prompt_mask.sum(1).tolist() == [*lengths, lengths[0]]
    for ours, reference in zip(captions(cond), [*theirs, theirs[0]], strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    assert torch.equal(cond.prompt_embeds[1, lengths[1] :], torch.zeros(max(lengths) - lengths[1], 16))
    # The mask follows the rows through index/repeat and stays bool through a dtype cast.
    moved = cond.index(torch.tensor([1])).repeat_interleave(2).to("cpu", torch.float64)
    assert moved.prompt_mask is not None and moved.prompt_mask.dtype == torch.bool
    assert moved.prompt_mask.shape == (2, max(lengths)) and moved.prompt_embeds.dtype == torch.float64
    with pytest.raises(ValueError, match="Z-Image needs the prompts' token mask"):  # CFG's conditioning has none
        policy(torch.zeros(1, 4, 8, 8), torch.ones(1), Conditioning(prompt_embeds=cond.prompt_embeds[:1]))
    with pytest.raises(ValueError, match="prompt_mask must be bool of shape"):
        Conditioning(prompt_embeds=torch.zeros(2, 3, 4), prompt_mask=torch.ones(2, 3))
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    latents = adapter.encode_images(images, generator=torch.Generator().manual_seed(0))
    assert latents.shape == (2, 4, 8, 8) and adapter.decode(latents).shape == (2, 3, 16, 16)


@pytest.mark.parametrize("steps", [2, 4])
def test_euler_with_z_image_velocity_reproduces_z_image_pipeline(saved_z_image: Path, steps: int) -> None:
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(saved_z_image)
    adapter, policy = build_adapter(pipe, resolution=16)
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    reference = _pipeline_latents(pipe, noise, steps)
    sigmas = timestep_grid(steps, shift=adapter.scheduler_shift)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)  # linspace(1, 1/T, T) + 0, shifted
    with torch.no_grad():
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    assert (ours - reference).abs().max() <= LATENT_TOLERANCE
    assert (reference - noise).abs().max() > 0.5  # the sampler moved the latents: the comparison can fail


def _train(pipe: Any, algorithm_name: str) -> tuple[Any, Any, dict[str, torch.Tensor], list[Any]]:
    return train_two_iterations(pipe, "z-image", algorithm_name, PROMPTS, shift=3.0)


@pytest.mark.parametrize("algorithm_name", ["vgrpo", "flow_grpo"])
def test_rollout_score_update_moves_the_z_image_lora(saved_z_image: Path, algorithm_name: str) -> None:
    _, policy, before, records = _train(load_pipeline(saved_z_image), algorithm_name)
    after = policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora" in k for k in changed) and any("lora_B" in k for k in changed)
    assert {"to_q", "to_k", "to_v", "to_out"} <= {part for k in changed for part in k.split(".")}
    assert all(math.isfinite(r.metrics["train/loss"]) for r in records)


def test_exported_lora_in_a_plain_z_image_pipeline_samples_what_the_project_samples(
    saved_z_image: Path, tmp_path: Path
) -> None:
    from diffusers import ZImagePipeline

    from vgrpo.checkpoints.state import LORA_FILE, save_lora
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(saved_z_image)
    adapter, policy, _, _ = _train(pipe, "vgrpo")
    save_lora(pipe.transformer, tmp_path / "lora")
    assert (tmp_path / "lora" / LORA_FILE).is_file()

    plain = ZImagePipeline.from_pretrained(saved_z_image, local_files_only=True)
    plain.load_lora_weights(tmp_path / "lora")
    base = ZImagePipeline.from_pretrained(saved_z_image, local_files_only=True)
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), timestep_grid(4, shift=3.0))
    theirs, untrained = _pipeline_latents(plain, noise, 4), _pipeline_latents(base, noise, 4)
    assert (theirs - ours).abs().max() <= LATENT_TOLERANCE  # alpha / rank travelled in the file's metadata
    assert (untrained - ours).abs().max() > 1e-3  # the trained adapter changes the samples

    # Merge-and-export (python -m vgrpo.cli export) writes a ZImagePipeline that samples base + LoRA.
    from vgrpo.cli import main

    out = tmp_path / "merged"
    assert main(["export", str(saved_z_image), "--lora", str(tmp_path / "lora"), "--out", str(out)]) == 0
    merged = load_pipeline(out)
    assert isinstance(merged, ZImagePipeline) and not getattr(merged.transformer, "peft_config", None)
    assert (_pipeline_latents(merged, noise, 4) - ours).abs().max() <= LATENT_TOLERANCE


def test_z_image_lora_targets_select_every_attention_projection() -> None:
    transformer = tiny_z_image_pipeline(seed=0).transformer
    names = [n for n, _ in transformer.named_modules()]
    for target in FAMILIES["z-image"].lora_targets:
        assert sum(n.endswith(f"attention.{target}") for n in names) == 3  # refiner x 2 + one main layer


def test_the_z_image_recipe_loads_as_a_stage_and_trains_the_family_s_lora_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vgrpo.config import StageConfig, load_config

    monkeypatch.setenv("VGRPO_MODELS", "/models")
    root = Path(__file__).parents[2] / "params"
    stage = {"name": "z-image-pickscore", "prompts": "prompts/flow_grpo/pickscore/train.txt", "iterations": 1}
    stage["rewards"] = [{"name": "pickscore", "options": {"path": "/models/PickScore_v1"}}]
    config = load_config([root / "base.yaml", root / "models/z-image.yaml"], stage, schema=StageConfig)
    assert str(config.pipeline) == "/models/Z-Image-Turbo"
    rollout, lora = config.rollout, config.lora
    assert (rollout.resolution, rollout.num_steps, rollout.shift, rollout.dynamic_shift) == (512, 6, 3.0, False)
    assert (rollout.prompts_per_iteration, rollout.group_size, config.optim.lr) == (48, 16, 3e-4)
    assert lora is not None and (lora.rank, lora.alpha) == (64, 128)
    assert lora.target_modules == FAMILIES["z-image"].lora_targets
