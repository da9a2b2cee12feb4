"""The project's artifacts consumed as a user consumes them: plain diffusers, peft and mlflow calls.

The embedded base (committed) and every pipeline the project writes load with a bare ``from_pretrained``; the
diffusers pipeline samples the project's images with :func:`vgrpo.models.diffusers_call.diffusers_call_kwargs`
(or the plain-diffusers arguments docs/real-models.md gives); a LoRA export loads in PEFT.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DiffusionPipeline, SD3Transformer2DModel, StableDiffusion3Pipeline
from peft import PeftModel

from tests.models.embedded_lora import BASE, saved_lora_transformer
from vgrpo.checkpoints.state import LORA_FILE, PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE
from vgrpo.flow import timestep_grid
from vgrpo.images import tensor_to_images
from vgrpo.models.diffusers_call import diffusers_call_kwargs, diffusers_sigmas
from vgrpo.models.pipeline import build_adapter, load_sd3_pipeline
from vgrpo.models.saving import absent_t5, save_pipeline
from vgrpo.samplers import euler_ode_sample
from vgrpo.seeding import sample_noise

PROMPTS = ["a red cube left of a blue ball", "the word STOP on a sign"]
STEPS = 4
LATENT_TOL = 1e-4
"""Largest |latent difference| allowed between diffusers' pipeline and the project's sampler: the float rounding of
batched prompt encodes, which differs with the CPU's kernels (about 1e-5 at most), and far under what another grid
or noise gives (over 0.1, the default call below)."""


def _project_sample(pipe: StableDiffusion3Pipeline, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """Latents and uint8 images of the project's evaluation sampler (no CFG, Euler on the uniform grid)."""
    adapter, velocity = build_adapter(pipe)
    noise = sample_noise(seed, range(len(PROMPTS)), adapter.latent_shape)
    with torch.no_grad():
        latents = euler_ode_sample(
            velocity, noise, adapter.encode_prompts(PROMPTS), timestep_grid(STEPS, shift=adapter.scheduler_shift)
        )
        return latents, tensor_to_images(adapter.decode(latents))


def test_the_embedded_base_loads_with_a_bare_from_pretrained() -> None:
    index = json.loads((BASE / "model_index.json").read_text())
    assert index["text_encoder_3"] == ["transformers", "T5EncoderModel"]
    for cls in (DiffusionPipeline, StableDiffusion3Pipeline):
        pipe = cls.from_pretrained(BASE)
        assert isinstance(pipe, StableDiffusion3Pipeline)
    assert load_sd3_pipeline(BASE).text_encoder_3 is None  # the project's loader drops the stand-in


def test_the_stand_in_t5_changes_nothing_in_diffusers_default_call() -> None:
    """diffusers' default call (CFG 7, 256 T5 tokens) gives the same latents with the stand-in as without T5."""
    plain = StableDiffusion3Pipeline.from_pretrained(BASE)
    without = load_sd3_pipeline(BASE)
    ids = plain.tokenizer_3(PROMPTS, padding="max_length", max_length=7, return_tensors="pt").input_ids
    assert ids.shape == (2, 7)
    assert torch.equal(plain.text_encoder_3(ids)[0], torch.zeros(2, 7, 128))
    kw = {"num_inference_steps": 2, "output_type": "latent"}
    a = plain(PROMPTS, generator=torch.Generator().manual_seed(0), **kw).images
    b = without(PROMPTS, generator=torch.Generator().manual_seed(0), **kw).images
    assert torch.equal(a, b)


def test_diffusers_samples_the_projects_images_with_the_documented_call() -> None:
    ours_latents, ours_images = _project_sample(load_sd3_pipeline(BASE), seed=3)
    plain = StableDiffusion3Pipeline.from_pretrained(BASE)
    kwargs = diffusers_call_kwargs(plain, PROMPTS, num_steps=STEPS, seed=3)
    latents = plain(**kwargs, output_type="latent").images
    assert (latents - ours_latents).abs().max() < LATENT_TOL
    images = plain(**kwargs, output_type="np").images
    assert np.abs(np.round(images * 255) - ours_images.astype(np.float64)).max() <= 1
    # diffusers' defaults (CFG, its own grid and noise) give other images: the comparison can fail
    default = plain(PROMPTS, num_inference_steps=STEPS, output_type="latent").images
    assert (default - ours_latents).abs().max() > 0.1


