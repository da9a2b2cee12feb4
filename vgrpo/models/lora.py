"""LoRA adapters through peft, on the attention projections of both streams of SD3 and FLUX (paper: r=32, alpha=64).

The default target names (``LoraConfig.target_modules``) exist in both transformers: SD3's joint blocks, and
FLUX's joint blocks plus the q/k/v projections of its single-stream blocks (which have no ``to_out``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from peft import LoraConfig as PeftLoraConfig
from torch import nn

__all__ = ["add_lora"]


def add_lora(
    transformer: nn.Module,
    *,
    rank: int,
    alpha: int,
    target_modules: Sequence[str],
    dropout: float = 0.0,
    adapter_name: str = "default",
) -> nn.Module:
    """Freeze ``transformer`` and add a trainable LoRA adapter (diffusers ``add_adapter``) in place.

    LoRA ``B`` starts at zero, so the adapted model equals the base model until the first update. The adapter's
    weights are float32 whatever the base's dtype.
    """

    missing = [m for m in target_modules if not any(n.endswith(m) for n, _ in transformer.named_modules())]
    if missing:
        raise ValueError(f"LoRA target modules not found in {type(transformer).__name__}: {missing}")
    transformer.requires_grad_(False)
    config = PeftLoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        init_lora_weights=True,
        target_modules=list(target_modules),
    )
    transformer.add_adapter(config, adapter_name=adapter_name)  # type: ignore[operator]
    for parameter in transformer.parameters():  # over a bf16 base, the adapter still trains and steps in float32
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
    return transformer
