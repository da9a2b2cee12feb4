"""FLUX.1-Kontext (diffusers ``FluxKontextPipeline``): FLUX.1 that edits a condition (source) image.

Kontext is FLUX.1's transformer (``FluxTransformer2DModel``) trained to read a second image in its sequence. The
pipeline's conventions, as ``FluxKontextPipeline.__call__`` feeds them and this module reproduces them:

* the condition image is resized, mapped to [-1, 1] (the pipeline's ``image_processor``), VAE-encoded to the
  posterior's **mode** (``_encode_vae_image``: ``sample_mode="argmax"``) and normalised as FLUX's latents,
  ``(z - shift_factor) * scaling_factor``; those spatial latents are what :class:`vgrpo.policy.Conditioning`
  carries (``image_latents``), encoded once per image and resolution and cached like the prompts' embeddings;
* at every forward the noisy latents and the condition latents are each packed into 2 x 2 patch tokens and
  **concatenated along the sequence** (noisy first); the condition tokens' rotary ids are ``(1, row, col)``, the
  noisy tokens' ``(0, row, col)`` (``prepare_latents``); the transformer's output is cut back to the noisy tokens;
* timestep ``t`` in [0, 1], the distilled guidance as an embedding, T5 tokens + the CLIP pooled vector, as FLUX.1
  (:mod:`vgrpo.models.flux`); the sampling shift is FLUX.1's resolution-dependent one over the *noisy* tokens only
  (the pipeline's ``image_seq_len = latents.shape[1]``);
* without a condition image the pipeline is FLUX.1 text-to-image, and so is :class:`FluxKontextVelocity`.

Resolution: ``FluxKontextPipeline.__call__`` picks the condition image's size from ``PREFERRED_KONTEXT_RESOLUTIONS``
(``_auto_resize``) and the output's from ``max_area``. Training batches need one size, so here (as Flow-GRPO's
Kontext training does) the condition image is resized to the adapter's square ``resolution``, the output's size;
a plain pipeline reproduces it with ``height = width = max_area ** 0.5 = resolution`` and ``_auto_resize=False`` on
an image of that size.

Guidance: :data:`KONTEXT_GUIDANCE` = 2.5, the FLUX.1-Kontext-dev model card's and Flow-GRPO's Kontext recipe's
(``FluxKontextPipeline.__call__``'s own default is FLUX.1's 3.5); an exported LoRA samples the project's images in a
plain pipeline called with ``guidance_scale=2.5``.

Prompt rows name their condition image under :data:`vgrpo.prompts.CONDITION_IMAGE_KEY` (``image``, Flow-GRPO's key),
a path relative to the prompt file (:func:`vgrpo.prompts.load_prompts` makes it absolute); the stage's rollouts and
evaluations encode rows with :meth:`FluxKontextAdapter.encode_rows`, and the rewards receive the same rows
(:class:`vgrpo.rewards.source.SourceSimilarityReward` compares each sample with its source image).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.models.flux import FluxAdapter, FluxVelocity, latent_image_ids, pack_latents, unpack_latents
from vgrpo.models.prompt_cache import PromptEmbeddingCache
from vgrpo.policy import Conditioning
from vgrpo.prompts import CONDITION_IMAGE_KEY

__all__ = [
    "CONDITION_IMAGE_KEY",
    "KONTEXT_GUIDANCE",
    "FluxKontextAdapter",
    "FluxKontextVelocity",
    "condition_image_ids",
    "load_condition_image",
]

KONTEXT_GUIDANCE = 2.5
"""FLUX.1-Kontext-dev's distilled guidance for rollouts and sampling (module docstring)."""


def condition_image_ids(height: int, width: int, *, device: torch.device | None = None, dtype: torch.dtype) -> Tensor:
    """Rotary ids of the packed condition tokens of ``height x width`` latents: ``(H/2 * W/2, 3)`` rows
    ``(1, row, col)`` (``FluxKontextPipeline.prepare_latents``: the noisy tokens' ids with the first axis 1)."""
    ids = latent_image_ids(height, width, device=device, dtype=dtype)
    ids[:, 0] = 1
    return ids


def load_condition_image(path: str | Path) -> Any:
    """The image at ``path`` as an RGB ``PIL.Image`` (as Flow-GRPO's Kontext dataset reads its source images)."""
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


