"""The no-grad forwards of a LoRA policy through merged weights: ``W + s B A`` in one matmul per layer instead of
``W x + s B (A x)``.

Sampling, the behaviour policy's surrogates and evaluation run without gradients, so nothing needs the factored
form there; the merged weights are computed once per change of the adapters (an optimizer step, a snapshot
swapped in) and the stored weights are never modified, so training resumes bit-exact. Merging rounds
differently from the factored form (float32: relative differences near 1e-7), which is why it is a setting
(``precision.merged_lora``) and off by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn
from torch.func import functional_call

from vgrpo.policy import Conditioning

__all__ = ["MergedLoRAVelocity", "lora_layers"]


def lora_layers(module: nn.Module) -> dict[str, LoraLayer]:
    """``module``'s PEFT LoRA layers by qualified name (linear layers with one active adapter each)."""
    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


@contextmanager
def _adapters_disabled(layers: dict[str, LoraLayer]) -> Iterator[None]:
    """The layers forward through their base layer only. peft's own ``enable_adapters(False)`` would also turn off
    the adapters' ``requires_grad``; this flips the flag alone and restores it."""
    before = {name: layer._disable_adapters for name, layer in layers.items()}
    for layer in layers.values():
        layer._disable_adapters = True
    try:
        yield
    finally:
        for name, layer in layers.items():
            layer._disable_adapters = before[name]


class MergedLoRAVelocity(nn.Module):
    """``policy`` with its LoRA merged into the base weights whenever gradients are off; with gradients on, the
    factored LoRA as usual (the same parameters: LoRA's are the ones trained).

    Args:
        policy: the velocity model; its LoRA layers are found among its modules.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy
        self._layers = lora_layers(policy)
        if not self._layers:
            raise ValueError("precision.merged_lora needs a LoRA policy (lora: is not set)")
        for name, layer in self._layers.items():
            if len(layer.active_adapters) != 1:
                raise ValueError(f"precision.merged_lora: {name} has {len(layer.active_adapters)} active adapters")
        self._key: tuple[tuple[int, int], ...] | None = None
        self._merged: dict[str, Tensor] = {}

    def _adapter_state(self) -> tuple[tuple[int, int], ...]:
        """Where each adapter weight lives and its in-place version: any update or swap changes it."""
        params = [
            p for layer in self._layers.values() for p in (*layer.lora_A.parameters(), *layer.lora_B.parameters())
        ]
        return tuple((p.data_ptr(), p._version) for p in params)

    @torch.no_grad()
    def merged_weights(self) -> dict[str, Tensor]:
        """``{qualified base weight name: W + delta}``, recomputed when an adapter changed since the last call."""
        key = self._adapter_state()
        if key != self._key:
            self._merged = {}
            for name, layer in self._layers.items():
                base = layer.get_base_layer()
                delta = layer.get_delta_weight(layer.active_adapters[0])  # type: ignore[attr-defined]
                self._merged[f"{name}.base_layer.weight"] = base.weight + delta.to(base.weight.dtype)
            self._key = key
        return self._merged

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        if torch.is_grad_enabled():
            return self.policy(latents, t, cond)
        weights = self.merged_weights()
        with _adapters_disabled(self._layers):
            return functional_call(self.policy, weights, (latents, t, cond), strict=False)
