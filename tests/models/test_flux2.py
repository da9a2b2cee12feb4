"""The FLUX.2 family on a tiny Flux2Pipeline built offline (vgrpo/models/flux2.py, tiny_flux2.py): prompts encoded as
the pipeline encodes them (stacked Mistral-3 hidden states at a fixed length), latents patchified and normalised by the
VAE's batch-norm statistics as the pipeline does, FLUX.2's step-dependent shift, sampling that reproduces
``Flux2Pipeline.__call__``, rollout -> score -> update for V-GRPO and Flow-GRPO, and the LoRA export loaded by a plain
``Flux2Pipeline`` sampling the same latents as the project's sampler."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models.family_training import train_two_iterations
from vgrpo.models.flux2 import Flux2Adapter, Flux2Velocity, empirical_shift_mu, image_ids, patchify, text_ids
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny_flux2 import TINY_FLUX2_TOKENS, tiny_flux2_pipeline

PROMPTS = ["a photo of a red circle", "two blue squares"]
LATENT_TOLERANCE = 1e-5
"""Max-abs difference allowed between this project's sampler and ``Flux2Pipeline.__call__`` on the same noise."""


@pytest.fixture(scope="module")
def saved_flux2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("flux2") / "pipeline"
    tiny_flux2_pipeline(seed=0).save_pretrained(path)
    return path


