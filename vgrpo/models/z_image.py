"""Z-Image pipelines (diffusers ``ZImagePipeline``): the transformer as a velocity model and the pipeline's adapter.

``ZImageTransformer2DModel`` is a single-stream transformer that reads lists: one ``(C, 1, H, W)`` latent per
sample and one caption per sample at its own length (the Qwen3 text encoder's penultimate hidden states of the
prompt's tokens, padding dropped: ``ZImagePipeline._encode_prompt``). Its conventions differ from SD3's and FLUX's:

* the timestep it reads is ``1 - t`` (``(1000 - timestep) / 1000`` in the pipeline: 0 at pure noise);
* it predicts the negated velocity: the pipeline steps the scheduler with ``-output``, so in this project's
  convention (``x_t = (1 - t) x_0 + t eps``, ``v = eps - x_0``) ``v_hat = -output``.

:class:`ZImageVelocity` hides that behind the policy interface every algorithm uses (spatial latents in, velocity of
the same shape out); the captions travel padded to the batch's longest with :attr:`Conditioning.prompt_mask`
marking each prompt's own tokens. Sampling: ``ZImagePipeline`` passes sigmas ``linspace(1, 1/T, T)`` (plus the
final 0) through the scheduler's shift, Z-Image-Turbo's a static 3 -- the ``uniform`` grid of
:func:`vgrpo.flow.timestep_grid`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.models.adapter import ONE_TEXT_ENCODER, PipelineAdapter, padded_conditioning
from vgrpo.models.geometry import FamilyGeometry, image_vae_scale
from vgrpo.policy import Conditioning

__all__ = ["Z_IMAGE_DEFAULT_RESOLUTION", "ZImageAdapter", "ZImageVelocity", "captions"]

Z_IMAGE_DEFAULT_RESOLUTION = 1024
"""``ZImagePipeline.__call__``'s default height and width in pixels."""


def captions(cond: Conditioning) -> list[Tensor]:
    """Each prompt's own token embeddings ``(L_i, D)``: the rows of ``cond.prompt_embeds`` cut by its mask.

    Raises:
        ValueError: ``cond`` has no mask. Padding read as tokens would change every sample silently; the guided
            sampler (:class:`vgrpo.samplers.ClassifierFreeGuidance`, ``evaluation.guidance_scale``) builds its
            conditioning without one, so Z-Image samples without CFG here (as Z-Image-Turbo does).
    """
    if cond.prompt_mask is None:
        raise ValueError(
            "Z-Image needs the prompts' token mask (Conditioning.prompt_mask, set by ZImageAdapter.encode_prompts); "
            "classifier-free guidance (evaluation.guidance_scale) does not carry it: sample Z-Image without CFG"
        )
    return [embeds[mask] for embeds, mask in zip(cond.prompt_embeds, cond.prompt_mask, strict=True)]


class ZImageVelocity(nn.Module):
    """Wraps a ``ZImageTransformer2DModel``: ``(latents (N, C, H, W), t (N,) in [0, 1], cond) -> v_hat (N, C, H, W)``
    (module docstring: the timestep is fed as ``1 - t`` and the output negated)."""

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        if len(cond) != latents.shape[0]:
            raise ValueError(f"conditioning has {len(cond)} rows for {latents.shape[0]} latents")
        dtype = next(self.transformer.parameters()).dtype
        frames = list(latents.to(dtype).unsqueeze(2).unbind(0))  # (C, 1, H, W) each: one frame per image
        out = self.transformer(frames, (1 - t).to(dtype), [c.to(dtype) for c in captions(cond)], return_dict=False)[0]
        return -torch.stack(out).squeeze(2).to(latents.dtype)


class ZImageAdapter(PipelineAdapter):
    """A ``ZImagePipeline``'s :class:`PipelineAdapter`: each prompt's Qwen3 token embeddings at its own length (no
    pooled vector), spatial ``(C, H, W)`` latents, the FLUX VAE's normalisation.

    Args:
        max_sequence_length: text tokens per prompt, the chat template's included (the pipeline's default: 512).
        options: :class:`PipelineAdapter`'s (``resolution``: None = 1024, ``ZImagePipeline``'s default).
    """

    name = "z-image"
    pipeline_class = "ZImagePipeline"
    transformer_class = "ZImageTransformer2DModel"
    components = ONE_TEXT_ENCODER
    lora_targets = ("to_q", "to_k", "to_v", "to_out.0")  # one stream: no context projections
    velocity = ZImageVelocity

    @staticmethod
    def geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
        # The transformer patchifies with all_patch_size[0] (the pipeline's default patch_size=2); rotary positions.
        return FamilyGeometry(
            image_vae_scale(vae), int(transformer["all_patch_size"][0]), Z_IMAGE_DEFAULT_RESOLUTION, None
        )

    def __init__(self, pipe: Any, *, max_sequence_length: int = 512, **options: Any):
        super().__init__(pipe, **options)
        self.max_sequence_length = max_sequence_length

    @property
    def latent_channels(self) -> int:
        return int(self.transformer.config.in_channels)

    @property
    def patch_size(self) -> int:
        return int(self.transformer.config.all_patch_size[0])

    @property
    def default_resolution(self) -> int:
        return Z_IMAGE_DEFAULT_RESOLUTION

    def _encode_prompt(self, prompt: str) -> tuple[Tensor, ...]:
        embeds = self.pipe.encode_prompt(
            prompt=[prompt],
            device=self.text_encoder_device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )[0]
        return (embeds[0],)

    def _batch(self, rows: Sequence[tuple[Tensor, ...]]) -> Conditioning:
        return padded_conditioning([r[0] for r in rows])
