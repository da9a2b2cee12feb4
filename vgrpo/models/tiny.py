"""Tiny randomly initialised SD3 transformer and conditioning, built from config (no hub).

For tests, the demo and benchmarks of the algorithms themselves; the embedded default model that
is actually pretrained lives elsewhere.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from vgrpo.policy import Conditioning

__all__ = ["TINY_LATENT_SHAPE", "tiny_conditioning", "tiny_sd3_transformer"]

TINY_LATENT_SHAPE = (4, 8, 8)
_TEXT_LEN, _TEXT_DIM, _POOLED_DIM = 6, 16, 16


def tiny_sd3_transformer(seed: int = 0, *, num_layers: int = 2, hidden_heads: int = 2) -> nn.Module:
    """An ``SD3Transformer2DModel`` over ``(4, 8, 8)`` latents: patch 2 (16 tokens), width 16."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(seed)
    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=num_layers,
        attention_head_dim=8,
        num_attention_heads=hidden_heads,
        joint_attention_dim=_TEXT_DIM,
        caption_projection_dim=8 * hidden_heads,
        pooled_projection_dim=_POOLED_DIM,
        out_channels=4,
        pos_embed_max_size=8,
    )
    return cast(nn.Module, model)


def tiny_conditioning(num_prompts: int, seed: int = 1) -> Conditioning:
    """Random text conditioning with the tiny transformer's dimensions: ``(B, 6, 16)`` and ``(B, 16)``."""
    g = torch.Generator().manual_seed(seed)
    return Conditioning(
        prompt_embeds=torch.randn(num_prompts, _TEXT_LEN, _TEXT_DIM, generator=g),
        pooled_prompt_embeds=torch.randn(num_prompts, _POOLED_DIM, generator=g),
    )
