"""The Qwen-Image family on a tiny QwenImagePipeline built offline (vgrpo/models/qwen_image.py, tiny.py): the family
contract (tests/models/family_contract.py: sampling that reproduces ``QwenImagePipeline.__call__``, with packed
latents, the ``t`` timestep and the dynamic shift; rollout -> score -> update for V-GRPO and Flow-GRPO; the LoRA export
loaded by a plain ``QwenImagePipeline``; the recipe), prompts encoded as the pipeline encodes them (template prefix
dropped, each at its own length) and the VAE's per-channel normalisation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tests.models.family_contract import LARGE_DYNAMIC_SHIFT_RECIPE, PROMPTS, FamilyContract
from vgrpo.models.flux import pack_latents, unpack_latents
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.qwen_image import QwenImageAdapter, QwenImageVelocity
from vgrpo.models.tiny import tiny_qwen_image_pipeline
from vgrpo.policy import Conditioning


class TestQwenImage(FamilyContract):
    family = "qwen-image"
    noise_shape = (2, 4, 8, 8)
    # Both streams' attention trains (the one block's text output, to_add_out, reaches no image token: no gradient).
    trained = frozenset({"to_q", "to_out", "add_q_proj", "add_v_proj"})
    recipe: ClassVar[dict[str, Any]] = {
        "pipeline": "/models/Qwen-Image",
        "rollout.num_steps": 10,
        **LARGE_DYNAMIC_SHIFT_RECIPE,
    }
    tiny_pipeline = staticmethod(lambda: tiny_qwen_image_pipeline(seed=0))

    def pipeline_latents(self, pipe: Any, noise: torch.Tensor, steps: int) -> torch.Tensor:
        packed = self.call_pipeline(pipe, pack_latents(noise), steps).images
        return unpack_latents(packed, 8, 8)

    def test_adapter_encodes_decodes_and_shifts_as_the_pipeline_does(self, saved: Path) -> None:
        pipe = load_pipeline(saved)
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
