"""Wan2.1 text-to-video (diffusers ``WanPipeline``): the transformer as a velocity model and the pipeline's adapter.

The sample is a **video**: its latents carry a frame axis, ``(C, F, H, W)`` per sample, with ``F = (num_frames - 1)
// scale_factor_temporal + 1`` latent frames for ``num_frames`` output frames (``num_frames - 1`` a multiple of the
VAE's temporal factor: 4k + 1 for Wan2.1's 4x). The project's flow math, samplers, pairs and surrogates reduce over
every non-batch dimension, so they take these latents as they take images'. The conventions ``WanPipeline.__call__``
feeds, as this module reproduces them:

* ``WanTransformer3DModel`` reads the latents ``(N, C, F, H, W)`` as they are (it patchifies ``(1, 2, 2)`` itself
  with a 3-d rotary embedding), the timestep as the scheduler's ``1000 t`` (float32), and the prompts' UMT5 token
  embeddings; it predicts the velocity in this project's convention (``eps - x0``: the flow-matching scheduler steps
  ``x + (t_next - t) v`` with its output unchanged);
* prompts are cleaned (``prompt_clean``), tokenised to ``max_sequence_length`` (the pipeline's 512) and encoded;
  each prompt's embeddings are cut to its own tokens and **zero-padded** back to that length, and the transformer
  gets no mask: so every prompt has the same length and the rows stack (no :attr:`Conditioning.prompt_mask`);
* latents are normalised per channel by the VAE's ``latents_mean`` / ``latents_std`` (``(z - mean) / std``); the
  pipeline decodes ``latents / (1 / std) + mean`` (the same arithmetic here, bit for bit) to a video in [-1, 1];
* classifier-free guidance against the negative prompt (the pipeline's default ``""``, guidance 5.0) is
  :class:`vgrpo.samplers.ClassifierFreeGuidance`: the padded embeddings of both halves have one length.

Schedulers: Wan2.1's published pipelines sample with ``UniPCMultistepScheduler`` (``use_flow_sigmas``,
``flow_shift`` 3.0 at 480p, 5.0 at 720p), a multistep solver this project's Euler / SDE samplers do not reproduce;
:meth:`WanAdapter.pipeline_shift` reads its ``flow_shift`` as the static shift of the project's own grid. A
``WanPipeline`` given a ``FlowMatchEulerDiscreteScheduler`` with the same shift samples what the project samples
(tested). Not supported: Wan2.2's second transformer (``boundary_ratio``) and per-token timesteps
(``expand_timesteps``).

Rewards score images: a video is scored frame by frame and averaged (:class:`vgrpo.rewards.video.PerFrameMean`),
and :func:`video_frames` turns decoded videos into those frames.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vgrpo.images import tensor_to_images
from vgrpo.models.adapter import ONE_TEXT_ENCODER, PipelineAdapter
from vgrpo.models.geometry import FamilyGeometry
from vgrpo.policy import Conditioning

__all__ = ["WAN_DEFAULT_FRAMES", "WAN_DEFAULT_RESOLUTION", "WanAdapter", "WanVelocity", "video_frames"]

WAN_DEFAULT_FRAMES = 81
"""``WanPipeline.__call__``'s default ``num_frames``."""
WAN_DEFAULT_RESOLUTION = 480
"""``WanPipeline.__call__``'s default height in pixels (its width is 832; vgrpo samples squares)."""


def video_frames(videos: Tensor) -> np.ndarray:
    """Decoded videos in [-1, 1] ``(N, 3, T, H, W)`` -> uint8 frames ``(N, T, H, W, 3)`` (rounded and clamped as
    :func:`vgrpo.images.tensor_to_images` does images)."""
    n, _, frames, h, w = videos.shape
    flat = videos.transpose(1, 2).reshape(n * frames, 3, h, w)
    return tensor_to_images(flat).reshape(n, frames, h, w, 3)


class WanVelocity(nn.Module):
    """Wraps a ``WanTransformer3DModel``: ``(latents (N, C, F, H, W), t (N,) in [0, 1], cond) -> v_hat``."""

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        if latents.ndim != 5:
            raise ValueError(f"Wan's latents are videos (N, C, F, H, W), got shape {tuple(latents.shape)}")
        dtype = next(self.transformer.parameters()).dtype
        out = self.transformer(
            hidden_states=latents.to(dtype),
            timestep=t.float() * 1000,  # the scheduler's timesteps, float32 as the pipeline passes them
            encoder_hidden_states=cond.prompt_embeds.to(dtype),
            return_dict=False,
        )[0]
        return out.to(latents.dtype)


