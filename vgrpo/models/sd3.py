"""SD3-family pipelines (SD3.5-M, and the embedded default): the transformer as a velocity model and the
pipeline's adapter.

diffusers' SD3 transformer predicts the rectified-flow velocity (Esser et al. 2024, "Scaling Rectified Flow
Transformers for High-Resolution Image Synthesis") and takes ``timestep = 1000 t`` (the scheduler's
``timesteps = sigmas * 1000``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from vgrpo.models.adapter import TWO_TEXT_ENCODERS, PipelineAdapter
from vgrpo.models.config import ATTENTION_BOTH_STREAMS
from vgrpo.models.geometry import FamilyGeometry, image_vae_scale
from vgrpo.policy import Conditioning

__all__ = ["SD3Adapter", "SD3Velocity"]


class SD3Velocity(nn.Module):
    """Wraps an ``SD3Transformer2DModel``: ``(latents (N, C, H, W), t (N,), cond) -> v_hat``."""

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        if cond.pooled_prompt_embeds is None:
            raise ValueError("SD3 needs pooled_prompt_embeds in the conditioning")
        dtype = next(self.transformer.parameters()).dtype
        out = self.transformer(
            hidden_states=latents.to(dtype),
            timestep=(t * 1000).to(dtype),
            encoder_hidden_states=cond.prompt_embeds.to(dtype),
            pooled_projections=cond.pooled_prompt_embeds.to(dtype),
            return_dict=False,
        )[0]
        return out.to(latents.dtype)


class SD3Adapter(PipelineAdapter):
    """A ``StableDiffusion3Pipeline``'s :class:`PipelineAdapter`: CLIP-L/G (+ T5) token embeddings and the two
    pooled CLIP vectors per prompt.

    Args:
        max_sequence_length: T5 tokens; None = 256 with T5, 0 without (its tokens would be zeros).
        options: :class:`PipelineAdapter`'s (``resolution``: None = ``transformer.config.sample_size *
            vae_scale_factor``).
    """

    name = "sd3"
    pipeline_class = "StableDiffusion3Pipeline"
    transformer_class = "SD3Transformer2DModel"
    components = TWO_TEXT_ENCODERS  # T5 (text_encoder_3) is optional: the embedded default has none
    lora_targets = ATTENTION_BOTH_STREAMS
    velocity = SD3Velocity

    @staticmethod
    def geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
        # SD3's PatchEmbed holds pos_embed_max_size patches a side (192 or 384 in the family's checkpoints).
        vae_scale_factor = image_vae_scale(vae)
        patch = int(transformer["patch_size"])
        table = transformer.get("pos_embed_max_size")
        return FamilyGeometry(
            vae_scale_factor,
            patch,
            int(transformer["sample_size"]) * vae_scale_factor,
            None if table is None else int(table) * patch * vae_scale_factor,
        )

    def __init__(self, pipe: Any, *, max_sequence_length: int | None = None, **options: Any):
        super().__init__(pipe, **options)
        # Without T5 its tokens are zeros; the embedded default drops them (0) to keep sequences short.
        self.max_sequence_length = (
            max_sequence_length if max_sequence_length is not None else (256 if pipe.text_encoder_3 else 0)
        )

    @property
    def latent_channels(self) -> int:
        return int(self.transformer.config.in_channels)

    @property
    def patch_size(self) -> int:
        return int(self.transformer.config.patch_size)

    @property
    def default_resolution(self) -> int:
        return int(self.transformer.config.sample_size) * int(self.pipe.vae_scale_factor)

    def _encode_prompt(self, prompt: str) -> tuple[Tensor, Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=[prompt],
            prompt_2=None,
            prompt_3=None,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.text_encoder_device,
        )
        return embeds[0], pooled[0]
