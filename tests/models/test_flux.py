"""The FLUX.1 adapter on a tiny FluxPipeline built offline: packing as diffusers packs, sampling that reproduces
``FluxPipeline.__call__`` (timestep convention, guidance, ids, dynamic shift), a V-GRPO step, LoRA that a plain
diffusers script loads, and the loader's errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models.family_training import train_two_iterations
from tests.models.pipeline_dirs import assert_loader_names_the_missing_piece
from vgrpo.models.flux import FluxAdapter, FluxVelocity, latent_image_ids, pack_latents, unpack_latents
from vgrpo.models.pipeline import PipelineError, build_adapter, load_pipeline

ROOT = Path(__file__).parents[2]
PROMPTS = ["a photo of a red circle", "two blue squares"]


def test_pack_latents_round_trips_and_matches_diffusers() -> None:
    from diffusers import FluxPipeline

    x = torch.randn(2, 3, 4, 6, generator=torch.Generator().manual_seed(0))
    packed = pack_latents(x)
    assert packed.shape == (2, 2 * 3, 3 * 4)
    assert torch.equal(packed, FluxPipeline._pack_latents(x, 2, 3, 4, 6))
    assert torch.equal(unpack_latents(packed, 4, 6), x)
    assert torch.equal(unpack_latents(packed, 4, 6), FluxPipeline._unpack_latents(packed, 32, 48, 8))
    # Token (row 0, col 1) holds the 2 x 2 patch at latent columns 2-3, channel-major.
    ar = torch.arange(2 * 4 * 4.0).reshape(1, 2, 4, 4)
    assert pack_latents(ar)[0, 1].tolist() == [2, 3, 6, 7, 18, 19, 22, 23]
    ids = latent_image_ids(4, 6, dtype=torch.float32)
    assert torch.equal(ids, FluxPipeline._prepare_latent_image_ids(1, 2, 3, "cpu", torch.float32))
    assert ids[4].tolist() == [0, 1, 1]
    with pytest.raises(ValueError, match="must be even"):
        pack_latents(torch.zeros(1, 1, 3, 4))


def test_adapter_sizes_resolution_and_dynamic_shift(flux: Any) -> None:
    adapter = FluxAdapter(flux, resolution=16)
    assert adapter.latent_shape == (4, 8, 8) and adapter.image_seq_len == 16 and adapter.max_sequence_length == 16
    assert FluxAdapter(flux).resolution == 128 * 2  # FluxPipeline.default_sample_size x the VAE factor
    # calculate_shift(16 tokens) = 0.5 + (16 - 256) * 0.65 / 3840 = 0.459375, as a static shift e^mu.
    assert adapter.scheduler_shift == pytest.approx(math.exp(0.459375), abs=1e-12)
    assert adapter.sigma_shift(3.0, dynamic=False) == 3.0
    with pytest.raises(ValueError, match="not a positive multiple of 4"):
        FluxAdapter(flux, resolution=18)
    cond = adapter.encode_prompts([PROMPTS[0], PROMPTS[1], PROMPTS[0]])
    assert cond.prompt_embeds.shape == (3, 16, 16) and cond.pooled_prompt_embeds is not None
    assert torch.equal(cond.prompt_embeds[0], cond.prompt_embeds[2])
    embeds, pooled, _ = flux.encode_prompt(PROMPTS[1], max_sequence_length=16)
    torch.testing.assert_close(cond.prompt_embeds[1], embeds[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(cond.pooled_prompt_embeds[1], pooled[0], rtol=0, atol=1e-6)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    latents = adapter.encode_images(images, generator=torch.Generator().manual_seed(0))
    assert latents.shape == (2, 4, 8, 8) and adapter.decode(latents).shape == (2, 3, 16, 16)


@pytest.mark.parametrize("steps", [2, 4])
def test_euler_with_flux_velocity_reproduces_flux_pipeline(flux: Any, steps: int) -> None:
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    adapter, policy = build_adapter(flux, resolution=16)
    assert isinstance(policy, FluxVelocity) and policy.guidance_scale == 3.5
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    reference = flux(
        prompt=PROMPTS,
        height=16,
        width=16,
        num_inference_steps=steps,
        guidance_scale=3.5,
        latents=pack_latents(noise),
        output_type="latent",
        max_sequence_length=16,
    ).images
    reference = unpack_latents(reference, 8, 8)
    sigmas = timestep_grid(steps, shift=adapter.scheduler_shift)
    torch.testing.assert_close(sigmas, flux.scheduler.sigmas, rtol=0, atol=1e-6)  # the pipeline's dynamic shift
    with torch.no_grad():
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)
        policy.guidance_scale = 1.0  # the guidance embedding is fed: another scale samples something else
        other = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    assert (other - reference).abs().max() > 1e-2


def test_vgrpo_step_on_flux_moves_lora_and_diffusers_loads_it(saved_flux: Path, tmp_path: Path) -> None:
    from diffusers import FluxPipeline

    from vgrpo.checkpoints.state import LORA_FILE, save_lora

    pipe = load_pipeline(saved_flux)
    _, policy, before, records = train_two_iterations(pipe, "flux", "vgrpo", PROMPTS)
    after = policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora" in k for k in changed) and any("lora_B" in k for k in changed)
    assert all(math.isfinite(r.metrics["train/loss"]) for r in records)
    # Both streams' attention carries the adapter: the joint blocks' text projections and the single blocks.
    assert {"add_q_proj", "to_add_out", "single_transformer_blocks"} <= {part for k in changed for part in k.split(".")}

    save_lora(pipe.transformer, tmp_path / "lora")
    assert (tmp_path / "lora" / LORA_FILE).is_file()
    plain = FluxPipeline.from_pretrained(saved_flux, local_files_only=True)
    plain.load_lora_weights(tmp_path / "lora")
    base = FluxPipeline.from_pretrained(saved_flux, local_files_only=True).transformer
    x, t = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([0.9, 0.4])
    cond = build_adapter(pipe, resolution=16)[0].encode_prompts(PROMPTS)
    with torch.no_grad():
        ours, theirs = policy(x, t, cond), FluxVelocity(plain.transformer)(x, t, cond)
        untrained = FluxVelocity(base)(x, t, cond)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-6)  # alpha / rank travelled in the metadata
    assert (ours - untrained).abs().max() > 1e-4

    # Merge-and-export (python -m vgrpo.cli export) writes a FluxPipeline that computes base + LoRA.
    from vgrpo.cli import main

    assert main(["export", str(saved_flux), "--lora", str(tmp_path / "lora"), "--out", str(tmp_path / "merged")]) == 0
    merged = load_pipeline(tmp_path / "merged")
    assert isinstance(merged, FluxPipeline) and not getattr(merged.transformer, "peft_config", None)
    with torch.no_grad():
        torch.testing.assert_close(FluxVelocity(merged.transformer)(x, t, cond), ours, rtol=1e-5, atol=1e-5)


def test_full_fine_tuning_moves_every_transformer_weight_group(saved_flux: Path) -> None:
    _, policy, before, records = train_two_iterations(load_pipeline(saved_flux), "flux", "vgrpo", PROMPTS, lora=False)
    after = policy.state_dict()
    changed = {k.split(".")[1] for k in before if not torch.equal(before[k], after[k])}
    assert {"transformer_blocks", "single_transformer_blocks", "time_text_embed", "proj_out"} <= changed
    assert all(math.isfinite(r.metrics["train/loss"]) for r in records)


def test_loader_dispatches_on_class_and_names_the_missing_piece(saved_flux: Path, tmp_path: Path) -> None:
    from diffusers import FluxPipeline

    from vgrpo.models.pipeline import load_sd3_pipeline

    assert isinstance(load_pipeline(saved_flux), FluxPipeline)
    broken = assert_loader_names_the_missing_piece(load_pipeline, saved_flux, tmp_path, "tokenizer_2")
    with pytest.raises(PipelineError, match=r"expected StableDiffusion3Pipeline$"):
        load_sd3_pipeline(saved_flux)  # the SD3-only loader still refuses FLUX
    index = json.loads((broken / "model_index.json").read_text())
    index["_class_name"] = "QwenImageEditPipeline"
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PipelineError, match=r"model_index\.json: _class_name is 'QwenImageEditPipeline', expected St"):
        load_pipeline(broken)
    index |= {"_class_name": "FluxPipeline", "vae": [None, None]}
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PipelineError, match="component 'vae' is missing or null"):
        load_pipeline(broken)