class FluxKontextVelocity(FluxVelocity):
    """Wraps FLUX.1-Kontext's ``FluxTransformer2DModel``: ``(latents (N, C, H, W), t (N,), cond) -> v_hat`` with the
    condition latents ``cond.image_latents`` ``(N, C, h, w)`` appended to the sequence (module docstring); FLUX.1's
    :class:`FluxVelocity` when the conditioning has none."""

    def __init__(self, transformer: nn.Module, *, guidance_scale: float = KONTEXT_GUIDANCE):
        super().__init__(transformer, guidance_scale=guidance_scale)

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        image = cond.image_latents
        if image is None:
            return super().forward(latents, t, cond)
        if cond.pooled_prompt_embeds is None:
            raise ValueError("FLUX.1-Kontext needs pooled_prompt_embeds (the CLIP pooled vector) in the conditioning")
        _, _, h, w = latents.shape
        dtype, device = next(self.transformer.parameters()).dtype, latents.device
        noisy = pack_latents(latents.to(dtype))
        tokens = torch.cat([noisy, pack_latents(image.to(device=device, dtype=dtype))], dim=1)
        ids = torch.cat(
            [
                latent_image_ids(h, w, device=device, dtype=dtype),
                condition_image_ids(image.shape[2], image.shape[3], device=device, dtype=dtype),
            ]
        )
        out = self._transformer_out(tokens, ids, t, cond.prompt_embeds, cond.pooled_prompt_embeds)
        return unpack_latents(out[:, : noisy.shape[1]], h, w).to(latents.dtype)


class FluxKontextAdapter(FluxAdapter):
    """A ``FluxKontextPipeline``'s adapter: FLUX.1's prompts and latents (:class:`FluxAdapter`) plus each row's
    condition image encoded as the pipeline encodes it, at :attr:`resolution`, cached per ``(path, resolution)``
    in CPU memory under the prompt cache's budget (the VAE is frozen).

    Args:
        pipe: a ``FluxKontextPipeline``.
        options: :class:`FluxAdapter`'s.
    """

    # FLUX.1's transformer class, components, LoRA targets and geometry (FluxKontextPipeline.default_sample_size is
    # FLUX.1's); a lookup by the transformer class finds FLUX.1 (vgrpo.models.registry.family_for_transformer).
    name = "flux-kontext"
    pipeline_class = "FluxKontextPipeline"
    velocity = FluxKontextVelocity

    def __init__(self, pipe: Any, **options: Any):
        super().__init__(pipe, **options)
        self.image_cache = PromptEmbeddingCache(self.prompt_cache.max_bytes)  # shared by resized copies

    @torch.no_grad()
    def encode_condition_images(self, images: Sequence[Any]) -> Tensor:
        """Normalised VAE latents ``(N, C, H/f, W/f)`` of condition images (paths or PIL images) at
        :attr:`resolution`, on :attr:`device` (``FluxKontextPipeline``'s encoding: the posterior's mode)."""
        rows = []
        for image in images:
            if isinstance(image, (str, Path)):
                key = f"{Path(image)}@{self.resolution}"
                hit = self.image_cache.get(key)
                if hit is None:
                    hit = self.image_cache.put(key, (self._encode_image(load_condition_image(image)),))
                rows.append(hit[0])
            else:
                rows.append(self._encode_image(image).cpu())
        return torch.stack(rows).to(self.device)

    def _encode_image(self, image: Any) -> Tensor:
        side = self.resolution
        pixels = self.pipe.image_processor.preprocess(image, height=side, width=side)  # resized, in [-1, 1]
        z = self.vae.encode(pixels.to(device=self.vae.device, dtype=self.vae.dtype)).latent_dist.mode()
        cfg = self.vae.config
        return ((z - cfg.shift_factor) * cfg.scaling_factor)[0]

    def encode_rows(self, rows: Sequence[Mapping[str, Any]]) -> Conditioning:
        """Conditioning for prompt rows: their prompts (:meth:`encode_prompts`) and, when the rows name condition
        images (:data:`CONDITION_IMAGE_KEY`), those images' latents; rows of one batch all name one or none."""
        cond = self.encode_prompts([str(r["prompt"]) for r in rows])
        images = [r.get(CONDITION_IMAGE_KEY) for r in rows]
        named = [i is not None for i in images]
        if not any(named):
            return cond
        if not all(named):
            raise ValueError(
                f"{sum(named)} of {len(rows)} prompt rows name a condition image ({CONDITION_IMAGE_KEY!r}): a batch of "
                "FLUX.1-Kontext prompts edits images in every row or in none"
            )
        return replace(cond, image_latents=self.encode_condition_images(images))
