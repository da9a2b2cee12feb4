"""FLUX.1 pipelines: the transformer as a velocity model, the latent packing it needs, and the pipeline's adapter.

``FluxTransformer2DModel`` reads a sequence of 2 x 2 latent patches (``(N, H/2 * W/2, 4C)``, diffusers
``FluxPipeline._pack_latents``), their positions as 3-axis rotary ids, zeros for the text tokens' ids, the
timestep as ``t`` in [0, 1] (``FluxPipeline`` passes ``timestep / 1000``; the model multiplies by 1000 itself)
and, for guidance-distilled checkpoints (FLUX.1-dev, the FLUX model of V-GRPO's recipe, Tang et al. 2026,
App. A.1), the distilled guidance scale as an embedding. :class:`FluxVelocity` hides all of that behind the
policy interface every algorithm uses: spatial latents ``(N, C, H, W)`` in, velocity of the same shape out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.models.adapter import TWO_TEXT_ENCODERS, PipelineAdapter
from vgrpo.models.config import ATTENTION_BOTH_STREAMS
from vgrpo.models.geometry import FamilyGeometry, image_vae_scale
from vgrpo.policy import Conditioning

__all__ = [
    "FluxAdapter",
    "FluxVelocity",
    "PackedLatentsAdapter",
    "latent_image_ids",
    "pack_latents",
    "text_ids",
    "unpack_latents",
]

FLUX_DEFAULT_SAMPLE_SIZE = 128
"""``FluxPipeline.default_sample_size``: its default side in latent pixels (1024 px at the VAE's 8x)."""

FLUX_GUIDANCE = 3.5
"""FLUX.1-dev's default distilled guidance (diffusers ``FluxPipeline.__call__``), used for rollouts and sampling."""


def pack_latents(latents: Tensor) -> Tensor:
    """``(N, C, H, W)`` -> ``(N, H/2 * W/2, 4C)``: 2 x 2 patches in row-major order, each patch's values
    channel-major (diffusers ``FluxPipeline._pack_latents``)."""
    n, c, h, w = latents.shape
    if h % 2 or w % 2:
        raise ValueError(f"FLUX packs 2 x 2 patches: latent height and width must be even, got {h} x {w}")
    x = latents.view(n, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)  # (N, H/2, W/2, C, 2, 2)
    return x.reshape(n, (h // 2) * (w // 2), c * 4)


def unpack_latents(packed: Tensor, height: int, width: int) -> Tensor:
    """Inverse of :func:`pack_latents`: ``(N, H/2 * W/2, 4C)`` -> ``(N, C, H, W)``.

    ``height`` and ``width`` are the latent sizes ``H, W`` (diffusers' ``_unpack_latents`` takes pixels and
    the VAE factor instead).
    """
    n, tokens, d = packed.shape
    if tokens != (height // 2) * (width // 2) or d % 4:
        raise ValueError(f"cannot unpack {tuple(packed.shape)} into {height} x {width} latents")
    x = packed.view(n, height // 2, width // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)  # (N, C, H/2, 2, W/2, 2)
    return x.reshape(n, d // 4, height, width)


def latent_image_ids(height: int, width: int, *, device: torch.device | None = None, dtype: torch.dtype) -> Tensor:
    """Rotary position ids of the packed tokens of ``height x width`` latents: ``(H/2 * W/2, 3)`` rows
    ``(0, row, col)`` (diffusers ``FluxPipeline._prepare_latent_image_ids``)."""
    rows, cols = height // 2, width // 2
    ids = torch.zeros(rows, cols, 3)
    ids[..., 1] = torch.arange(rows)[:, None]
    ids[..., 2] = torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3).to(device=device, dtype=dtype)


def text_ids(length: int, *, device: torch.device | None = None, dtype: torch.dtype) -> Tensor:
    """Position ids of the text tokens: all zeros ``(L, 3)``, so rotary embedding leaves them unrotated
    (``FluxPipeline.encode_prompt``)."""
    return torch.zeros(length, 3, device=device, dtype=dtype)


class FluxVelocity(nn.Module):
    """Wraps a ``FluxTransformer2DModel``: ``(latents (N, C, H, W), t (N,) in [0, 1], cond) -> v_hat (N, C, H, W)``.

    Attributes:
        guidance_scale: the distilled guidance fed to the guidance embedding (only when the transformer has one,
            ``config.guidance_embeds``; FLUX.1-dev does, FLUX.1-schnell does not).
    """

    def __init__(self, transformer: nn.Module, *, guidance_scale: float = FLUX_GUIDANCE):
        super().__init__()
        self.transformer = transformer
        self.guidance_scale = guidance_scale

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        if cond.pooled_prompt_embeds is None:
            raise ValueError("FLUX needs pooled_prompt_embeds (the CLIP pooled vector) in the conditioning")
        _, _, h, w = latents.shape
        dtype = next(self.transformer.parameters()).dtype
        ids = latent_image_ids(h, w, device=latents.device, dtype=dtype)
        out = self._transformer_out(
            pack_latents(latents.to(dtype)), ids, t, cond.prompt_embeds, cond.pooled_prompt_embeds
        )
        return unpack_latents(out, h, w).to(latents.dtype)

    def _transformer_out(self, tokens: Tensor, img_ids: Tensor, t: Tensor, text: Tensor, pooled: Tensor) -> Tensor:
        """The transformer's output for packed image ``tokens`` (in its dtype) at rotary ids ``img_ids``, with the
        text tokens, the pooled vector and the distilled guidance as ``FluxPipeline`` passes them; shared with
        FLUX.1-Kontext, whose ``tokens`` carry the condition image's too."""
        dtype, device = tokens.dtype, tokens.device
        guidance = None
        if self.transformer.config.guidance_embeds:  # type: ignore[union-attr]
            # float32 as in FluxPipeline; the transformer casts it to its own dtype.
            guidance = torch.full((tokens.shape[0],), self.guidance_scale, device=device, dtype=torch.float32)
        return self.transformer(
            hidden_states=tokens,
            timestep=t.to(dtype),
            guidance=guidance,
            pooled_projections=pooled.to(dtype),
            encoder_hidden_states=text.to(dtype),
            txt_ids=text_ids(text.shape[1], device=device, dtype=dtype),
            img_ids=img_ids,
            return_dict=False,
        )[0]


class PackedLatentsAdapter(PipelineAdapter):
    """The :class:`PipelineAdapter` properties of a family whose transformer reads FLUX-packed 2 x 2 latent patches
    and whose pipeline has a ``default_sample_size`` (FLUX.1, Qwen-Image)."""

    @property
    def latent_channels(self) -> int:
        return int(self.transformer.config.in_channels) // 4  # the transformer reads packed 2 x 2 patches

    @property
    def default_resolution(self) -> int:
        return int(self.pipe.default_sample_size) * int(self.pipe.vae_scale_factor)


class FluxAdapter(PackedLatentsAdapter):
    """What training and evaluation need from a ``FluxPipeline`` (:class:`PipelineAdapter`): T5 token embeddings
    and the CLIP pooled vector per prompt, spatial ``(C, H, W)`` latents (packing happens in :class:`FluxVelocity`).

    Args:
        pipe: a ``FluxPipeline``.
        max_sequence_length: T5 tokens per prompt; None = the T5 tokenizer's ``model_max_length``, at most 512
            (the pipeline's default and limit).
        options: :class:`PipelineAdapter`'s (``resolution``: image side in pixels, a multiple of twice the VAE
            factor; None = the pipeline's default, ``default_sample_size * vae_scale_factor``, 1024 for FLUX.1).
    """

    name = "flux"
    pipeline_class = "FluxPipeline"
    transformer_class = "FluxTransformer2DModel"
    components = TWO_TEXT_ENCODERS
    lora_targets = ATTENTION_BOTH_STREAMS  # the single-stream blocks have q/k/v but no to_out
    velocity = FluxVelocity

    @staticmethod
    def geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
        # FLUX packs 2 x 2 latent patches itself (its transformer's patch_size is 1) and has rotary positions: no table.
        vae_scale_factor = image_vae_scale(vae)
        return FamilyGeometry(vae_scale_factor, 2, FLUX_DEFAULT_SAMPLE_SIZE * vae_scale_factor, None)

    def __init__(self, pipe: Any, *, max_sequence_length: int | None = None, **options: Any):
        super().__init__(pipe, **options)
        self.max_sequence_length = (
            max_sequence_length if max_sequence_length is not None else min(512, int(pipe.tokenizer_2.model_max_length))
        )

    def _encode_prompt(self, prompt: str) -> tuple[Tensor, Tensor]:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=[prompt],
            prompt_2=None,
            max_sequence_length=self.max_sequence_length,
            device=self.text_encoder_device,
        )
        return embeds[0], pooled[0]
