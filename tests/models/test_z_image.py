"""The Z-Image family on a tiny ZImagePipeline built offline (vgrpo/models/z_image.py, tiny.py): the family contract
(tests/models/family_contract.py: sampling that reproduces ``ZImagePipeline.__call__``, with its ``1 - t`` timestep,
negated output and shifted sigmas; rollout -> score -> update for V-GRPO and Flow-GRPO; the LoRA export loaded by a
plain ``ZImagePipeline``; the recipe), prompts encoded as the pipeline encodes them (each at its own length), and the
merged export."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tests.models.family_contract import PROMPTS, FamilyContract
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny import tiny_z_image_pipeline
from vgrpo.models.z_image import ZImageAdapter, ZImageVelocity, captions
from vgrpo.policy import Conditioning


class TestZImage(FamilyContract):
    family = "z-image"
    noise_shape = (2, 4, 8, 8)
    trained = frozenset({"to_q", "to_k", "to_v", "to_out"})
    shift = 3.0
    recipe: ClassVar[dict[str, Any]] = {
        "pipeline": "/models/Z-Image-Turbo",
        "rollout.resolution": 512,
        "rollout.num_steps": 6,
        "rollout.shift": 3.0,
        "rollout.dynamic_shift": False,
        "rollout.prompts_per_iteration": 48,
        "rollout.group_size": 16,
        "optim.lr": 3e-4,
    }
    tiny_pipeline = staticmethod(lambda: tiny_z_image_pipeline(seed=0))

    def pipeline_latents(self, pipe: Any, noise: torch.Tensor, steps: int) -> torch.Tensor:
        return self.call_pipeline(pipe, noise.clone(), steps, guidance_scale=0.0).images  # Turbo samples without CFG

    def after_export(self, saved: Path, lora: Path, noise: torch.Tensor, ours: torch.Tensor) -> None:
        # Merge-and-export (python -m vgrpo.cli export) writes a ZImagePipeline that samples base + LoRA.
        from diffusers import ZImagePipeline

        from vgrpo.cli import main

        out = lora.parent / "merged"
        assert main(["export", str(saved), "--lora", str(lora), "--out", str(out)]) == 0
        merged = load_pipeline(out)
        assert isinstance(merged, ZImagePipeline) and not getattr(merged.transformer, "peft_config", None)
        assert (self.pipeline_latents(merged, noise, 4) - ours).abs().max() <= self.tolerance

    def test_adapter_encodes_each_prompt_at_its_own_length_as_the_pipeline_does(self, saved: Path) -> None:
        pipe = load_pipeline(saved)
        adapter, policy = build_adapter(pipe, resolution=16)
        assert isinstance(adapter, ZImageAdapter) and isinstance(policy, ZImageVelocity)
        assert adapter.latent_shape == (4, 8, 8) and adapter.scheduler_shift == 3.0
        assert adapter.default_resolution == 1024
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

    def test_z_image_lora_targets_select_every_attention_projection(self) -> None:
        transformer = tiny_z_image_pipeline(seed=0).transformer
        names = [n for n, _ in transformer.named_modules()]
        for target in FAMILIES["z-image"].lora_targets:
            assert sum(n.endswith(f"attention.{target}") for n in names) == 3  # refiner x 2 + one main layer
