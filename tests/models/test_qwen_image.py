"""The Qwen-Image family on a tiny QwenImagePipeline built offline (vgrpo/models/qwen_image.py, tiny.py): prompts
encoded as the pipeline encodes them (template prefix dropped, each at its own length), sampling that reproduces
``QwenImagePipeline.__call__`` (packed latents, ``t`` timestep, the dynamic shift), the VAE's per-channel
normalisation, rollout -> score -> update for V-GRPO and Flow-GRPO, and the LoRA export loaded by a plain
``QwenImagePipeline`` sampling the same latents as the project's sampler."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models.family_training import train_two_iterations
from vgrpo.models.flux import pack_latents, unpack_latents
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.qwen_image import QwenImageAdapter, QwenImageVelocity
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny import tiny_qwen_image_pipeline
from vgrpo.policy import Conditioning

PROMPTS = ["a photo of a red circle", "two blue squares"]
LATENT_TOLERANCE = 1e-5
"""Max-abs difference allowed between this project's sampler and ``QwenImagePipeline.__call__`` on the same noise."""


@pytest.fixture(scope="module")
def saved_qwen_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen_image") / "pipeline"
    tiny_qwen_image_pipeline(seed=0).save_pretrained(path)
    return path


def _pipeline_latents(pipe: Any, noise: torch.Tensor, steps: int) -> torch.Tensor:
    packed = pipe(
        prompt=list(PROMPTS),
        height=16,
        width=16,
        num_inference_steps=steps,
        latents=pack_latents(noise),
        output_type="latent",
    ).images
    return unpack_latents(packed, 8, 8)


def test_adapter_encodes_decodes_and_shifts_as_the_pipeline_does(saved_qwen_image: Path) -> None:
    pipe = load_pipeline(saved_qwen_image)
    adapter, policy = build_adapter(pipe, resolution=16)
    assert isinstance(adapter, QwenImageAdapter) and isinstance(policy, QwenImageVelocity)
    assert adapter.latent_shape == (4, 8, 8) and adapter.default_resolution == 128 * 2
    # calculate_shift(16 tokens; 256 / 8192, 0.5 / 0.9) = 0.5 + (16 - 256) * 0.4 / 7936, as a static shift e^mu.
    assert adapter.scheduler_shift == pytest.approx(math.exp(0.5 - 240 * 0.4 / 7936), abs=1e-12)
    cond = adapter.encode_prompts([PROMPTS[1], PROMPTS[0]])
    embeds, mask = pipe.encode_prompt(list(PROMPTS), device="cpu")
    lengths = mask.sum(1).tolist()
    assert lengths[0] != lengths[1] and cond.prompt_mask is not None
    assert cond.prompt_mask.sum(1).tolist() == lengths[::-1]
    for row, (ours, ours_mask) in enumerate(zip(cond.prompt_embeds, cond.prompt_mask, strict=True)):
        theirs = embeds[1 - row][mask[1 - row].bool()]
        torch.testing.assert_close(ours[ours_mask], theirs, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="Qwen-Image needs the prompts' token mask"):
        policy(torch.zeros(1, 4, 8, 8), torch.ones(1), Conditioning(prompt_embeds=cond.prompt_embeds[:1]))
    # Latents are (z - latents_mean) / latents_std, decoded through the video VAE's one frame as the pipeline does.
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    latents = adapter.encode_images(images, generator=torch.Generator().manual_seed(0))
    std = torch.tensor(pipe.vae.config.latents_std).view(1, 4, 1, 1)
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, 4, 1, 1)
    with torch.no_grad():
        reference = pipe.vae.decode((latents * std + mean)[:, :, None], return_dict=False)[0][:, :, 0]
        torch.testing.assert_close(adapter.decode(latents), reference, rtol=0, atol=1e-6)
    pipe.scheduler.register_to_config(shift_terminal=0.02)
    with pytest.raises(ValueError, match=r"shift_terminal=0\.02"):
        _ = adapter.scheduler_shift