def test_plain_diffusers_arguments_without_vgrpo() -> None:
    """The call docs/real-models.md gives for a user without vgrpo: T5 left out at load, then four arguments."""
    ours_latents, _ = _project_sample(load_sd3_pipeline(BASE), seed=0)
    pipe = StableDiffusion3Pipeline.from_pretrained(BASE, text_encoder_3=None, tokenizer_3=None)
    noise = sample_noise(0, range(len(PROMPTS)), (4, 16, 16))
    sigmas = np.linspace(1.0, 1.0 / STEPS, STEPS).tolist()
    assert np.allclose(sigmas, diffusers_sigmas(pipe.scheduler.config, STEPS))
    latents = pipe(
        PROMPTS,
        guidance_scale=1.0,
        max_sequence_length=0,
        num_inference_steps=STEPS,
        sigmas=sigmas,
        latents=noise,
        output_type="latent",
    ).images
    # batched prompt encoding rounds differently from the project's one-prompt encodes
    assert (latents - ours_latents).abs().max() < LATENT_TOL


def test_diffusers_sigmas_undo_the_schedulers_shift() -> None:
    """With a shifted scheduler (SD3.5-M's 3.0) the sigmas it steps on are the project's grid at any shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    for shift in (None, 1.0, 3.0, 5.0):
        scheduler.set_timesteps(sigmas=diffusers_sigmas(scheduler.config, 10, shift))
        expected = timestep_grid(10, shift=3.0 if shift is None else shift)
        torch.testing.assert_close(scheduler.sigmas.float(), expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="dynamically"):
        diffusers_sigmas(FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True).config, 10)


def test_a_pipeline_written_without_t5_loads_bare(tmp_path: Path) -> None:
    """save_pipeline (the full fine-tune, merge and FSDP exports, the pretrained base) writes the stand-in."""
    pipe = load_sd3_pipeline(BASE)
    save_pipeline(pipe, tmp_path / "out")
    assert pipe.text_encoder_3 is None  # not changed
    loaded = StableDiffusion3Pipeline.from_pretrained(tmp_path / "out")
    assert type(loaded.text_encoder_3).__name__ == "T5EncoderModel"
    encoder, _ = absent_t5(128)
    assert all(not p.any() for p in encoder.parameters())


def test_a_lora_export_loads_in_peft_and_in_diffusers(tmp_path: Path) -> None:
    transformer = saved_lora_transformer(tmp_path / "lora")
    assert {p.name for p in (tmp_path / "lora").iterdir()} == {LORA_FILE, PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE}

    g = torch.Generator().manual_seed(0)
    inputs = {
        "hidden_states": torch.randn(2, 4, 16, 16, generator=g),
        "timestep": torch.tensor([700.0, 200.0]),
        "encoder_hidden_states": torch.randn(2, 77, 128, generator=g),
        "pooled_projections": torch.randn(2, 64, generator=g),
    }
    with torch.no_grad():
        trained = transformer(**inputs).sample
        base = SD3Transformer2DModel.from_pretrained(BASE, subfolder="transformer")
        plain = base(**inputs).sample
        peft = PeftModel.from_pretrained(base, str(tmp_path / "lora"))(**inputs).sample
        pipe = StableDiffusion3Pipeline.from_pretrained(BASE)
        pipe.load_lora_weights(tmp_path / "lora")
        diffusers = pipe.transformer(**inputs).sample
    assert (trained - plain).abs().max() > 1e-2  # the adapter matters, so the comparisons can fail
    torch.testing.assert_close(peft, trained, rtol=0, atol=1e-6)
    torch.testing.assert_close(diffusers, trained, rtol=0, atol=1e-6)