class WanAdapter(PipelineAdapter):
    """A ``WanPipeline``'s :class:`PipelineAdapter`: UMT5 token embeddings zero-padded to ``max_sequence_length``
    (no pooled vector), video latents ``(C, F, H, W)``, the VAE's per-channel normalisation.

    Args:
        num_frames: output frames per video, ``scale_factor_temporal * k + 1`` (the pipeline's default: 81).
        max_sequence_length: text tokens per prompt; None = the tokenizer's ``model_max_length``, at most 512 (the
            pipeline's default).
        options: :class:`PipelineAdapter`'s (``resolution``: the square side; None = 480, the pipeline's height).
    """

    name = "wan"
    pipeline_class = "WanPipeline"
    transformer_class = "WanTransformer3DModel"
    components = ONE_TEXT_ENCODER
    lora_targets = ("to_q", "to_k", "to_v", "to_out.0")  # each block's self- and cross-attention
    velocity = WanVelocity
    video = True

    @staticmethod
    def geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
        # A video VAE naming its spatial factor (8 for Wan2.1); the transformer patchifies (1, 2, 2); rotary positions.
        return FamilyGeometry(
            int(vae["scale_factor_spatial"]),
            int(transformer["patch_size"][1]),
            WAN_DEFAULT_RESOLUTION,
            None,
            frames_factor=int(vae["scale_factor_temporal"]),
        )

    def __init__(
        self,
        pipe: Any,
        *,
        num_frames: int = WAN_DEFAULT_FRAMES,
        max_sequence_length: int | None = None,
        **options: Any,
    ):
        if pipe.config.get("boundary_ratio") is not None or pipe.config.get("expand_timesteps"):
            raise ValueError("Wan2.2 pipelines (boundary_ratio, expand_timesteps) are not supported: Wan2.1 only")
        super().__init__(pipe, **options)
        self.num_frames = self._checked_frames(num_frames)
        self.max_sequence_length = (
            max_sequence_length if max_sequence_length is not None else min(512, int(pipe.tokenizer.model_max_length))
        )

    def _checked_frames(self, num_frames: int) -> int:
        temporal = int(self.pipe.vae_scale_factor_temporal)
        if num_frames < 1 or (num_frames - 1) % temporal:
            raise ValueError(f"num_frames {num_frames} is not {temporal}k + 1 (the VAE's {temporal}x in time)")
        return num_frames

    def with_frames(self, num_frames: int) -> WanAdapter:
        """This adapter at another number of frames (checked as the constructor checks it), sharing its pipeline, text
        encoder and prompt cache (as :meth:`resized`)."""
        other = copy.copy(self)  # shallow on purpose: one pipeline, one prompt cache
        other.num_frames = self._checked_frames(int(num_frames))
        return other

    @property
    def latent_channels(self) -> int:
        return int(self.transformer.config.in_channels)

    @property
    def patch_size(self) -> int:
        return int(self.transformer.config.patch_size[1])

    @property
    def vae_scale_factor(self) -> int:
        return int(self.pipe.vae_scale_factor_spatial)

    @property
    def default_resolution(self) -> int:
        return WAN_DEFAULT_RESOLUTION

    @property
    def latent_frames(self) -> int:
        """``F``: latent frames of a :attr:`num_frames` video (``WanPipeline.prepare_latents``)."""
        return (self.num_frames - 1) // int(self.pipe.vae_scale_factor_temporal) + 1

    @property
    def latent_shape(self) -> tuple[int, ...]:
        """``(C, F, H, W)`` of one video's latents."""
        side = self.resolution // self.vae_scale_factor
        return (self.latent_channels, self.latent_frames, side, side)

    @property
    def image_seq_len(self) -> int:
        """Tokens the transformer sees: every latent frame's patches."""
        return self.latent_frames * super().image_seq_len

    def pipeline_shift(self, num_steps: int | None = None) -> float | None:
        """The scheduler's static shift: UniPC's ``flow_shift`` (with ``use_flow_sigmas``), else the flow-matching
        Euler scheduler's ``shift`` (module docstring)."""
        cfg = self.pipe.scheduler.config
        if "flow_shift" in cfg:
            if not cfg.get("use_flow_sigmas", False):
                raise ValueError("the pipeline's UniPC scheduler does not use flow sigmas: not a flow-matching grid")
            return float(cfg.flow_shift)
        return super().pipeline_shift(num_steps)

    def _encode_prompt(self, prompt: str) -> tuple[Tensor, ...]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=[prompt],
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.text_encoder_device,
        )
        return (embeds[0],)

    def _batch(self, rows: Sequence[tuple[Tensor, ...]]) -> Conditioning:
        return Conditioning(prompt_embeds=torch.stack([r[0] for r in rows]))

    def _normalisation(self, like: Tensor) -> tuple[Tensor, Tensor]:
        cfg = self.vae.config
        shape = (1, int(cfg.z_dim), 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean).view(shape).to(like.device, like.dtype)
        std = torch.tensor(cfg.latents_std).view(shape).to(like.device, like.dtype)
        return mean, std

    def encode_images(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Videos in [-1, 1] ``(N, 3, T, H, W)`` -> latents normalised per channel, ``(z - mean) / std`` (a
        posterior sample)."""
        z = self.vae.encode(images.to(self.vae.dtype)).latent_dist.sample(generator=generator)
        mean, std = self._normalisation(z)
        return (z - mean) / std

    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latents ``(N, C, F, h, w)`` -> videos in [-1, 1] ``(N, 3, T, H, W)``, float32 (``WanPipeline``'s
        decode; :func:`video_frames` makes them uint8 frames)."""
        mean, std = self._normalisation(latents.to(self.vae.dtype))
        z = latents.to(self.vae.dtype) / (1.0 / std) + mean
        return self.vae.decode(z, return_dict=False)[0].float()

    def decode_samples(self, latents: Tensor) -> np.ndarray:
        """Normalised latents -> uint8 frames ``(N, T, H, W, 3)``: what the rewards score (each frame, averaged per
        video: :class:`vgrpo.rewards.multi.MultiReward`) and the grids draw."""
        return video_frames(self.decode(latents))
