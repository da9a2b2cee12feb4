"""The FLUX.2 family on a tiny Flux2Pipeline built offline (vgrpo/models/flux2.py, tiny_flux2.py): the family contract
(tests/models/family_contract.py: sampling that reproduces ``Flux2Pipeline.__call__`` at FLUX.2's step-dependent
shift; rollout -> score -> update for V-GRPO and Flow-GRPO; the LoRA export loaded by a plain ``Flux2Pipeline``; the
recipe), prompts encoded as the pipeline encodes them (stacked Mistral-3 hidden states at a fixed length), and latents
patchified and normalised by the VAE's batch-norm statistics as the pipeline does."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tests.models.family_contract import LARGE_DYNAMIC_SHIFT_RECIPE, PROMPTS, FamilyContract
from vgrpo.models.flux2 import Flux2Adapter, Flux2Velocity, empirical_shift_mu, image_ids, patchify, text_ids
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.tiny_flux2 import TINY_FLUX2_TOKENS, tiny_flux2_pipeline


class TestFlux2(FamilyContract):
    family = "flux2"
    noise_shape = (2, 16, 4, 4)
    # Both streams' attention and the single-stream block's fused projection train.
    trained = frozenset({"to_q", "to_out", "add_q_proj", "add_v_proj", "to_qkv_mlp_proj"})
    recipe: ClassVar[dict[str, Any]] = {
        "pipeline": "/models/FLUX.2-dev",
        "rollout.num_steps": 8,
        **LARGE_DYNAMIC_SHIFT_RECIPE,
    }
    extra_lora_targets = ("ff.linear_in", "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out")
    tiny_pipeline = staticmethod(lambda: tiny_flux2_pipeline(seed=0))

    def pipeline_latents(self, pipe: Any, noise: torch.Tensor, steps: int) -> torch.Tensor:
        """``Flux2Pipeline.__call__``'s final latents from ``noise`` (patchified ``(N, C, 4, 4)``), unflattened."""
        packed = self.call_pipeline(pipe, noise, steps, max_sequence_length=TINY_FLUX2_TOKENS).images
        return packed.permute(0, 2, 1).reshape(noise.shape)

    @pytest.mark.parametrize(("tokens", "steps"), [(16, 3), (16, 28), (1024, 8), (4096, 50), (4301, 8), (16384, 28)])
    def test_the_empirical_shift_is_the_pipelines(self, tokens: int, steps: int) -> None:
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        assert empirical_shift_mu(tokens, steps) == pytest.approx(compute_empirical_mu(tokens, steps), abs=1e-12)

    def test_adapter_encodes_decodes_and_shifts_as_the_pipeline_does(self, saved: Path) -> None:
        from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline

        pipe = load_pipeline(saved)
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