def _pipeline_latents(pipe: Any, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """``Flux2Pipeline.__call__``'s final latents from ``noise`` (patchified ``(N, C, 4, 4)``), unflattened."""
    packed = pipe(
        prompt=list(PROMPTS),
        height=16,
        width=16,
        num_inference_steps=steps,
        latents=noise,
        output_type="latent",
        max_sequence_length=TINY_FLUX2_TOKENS,
    ).images
    return packed.permute(0, 2, 1).reshape(noise.shape)


@pytest.mark.parametrize(("tokens", "steps"), [(16, 3), (16, 28), (1024, 8), (4096, 50), (4301, 8), (16384, 28)])
def test_the_empirical_shift_is_the_pipelines(tokens: int, steps: int) -> None:
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    assert empirical_shift_mu(tokens, steps) == pytest.approx(compute_empirical_mu(tokens, steps), abs=1e-12)


def test_adapter_encodes_decodes_and_shifts_as_the_pipeline_does(saved_flux2: Path) -> None:
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline

    pipe = load_pipeline(saved_flux2)
    adapter, policy = build_adapter(pipe, resolution=16)
    assert isinstance(adapter, Flux2Adapter) and isinstance(policy, Flux2Velocity)
    assert adapter.latent_shape == (16, 4, 4) and adapter.image_seq_len == 16 and adapter.default_resolution == 256
    assert adapter.max_sequence_length == TINY_FLUX2_TOKENS  # the tokenizer's model_max_length
    # mu(16 tokens, 3 steps) = m_200 + 197 (m_200 - m_10) / -190 with FLUX.2's two fitted lines, as e^mu.
    assert adapter.dynamic_shift(3) == pytest.approx(math.exp(1.952797), rel=1e-6)
    assert adapter.pipeline_shift(3) == adapter.dynamic_shift(3) != adapter.dynamic_shift(10)
    with pytest.raises(ValueError, match="depends on the number of sampling steps"):
        _ = adapter.scheduler_shift
    # Rotary ids as the pipeline builds them.
    latents = torch.randn(2, 16, 4, 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(image_ids(4, 4), Flux2Pipeline._prepare_latent_ids(latents)[0])
    assert torch.equal(text_ids(5), Flux2Pipeline._prepare_text_ids(torch.zeros(1, 5, 48))[0])
    # Prompts one at a time, in any order, give the pipeline's batched embeddings (3 x 16 stacked hidden states).
    cond = adapter.encode_prompts([PROMPTS[1], PROMPTS[0]])
    embeds, _ = pipe.encode_prompt(list(PROMPTS), device="cpu", max_sequence_length=TINY_FLUX2_TOKENS)
    assert cond.prompt_embeds.shape == (2, TINY_FLUX2_TOKENS, 48) and cond.prompt_mask is None
    torch.testing.assert_close(cond.prompt_embeds, embeds.flip(0), rtol=0, atol=1e-6)
    # Decoding: batch-norm statistics undone, patches unfolded, the VAE decodes (Flux2Pipeline.__call__'s decode).
    bn = pipe.vae.bn
    mean, std = bn.running_mean.view(1, -1, 1, 1), torch.sqrt(bn.running_var.view(1, -1, 1, 1) + 1e-4)
    assert float(std.min()) < 0.75 and float(mean.abs().max()) > 0.25  # the tiny VAE's statistics are not identity
    with torch.no_grad():
        reference = pipe.vae.decode(Flux2Pipeline._unpatchify_latents(latents * std + mean), return_dict=False)[0]
        torch.testing.assert_close(adapter.decode(latents), reference, rtol=0, atol=1e-6)
        # Encoding: the pipeline's reference-image encoding (the posterior's mode, patchified, normalised) plus
        # the posterior noise this sample drew, patchified and scaled the same way.
        images = torch.rand(2, 3, 16, 16) * 2 - 1
        ours = adapter.encode_images(images, generator=torch.Generator().manual_seed(0))
        mode = pipe._encode_vae_image(images, generator=None)
        dist = pipe.vae.encode(images).latent_dist
        eps = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(ours, mode + patchify(dist.std * eps) / std, rtol=0, atol=1e-5)


@pytest.mark.parametrize("steps", [2, 4])
def test_euler_with_flux2_velocity_reproduces_flux2_pipeline(saved_flux2: Path, steps: int) -> None:
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(saved_flux2)
    adapter, policy = build_adapter(pipe, resolution=16)
    noise = torch.randn(2, 16, 4, 4, generator=torch.Generator().manual_seed(0))
    reference = _pipeline_latents(pipe, noise, steps)
    sigmas = timestep_grid(steps, shift=adapter.dynamic_shift(steps))
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)
    with torch.no_grad():
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    assert (ours - reference).abs().max() <= LATENT_TOLERANCE
    assert (reference - noise).abs().max() > 0.5


@pytest.mark.parametrize("algorithm_name", ["vgrpo", "flow_grpo"])
def test_rollout_score_update_moves_the_flux2_lora(saved_flux2: Path, algorithm_name: str) -> None:
    _, policy, before, records = train_two_iterations(load_pipeline(saved_flux2), "flux2", algorithm_name, PROMPTS)
    after = policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora" in k for k in changed) and any("lora_B" in k for k in changed)
    # Both streams' attention and the single-stream block's fused projection train.
    assert {"to_q", "to_out", "add_q_proj", "add_v_proj", "to_qkv_mlp_proj"} <= {
        p for k in changed for p in k.split(".")
    }
    assert all(math.isfinite(r.metrics["train/loss"]) for r in records)


def test_exported_lora_in_a_plain_flux2_pipeline_samples_what_the_project_samples(
    saved_flux2: Path, tmp_path: Path
) -> None:
    from diffusers import Flux2Pipeline

    from vgrpo.checkpoints.state import LORA_FILE, save_lora
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(saved_flux2)
    adapter, policy, _, _ = train_two_iterations(pipe, "flux2", "vgrpo", PROMPTS)
    save_lora(pipe.transformer, tmp_path / "lora")
    assert (tmp_path / "lora" / LORA_FILE).is_file()

    plain = Flux2Pipeline.from_pretrained(saved_flux2, local_files_only=True)
    plain.load_lora_weights(tmp_path / "lora")
    base = Flux2Pipeline.from_pretrained(saved_flux2, local_files_only=True)
    noise = torch.randn(2, 16, 4, 4, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        sigmas = timestep_grid(4, shift=adapter.dynamic_shift(4))
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    theirs, untrained = _pipeline_latents(plain, noise, 4), _pipeline_latents(base, noise, 4)
    assert (theirs - ours).abs().max() <= LATENT_TOLERANCE  # alpha / rank travelled in the file's metadata
    assert (untrained - ours).abs().max() > 1e-3  # the trained adapter changes the samples


def test_the_flux2_recipe_loads_as_a_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from vgrpo.config import StageConfig, load_config

    monkeypatch.setenv("VGRPO_MODELS", "/models")
    root = Path(__file__).parents[2] / "params"
    stage = {"name": "flux2-pickscore", "prompts": "prompts/flow_grpo/pickscore/train.txt", "iterations": 1}
    stage["rewards"] = [{"name": "pickscore", "options": {"path": "/models/PickScore_v1"}}]
    config = load_config([root / "base.yaml", root / "models/flux2.yaml"], stage, schema=StageConfig)
    assert config.precision.lora_base_dtype == "bf16"  # fp32 would not fit (benchmarks.memory_families)
    assert str(config.pipeline) == "/models/FLUX.2-dev"
    rollout, lora = config.rollout, config.lora
    assert (rollout.resolution, rollout.num_steps, rollout.shift, rollout.dynamic_shift) == (512, 8, None, True)
    assert (rollout.prompts_per_iteration, rollout.group_size, config.optim.lr) == (48, 16, 3e-4)
    assert lora is not None and (lora.rank, lora.alpha) == (64, 128)
    assert set(FAMILIES["flux2"].lora_targets) <= set(lora.target_modules)
    assert (config.evaluation.resolution, config.evaluation.num_steps, config.evaluation.shift) == (1024, 28, "dynamic")
