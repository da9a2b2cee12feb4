"""Mixed precision and activation checkpointing for a velocity model, and the weights dtype of the frozen
components.

bf16 autocast covers the transformer only: the wrapper returns float32 velocities, so the ELBO surrogates,
ratios and losses downstream are computed in float32 (:mod:`vgrpo.surrogate`). The behaviour policy's
surrogates (``prepare``) and the trained policy's (gradient steps) go through the same wrapper, so on-policy
the ratio is 1 up to bf16's run-to-run determinism, not up to the gap between two precisions: flow_grpo users
who sampled in bf16 and trained in fp32 saw on-policy ratios far from 1 (``tests/models/test_precision.py`` pins both).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from vgrpo.models.config import PrecisionConfig
from vgrpo.models.gelu import use_sigmoid_gelu
from vgrpo.models.merged_lora import MergedLoRAVelocity
from vgrpo.policy import Conditioning

__all__ = [
    "WEIGHT_DTYPES",
    "AttentionKernelVelocity",
    "AutocastVelocity",
    "apply_precision",
    "apply_precision_config",
    "frozen_dtype",
]

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


class AttentionKernelVelocity(nn.Module):
    """Runs ``policy`` with ``torch.nn.functional.scaled_dot_product_attention`` restricted to one kernel
    (``precision.attention``): ``math`` is the unfused matmul-softmax-matmul, whose backward autograd derives from
    those three ops; ``flash`` the fused kernel. The same kernel serves the no-grad and the gradient forwards, so the
    behaviour policy's and the trained policy's surrogates agree on-policy."""

    KERNELS: ClassVar[dict[str, SDPBackend]] = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION}

    def __init__(self, policy: nn.Module, kernel: Literal["flash", "math"]):
        super().__init__()
        if kernel not in self.KERNELS:
            raise ValueError(f"precision.attention must be auto, {', '.join(self.KERNELS)}; got {kernel!r}")
        self.policy = policy
        self.kernel = kernel

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        with sdpa_kernel([self.KERNELS[self.kernel]]):
            return self.policy(latents, t, cond)


def apply_precision(
    policy: nn.Module,
    transformer: nn.Module,
    *,
    autocast: Literal["fp32", "bf16"],
    gradient_checkpointing: bool,
    merged_lora: bool = False,
    compile: bool = False,
    attention: Literal["auto", "flash", "math"] = "auto",
    gelu: Literal["tanh", "sigmoid"] = "tanh",
) -> nn.Module:
    """The policy to train with ``precision`` settings (:class:`vgrpo.models.config.PrecisionConfig`): ``policy``
    itself for fp32, else wrapped in :class:`AutocastVelocity`; its no-grad forwards through merged LoRA weights
    (:class:`vgrpo.models.merged_lora.MergedLoRAVelocity`) when ``merged_lora``; turns on ``transformer``'s
    gradient checkpointing (diffusers' ``enable_gradient_checkpointing``) when asked, and compiles ``transformer``
    in place (``nn.Module.compile``: the state dict keeps its names) when ``compile``; restricts attention to one
    kernel (:class:`AttentionKernelVelocity`) unless ``attention`` is ``auto``; computes the feed-forwards'
    GELU in its sigmoid form (:mod:`vgrpo.models.gelu`) when ``gelu`` is ``sigmoid``."""
    if gelu not in ("tanh", "sigmoid"):
        raise ValueError(f"precision.gelu must be tanh or sigmoid, got {gelu!r}")
    if gelu == "sigmoid":
        use_sigmoid_gelu(transformer)
    if compile:
        transformer.compile()
    if merged_lora:
        policy = MergedLoRAVelocity(policy)
    if gradient_checkpointing:
        enable = getattr(transformer, "enable_gradient_checkpointing", None)
        if enable is None:
            raise ValueError(f"{type(transformer).__name__} does not support gradient checkpointing")
        enable()
    if attention != "auto":
        policy = AttentionKernelVelocity(policy, attention)
    if autocast == "fp32":
        return policy
    if autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"precision.autocast must be fp32 or bf16, got {autocast!r}")
    return AutocastVelocity(policy, AUTOCAST_DTYPES[autocast])


def apply_precision_config(policy: nn.Module, transformer: nn.Module, precision: PrecisionConfig) -> nn.Module:
    """:func:`apply_precision` with a stage's ``precision:`` section: what the stage loop and the benchmarks train."""
    return apply_precision(
        policy,
        transformer,
        autocast=precision.autocast,
        gradient_checkpointing=precision.gradient_checkpointing,
        merged_lora=precision.merged_lora,
        compile=precision.compile,
        attention=precision.attention,
        gelu=precision.gelu,
    )
