"""FLUX.2 pipelines (diffusers ``Flux2Pipeline``): the transformer as a velocity model and the pipeline's adapter.

FLUX.2 diffuses in a different latent space from FLUX.1. Its VAE (``AutoencoderKLFlux2``) encodes to ``C`` channels
(32 for FLUX.2-dev) at 8x; the pipeline patchifies 2 x 2 latent pixels into channels
(``Flux2Pipeline._patchify_latents``: ``(N, 4C, H/2, W/2)``, each patch channel-major) and normalises those ``4C``
channels by the VAE's batch-norm running statistics, ``(z - running_mean) / sqrt(running_var + batch_norm_eps)``. The
noise is drawn in that patchified space and the transformer reads its pixels as tokens in row-major order
(``_pack_latents``: a plain reshape, no 2 x 2 packing of its own). So this module's spatial latents, the policy's
``(C, H, W)``, are the patchified normalised ones (``(128, 64, 64)`` at 1024 px for FLUX.2-dev), and
:class:`Flux2Velocity` only flattens them.

The transformer's other conventions, as ``Flux2Pipeline.__call__`` feeds them:

* the timestep as ``t`` in [0, 1] (the pipeline passes ``timestep / 1000``; the model multiplies by 1000);
* the distilled guidance scale as an embedding (FLUX.2-dev is guidance-distilled: ``guidance_embeds``; 4 by default);
* 4-axis rotary ids ``(T, H, W, L)``: ``(0, row, col, 0)`` for image tokens, ``(0, 0, 0, l)`` for the text's;
* the output is the velocity in this project's convention (``x_t = (1 - t) x_0 + t eps``, ``v = eps - x_0``): the
  pipeline steps the scheduler with it unchanged.

Text: the Mistral-3 text encoder's hidden states after layers 10, 20 and 30, stacked per token (``(L, 3D)``), every
prompt padded to ``max_sequence_length`` tokens (no mask reaches the transformer), after the pipeline's system message.

Sampling: ``Flux2Pipeline`` passes sigmas ``linspace(1, 1/T, T)`` with ``mu = compute_empirical_mu(image tokens, T)``
(FLUX.2's fit, which depends on the number of steps ``T`` as well as the resolution) to an exponentially shifted
scheduler: the ``uniform`` grid of :func:`vgrpo.flow.timestep_grid` at the static shift ``e^mu``
(:meth:`Flux2Adapter.dynamic_shift`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.models.adapter import ONE_TEXT_ENCODER, PipelineAdapter
from vgrpo.models.config import ATTENTION_BOTH_STREAMS
from vgrpo.models.geometry import FamilyGeometry, image_vae_scale
from vgrpo.policy import Conditioning

__all__ = [
    "FLUX2_DEFAULT_SAMPLE_SIZE",
    "FLUX2_GUIDANCE",
    "Flux2Adapter",
    "Flux2Velocity",
    "empirical_shift_mu",
    "image_ids",
    "patchify",
    "text_ids",
    "unpatchify",
]

FLUX2_DEFAULT_SAMPLE_SIZE = 128
"""``Flux2Pipeline.default_sample_size``: its default side in latent pixels (1024 px at the VAE's 8x)."""

FLUX2_GUIDANCE = 4.0
"""``Flux2Pipeline.__call__``'s default distilled guidance, used for rollouts and sampling."""


def empirical_shift_mu(image_seq_len: int, num_steps: int) -> float:
    """FLUX.2's ``mu`` for ``image_seq_len`` image tokens and a ``num_steps``-step grid (diffusers
    ``compute_empirical_mu``, from Black Forest Labs' ``flux2/sampling.py``): two lines in the token count, fitted at
    10 and 200 steps, interpolated linearly in the steps; above 4300 tokens the 200-step line alone."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    m_200 = a2 * image_seq_len + b2
    if image_seq_len > 4300:
        return float(m_200)
    m_10 = a1 * image_seq_len + b1
    slope = (m_200 - m_10) / 190.0
    return float(slope * num_steps + (m_200 - 200.0 * slope))


def image_ids(height: int, width: int, *, device: torch.device | None = None) -> Tensor:
    """Rotary ids of ``height x width`` latent tokens: ``(H * W, 4)`` rows ``(0, row, col, 0)`` in row-major order
    (``Flux2Pipeline._prepare_latent_ids``; integer, as the pipeline's)."""
    rows = torch.arange(height).repeat_interleave(width)
    cols = torch.arange(width).repeat(height)
    zeros = torch.zeros_like(rows)
    return torch.stack([zeros, rows, cols, zeros], dim=1).to(device)


def text_ids(length: int, *, device: torch.device | None = None) -> Tensor:
    """Rotary ids of ``length`` text tokens: ``(L, 4)`` rows ``(0, 0, 0, l)`` (``Flux2Pipeline._prepare_text_ids``)."""
    ids = torch.zeros(length, 4, dtype=torch.long)
    ids[:, 3] = torch.arange(length)
    return ids.to(device)


class Flux2Velocity(nn.Module):
    """Wraps a ``Flux2Transformer2DModel``: ``(latents (N, C, H, W), t (N,) in [0, 1], cond) -> v_hat (N, C, H, W)``
    (module docstring: the latents are the patchified normalised ones; tokens are their pixels).

    Attributes:
        guidance_scale: the distilled guidance fed to the guidance embedding (only when the transformer has one,
            ``config.guidance_embeds``).
    """

    def __init__(self, transformer: nn.Module, *, guidance_scale: float = FLUX2_GUIDANCE):
        super().__init__()
        self.transformer = transformer
        self.guidance_scale = guidance_scale

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        n, c, h, w = latents.shape
        dtype, device = next(self.transformer.parameters()).dtype, latents.device
        guidance = None
        if self.transformer.config.guidance_embeds:  # type: ignore[union-attr]
            # float32 as in Flux2Pipeline; the transformer casts it to its own dtype.
            guidance = torch.full((n,), self.guidance_scale, device=device, dtype=torch.float32)
        tokens = latents.to(dtype).reshape(n, c, h * w).permute(0, 2, 1)  # Flux2Pipeline._pack_latents
        out = self.transformer(
            hidden_states=tokens,
            timestep=t.to(dtype),
            guidance=guidance,
            encoder_hidden_states=cond.prompt_embeds.to(dtype),
            txt_ids=text_ids(cond.prompt_embeds.shape[1], device=device),
            img_ids=image_ids(h, w, device=device),
            return_dict=False,
        )[0]
        return out.permute(0, 2, 1).reshape(n, -1, h, w).to(latents.dtype)


def patchify(z: Tensor) -> Tensor:
    """VAE latents ``(N, C, H, W)`` -> ``(N, 4C, H/2, W/2)``, each 2 x 2 patch's values channel-major
    (``Flux2Pipeline._patchify_latents``)."""
    n, c, h, w = z.shape
    return z.view(n, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(n, c * 4, h // 2, w // 2)


def unpatchify(x: Tensor) -> Tensor:
    """Inverse of :func:`patchify` (``Flux2Pipeline._unpatchify_latents``)."""
    n, c4, h, w = x.shape
    return x.reshape(n, c4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(n, c4 // 4, h * 2, w * 2)


class Flux2Adapter(PipelineAdapter):
    """A ``Flux2Pipeline``'s :class:`PipelineAdapter`: each prompt's stacked Mistral-3 hidden states at
    ``max_sequence_length`` tokens (no pooled vector, no mask), the patchified batch-normalised latents
    ``(4C, H/16, W/16)`` at the VAE's 8x (module docstring), and FLUX.2's step-dependent shift.

    Args:
        pipe: a ``Flux2Pipeline``.
        max_sequence_length: text tokens per prompt, the system message's included; None = the tokenizer's
            ``model_max_length``, at most 512 (the pipeline's default).
        text_encoder_out_layers: the hidden states stacked (the pipeline's default: after layers 10, 20, 30).
        options: :class:`PipelineAdapter`'s (``resolution``: a multiple of twice the VAE factor; None =
            ``default_sample_size * vae_scale_factor``, 1024 for FLUX.2).
    """

    name = "flux2"
    pipeline_class = "Flux2Pipeline"
    transformer_class = "Flux2Transformer2DModel"
    components = ONE_TEXT_ENCODER
    # The double-stream blocks' joint attention, and the single-stream blocks' fused q/k/v + MLP-in projection (their
    # output projection is named to_out, which would also match the double blocks' list).
    lora_targets = (*ATTENTION_BOTH_STREAMS, "to_qkv_mlp_proj")
    velocity = Flux2Velocity

    @staticmethod
    def geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
        # The pipeline patchifies 2 x 2 VAE latent pixels into channels (its transformer's patch_size is 1); rotary
        # positions: no table.
        vae_scale_factor = image_vae_scale(vae)
        return FamilyGeometry(vae_scale_factor, 2, FLUX2_DEFAULT_SAMPLE_SIZE * vae_scale_factor, None)

    def __init__(
        self,
        pipe: Any,
        *,
        max_sequence_length: int | None = None,
        text_encoder_out_layers: Sequence[int] = (10, 20, 30),
        **options: Any,
    ):
        super().__init__(pipe, **options)
        # The real pipeline's tokenizer is a PixtralProcessor (its tokenizer inside); a plain tokenizer serves too.
        tokenizer = getattr(pipe.tokenizer, "tokenizer", pipe.tokenizer)
        self.max_sequence_length = (
            max_sequence_length if max_sequence_length is not None else min(512, int(tokenizer.model_max_length))
        )
        self.text_encoder_out_layers = tuple(text_encoder_out_layers)

    @property
    def latent_channels(self) -> int:
        return int(self.transformer.config.in_channels)  # 4 x the VAE's channels: patchified

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        side = self.resolution // (int(self.pipe.vae_scale_factor) * self.patch_size)
        return (self.latent_channels, side, side)

    @property
    def image_seq_len(self) -> int:
        _, h, w = self.latent_shape
        return h * w  # one token per patchified latent pixel

    @property
    def default_resolution(self) -> int:
        return int(self.pipe.default_sample_size) * int(self.pipe.vae_scale_factor)

    def dynamic_shift(self, num_steps: int | None = None) -> float:
        """``Flux2Pipeline``'s shift for a ``num_steps``-step grid as the static shift ``e^mu``
        (:func:`empirical_shift_mu`; the scheduler's ``base_shift``/``max_shift`` are not read, as the pipeline
        does not read them)."""
        if num_steps is None:
            raise ValueError("FLUX.2's dynamic shift depends on the number of sampling steps: none was given")
        if self.pipe.scheduler.config.get("time_shift_type", "exponential") != "exponential":
            raise ValueError("only an exponential time shift is supported (the FLUX.2 scheduler's)")
        return math.exp(empirical_shift_mu(self.image_seq_len, num_steps))

    def _encode_prompt(self, prompt: str) -> tuple[Tensor, ...]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=[prompt],
            device=self.text_encoder_device,
            max_sequence_length=self.max_sequence_length,
            text_encoder_out_layers=self.text_encoder_out_layers,
        )
        return (embeds[0],)

    def _batch(self, rows: Sequence[tuple[Tensor, ...]]) -> Conditioning:
        return Conditioning(prompt_embeds=torch.stack([r[0] for r in rows]))  # one length for every prompt

    def _normalisation(self, like: Tensor) -> tuple[Tensor, Tensor]:
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(like.device, like.dtype)
        return mean, std

    def encode_images(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Images in [-1, 1] ``(N, 3, H, W)`` -> patchified latents normalised by the VAE's batch-norm statistics
        (a posterior sample; the pipeline's reference images take the mode)."""
        z = patchify(self.vae.encode(images.to(self.vae.dtype)).latent_dist.sample(generator=generator))
        mean, std = self._normalisation(z)
        return (z - mean) / std

    def decode(self, latents: Tensor) -> Tensor:
        """Normalised patchified latents -> images in [-1, 1] ``(N, 3, H, W)``, float32 (``Flux2Pipeline``'s decode)."""
        mean, std = self._normalisation(latents)
        z = unpatchify(latents * std + mean).to(self.vae.dtype)
        return self.vae.decode(z, return_dict=False)[0].float()
