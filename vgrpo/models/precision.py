"""Mixed precision and activation checkpointing for a velocity model, and the weights dtype of the frozen
components.

bf16 autocast covers the transformer only: the wrapper returns float32 velocities, so the ELBO surrogates,
ratios and losses downstream are computed in float32 (:mod:`vgrpo.surrogate`). The behaviour policy's
surrogates (``prepare``) and the trained policy's (gradient steps) go through the same wrapper, so on-policy
the ratio is 1 up to bf16's run-to-run determinism, not up to the gap between two precisions: flow_grpo users
who sampled in bf16 and trained in fp32 saw on-policy ratios far from 1 (``tests/models/test_precision.py`` pins both).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from vgrpo.models.merged_lora import MergedLoRAVelocity
from vgrpo.policy import Conditioning

__all__ = ["WEIGHT_DTYPES", "AutocastVelocity", "apply_precision", "frozen_dtype"]

AUTOCAST_DTYPES = {"bf16": torch.bfloat16}
WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def frozen_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """The weights dtype of the frozen text encoders and VAE (``precision.frozen_dtype``): ``auto`` is bf16 on a
    CUDA device (half of fp32's memory, the dtype their checkpoints ship in) and fp32 elsewhere (CPU kernels
    in bf16 are slow, and the embedded CPU runs stay bit-exact)."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if name not in WEIGHT_DTYPES:
        raise ValueError(f"precision.frozen_dtype must be auto, {', '.join(WEIGHT_DTYPES)}; got {name!r}")
    return WEIGHT_DTYPES[name]


class AutocastVelocity(nn.Module):
    """Runs ``policy`` under ``torch.autocast(dtype)`` on the latents' device and returns float32 velocities."""

    def __init__(self, policy: nn.Module, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.policy = policy
        self.dtype = dtype

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        with torch.autocast(device_type=latents.device.type, dtype=self.dtype):
            v = self.policy(latents, t, cond)
        return v.float()


def apply_precision(
    policy: nn.Module,
    transformer: nn.Module,
    *,
    autocast: Literal["fp32", "bf16"],
    gradient_checkpointing: bool,
    merged_lora: bool = False,
    compile: bool = False,
) -> nn.Module:
    """The policy to train with ``precision`` settings (:class:`vgrpo.models.config.PrecisionConfig`): ``policy``
    itself for fp32, else wrapped in :class:`AutocastVelocity`; its no-grad forwards through merged LoRA weights
    (:class:`vgrpo.models.merged_lora.MergedLoRAVelocity`) when ``merged_lora``; turns on ``transformer``'s
    gradient checkpointing (diffusers' ``enable_gradient_checkpointing``) when asked, and compiles ``transformer``
    in place (``nn.Module.compile``: the state dict keeps its names) when ``compile``."""
    if compile:
        transformer.compile()
    if merged_lora:
        policy = MergedLoRAVelocity(policy)
    if gradient_checkpointing:
        enable = getattr(transformer, "enable_gradient_checkpointing", None)
        if enable is None:
            raise ValueError(f"{type(transformer).__name__} does not support gradient checkpointing")
        enable()
    if autocast == "fp32":
        return policy
    if autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"precision.autocast must be fp32 or bf16, got {autocast!r}")
    return AutocastVelocity(policy, AUTOCAST_DTYPES[autocast])