@pytest.mark.parametrize("steps", [2, 4])
def test_euler_with_qwen_image_velocity_reproduces_qwen_image_pipeline(saved_qwen_image: Path, steps: int) -> None:
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(saved_qwen_image)
    adapter, policy = build_adapter(pipe, resolution=16)
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    reference = _pipeline_latents(pipe, noise, steps)
    sigmas = timestep_grid(steps, shift=adapter.scheduler_shift)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)
    with torch.no_grad():
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    assert (ours - reference).abs().max() <= LATENT_TOLERANCE
    assert (reference - noise).abs().max() > 0.5


@pytest.mark.parametrize("algorithm_name", ["vgrpo", "flow_grpo"])
def test_rollout_score_update_moves_the_qwen_image_lora(saved_qwen_image: Path, algorithm_name: str) -> None:
    _, policy, before, records = train_two_iterations(
        load_pipeline(saved_qwen_image), "qwen-image", algorithm_name, PROMPTS
    )
    after = policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora" in k for k in changed) and any("lora_B" in k for k in changed)
    # Both streams' attention trains (the one block's text output, to_add_out, reaches no image token: no gradient).
    assert {"to_q", "to_out", "add_q_proj", "add_v_proj"} <= {part for k in changed for part in k.split(".")}
    assert all(math.isfinite(r.metrics["train/loss"]) for r in records)


def test_exported_lora_in_a_plain_qwen_image_pipeline_samples_what_the_project_samples(
    saved_qwen_image: Path, tmp_path: Path
) -> None:
    from diffusers import QwenImagePipeline

    from vgrpo.checkpoints.state import LORA_FILE, save_lora
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(saved_qwen_image)
    adapter, policy, _, _ = train_two_iterations(pipe, "qwen-image", "vgrpo", PROMPTS)
    save_lora(pipe.transformer, tmp_path / "lora")
    assert (tmp_path / "lora" / LORA_FILE).is_file()

    plain = QwenImagePipeline.from_pretrained(saved_qwen_image, local_files_only=True)
    plain.load_lora_weights(tmp_path / "lora")
    base = QwenImagePipeline.from_pretrained(saved_qwen_image, local_files_only=True)
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        sigmas = timestep_grid(4, shift=adapter.scheduler_shift)
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    theirs, untrained = _pipeline_latents(plain, noise, 4), _pipeline_latents(base, noise, 4)
    assert (theirs - ours).abs().max() <= LATENT_TOLERANCE  # alpha / rank travelled in the file's metadata
    assert (untrained - ours).abs().max() > 1e-3  # the trained adapter changes the samples


def test_the_qwen_image_recipe_loads_as_a_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from vgrpo.config import StageConfig, load_config

    monkeypatch.setenv("VGRPO_MODELS", "/models")
    root = Path(__file__).parents[2] / "params"
    stage = {"name": "qwen-image-pickscore", "prompts": "prompts/flow_grpo/pickscore/train.txt", "iterations": 1}
    stage["rewards"] = [{"name": "pickscore", "options": {"path": "/models/PickScore_v1"}}]
    config = load_config([root / "base.yaml", root / "models/qwen-image.yaml"], stage, schema=StageConfig)
    assert config.precision.lora_base_dtype == "bf16"  # fp32 would not fit (benchmarks.memory_families)
    assert str(config.pipeline) == "/models/Qwen-Image"
    rollout, lora = config.rollout, config.lora
    assert (rollout.resolution, rollout.num_steps, rollout.shift, rollout.dynamic_shift) == (512, 10, None, True)
    assert (rollout.prompts_per_iteration, rollout.group_size, config.optim.lr) == (48, 16, 3e-4)
    assert lora is not None and (lora.rank, lora.alpha) == (64, 128)
    assert lora.target_modules == FAMILIES["qwen-image"].lora_targets
    assert (config.evaluation.resolution, config.evaluation.num_steps, config.evaluation.shift) == (1024, 28, "dynamic")
