"""A tiny randomly initialised ``WanPipeline`` built from config (no hub), for tests of the Wan2.1 family
(:mod:`vgrpo.models.wan`); its own module because :mod:`vgrpo.models.tiny` is near the project's 350-line limit.

Wan2.1's structure at toy sizes: a one-layer UMT5 encoder with :func:`vgrpo.models.tiny.tiny_t5_tokenizer`, Wan's
causal video VAE with Wan2.1's 4x temporal and 8x spatial downsampling (``temperal_downsample`` [False, True, True])
and per-channel latent normalisation set away from the identity, a one-block ``WanTransformer3DModel`` patchifying
``(1, 2, 2)``, and a flow-matching Euler scheduler at Wan2.1-480p's shift 3.0 (the published pipelines' UniPC
solver is not what the project samples with: :mod:`vgrpo.models.wan`). At 32 px and 5 frames a video's latents are
``(4, 2, 4, 4)``: 8 tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
from transformers import UMT5Config, UMT5EncoderModel

from vgrpo.models.tiny import TINY_T5_SIZES, tiny_t5_tokenizer

__all__ = ["TINY_WAN_FRAMES", "TINY_WAN_RESOLUTION", "TINY_WAN_TOKENS", "tiny_wan_pipeline"]

TINY_WAN_RESOLUTION = 32
"""Side in pixels of the tiny pipeline's videos (its VAE's 8x times the transformer's 2 x 2 patches is 16)."""
TINY_WAN_FRAMES = 5
"""Frames of the tiny pipeline's videos (4k + 1: two latent frames)."""
TINY_WAN_TOKENS = 16
"""Text tokens per prompt of the tiny pipeline (its adapters' ``max_sequence_length``)."""
_CORPUS = ("a cat walking on grass", "a red car driving at night", "waves on a beach")


def tiny_wan_pipeline(seed: int = 0, *, corpus: Iterable[str] = _CORPUS) -> Any:
    """A randomly initialised ``WanPipeline`` (module docstring); ``save_pretrained`` + ``WanPipeline.from_pretrained``
    round-trip it."""
    tokenizer = tiny_t5_tokenizer(corpus, model_max_length=TINY_WAN_TOKENS)
    torch.manual_seed(seed + 2)
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **TINY_T5_SIZES)).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[1.5, 2.0, 0.8, 1.1],
    )
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,  # rotary: 4 dims for time, 4 each for height and width
        in_channels=4,
        out_channels=4,
        text_dim=TINY_T5_SIZES["d_model"],  # the UMT5 encoder's width
        freq_dim=16,
        ffn_dim=32,
        num_layers=1,
        rope_max_seq_len=64,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    return WanPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )
