"""Qwen-Image pipelines (diffusers ``QwenImagePipeline``): the transformer as a velocity model and the pipeline's
adapter.

``QwenImageTransformer2DModel`` is a double-stream transformer like FLUX's: it reads 2 x 2 latent patches packed as
FLUX packs them (:func:`vgrpo.models.flux.pack_latents`), the timestep as ``t`` in [0, 1] (the pipeline passes
``timestep / 1000``), the patch grid as ``img_shapes`` and the prompts' Qwen2.5-VL token embeddings with their mask
(the pipeline drops the chat template's system prefix and pads to the batch's longest). It predicts the velocity in
this project's convention (the scheduler steps with its output unchanged). Latents are normalised per channel by the
VAE's ``latents_mean`` / ``latents_std`` (not a scaling factor), and the VAE is a video VAE: images are one frame.

Not reproduced: a scheduler with ``shift_terminal`` (stretching the grid so that its last nonzero sigma is that value;
the published Qwen-Image scheduler config sets one): :func:`vgrpo.flow.timestep_grid` has no such stretch, so
:attr:`QwenImageAdapter.pipeline_shift` refuses it and a stage samples with its configured ``rollout.shift`` /
``dynamic_shift``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.models.adapter import ONE_TEXT_ENCODER, padded_conditioning
from vgrpo.models.config import ATTENTION_BOTH_STREAMS
from vgrpo.models.flux import PackedLatentsAdapter, pack_latents, unpack_latents
from vgrpo.models.geometry import FamilyGeometry
from vgrpo.policy import Conditioning

__all__ = ["QWEN_IMAGE_DEFAULT_SAMPLE_SIZE", "QwenImageAdapter", "QwenImageVelocity"]

QWEN_IMAGE_DEFAULT_SAMPLE_SIZE = 128
"""``QwenImagePipeline.default_sample_size``: its default side in latent pixels (1024 px at the VAE's 8x)."""


class QwenImageVelocity(nn.Module):
    """Wraps a ``QwenImageTransformer2DModel``: ``(latents (N, C, H, W), t (N,) in [0, 1], cond) -> v_hat``."""

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        if cond.prompt_mask is None:
            raise ValueError(
                "Qwen-Image needs the prompts' token mask (Conditioning.prompt_mask, set by "
                "QwenImageAdapter.encode_prompts); classifier-free guidance (evaluation.guidance_scale) does not "
                "carry it: sample Qwen-Image without CFG"
            )
        if self.transformer.config.guidance_embeds:  # type: ignore[union-attr]
            raise ValueError("guidance-distilled Qwen-Image transformers (guidance_embeds) are not supported")
        n, _, h, w = latents.shape
        dtype = next(self.transformer.parameters()).dtype
        out = self.transformer(
            hidden_states=pack_latents(latents.to(dtype)),
            timestep=t.to(dtype),
            encoder_hidden_states=cond.prompt_embeds.to(dtype),
            encoder_hidden_states_mask=cond.prompt_mask,
            img_shapes=[[(1, h // 2, w // 2)]] * n,
            return_dict=False,
        )[0]
        return unpack_latents(out, h, w).to(latents.dtype)


class QwenImageAdapter(PackedLatentsAdapter):
    """A ``QwenImagePipeline``'s :class:`PipelineAdapter`: each prompt's Qwen2.5-VL token embeddings at its own
    length (no pooled vector), spatial ``(C, H, W)`` latents (packing happens in :class:`QwenImageVelocity`), the
    VAE's per-channel normalisation.

    Args:
        max_sequence_length: text tokens per prompt after the template's prefix (the pipeline's default: 512).
        options: :class:`PipelineAdapter`'s (``resolution``: None = ``default_sample_size * vae_scale_factor``,
            1024 for Qwen-Image).
    """

    name = "qwen-image"
    pipeline_class = "QwenImagePipeline"
    transformer_class = "QwenImageTransformer2DModel"
    components = ONE_TEXT_ENCODER
    lora_targets = ATTENTION_BOTH_STREAMS  # double-stream joint attention, as SD3's and FLUX's
    velocity = QwenImageVelocity

    @staticmethod
    def geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
        # A video VAE: 2 ** len(temperal_downsample) spatially (QwenImagePipeline); FLUX's 2 x 2 packing, rotary
        # positions.
        vae_scale_factor = int(2 ** len(vae["temperal_downsample"]))
        return FamilyGeometry(vae_scale_factor, 2, QWEN_IMAGE_DEFAULT_SAMPLE_SIZE * vae_scale_factor, None)

    def __init__(self, pipe: Any, *, max_sequence_length: int = 512, **options: Any):
        super().__init__(pipe, **options)
        self.max_sequence_length = max_sequence_length

    def pipeline_shift(self, num_steps: int | None = None) -> float | None:
        terminal = self.pipe.scheduler.config.get("shift_terminal")
        if terminal:
            raise ValueError(
                f"the pipeline's scheduler stretches its sigmas to shift_terminal={terminal}, which vgrpo's grid "
                "does not reproduce: set rollout.shift (or dynamic_shift) and evaluation.shift explicitly"
            )
        return super().pipeline_shift(num_steps)

    def _encode_prompt(self, prompt: str) -> tuple[Tensor, ...]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=[prompt], device=self.text_encoder_device, max_sequence_length=self.max_sequence_length
        )
        return (embeds[0],)

    def _batch(self, rows: Sequence[tuple[Tensor, ...]]) -> Conditioning:
        return padded_conditioning([r[0] for r in rows])

    def _normalisation(self, like: Tensor) -> tuple[Tensor, Tensor]:
        cfg = self.vae.config
        shape = (1, int(cfg.z_dim), 1, 1)
        mean = torch.tensor(cfg.latents_mean, device=like.device, dtype=like.dtype).view(shape)
        std = torch.tensor(cfg.latents_std, device=like.device, dtype=like.dtype).view(shape)
        return mean, std

    def encode_images(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Images in [-1, 1] ``(N, 3, H, W)`` -> latents normalised per channel, ``(z - mean) / std`` (one frame)."""
        z = self.vae.encode(images.to(self.vae.dtype)[:, :, None]).latent_dist.sample(generator=generator)[:, :, 0]
        mean, std = self._normalisation(z)
        return (z - mean) / std

    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latents -> images in [-1, 1] ``(N, 3, H, W)``, float32 (``QwenImagePipeline``'s decode)."""
        mean, std = self._normalisation(latents)
        z = (latents * std + mean).to(self.vae.dtype)[:, :, None]
        return self.vae.decode(z, return_dict=False)[0][:, :, 0].float()
