"""The tanh-approximate GELU of the transformers' feed-forwards through the sigmoid identity
(``precision.gelu: sigmoid``), for compiled models.

SD3's, FLUX's and Qwen-Image's feed-forwards use GELU with the tanh approximation (Hendrycks & Gimpel 2016,
Eq. 1's approximation): ``0.5 x (1 + tanh(z))`` with ``z = sqrt(2 / pi) (x + 0.044715 x^3)``. Since
``0.5 (1 + tanh(z)) = sigmoid(2 z)``, the same function is ``x sigmoid(2 z)``: one exponential instead of a tanh.
torch's CPU GELU kernel and inductor's tanh both spend about 2 ms on the embedded model's ``[64, 64, 512]``
activation (2 cores), 11% of an iteration; inductor fuses the sigmoid form into one kernel of 0.74 ms
(``docs/benchmarks/speed.md``). Eagerly the form runs as six separate operators, four times slower than torch's
kernel, so the setting needs ``precision.compile``.

The two forms differ by float rounding only (at most 4.8e-7 absolute on standard normal inputs in float32); the
sigmoid form computes in float32 whatever the activation's dtype, as torch's bf16 GELU kernel does.
"""

from __future__ import annotations

import math

import torch
from diffusers.models.activations import GELU
from torch import Tensor, nn

__all__ = ["SigmoidFormGELU", "use_sigmoid_gelu"]

_TWO_SQRT_2_OVER_PI = 2 * math.sqrt(2 / math.pi)


class SigmoidFormGELU(GELU):
    """diffusers' ``GELU`` (a projection, then the activation) whose tanh approximation is computed as
    ``x sigmoid(2 z)``; weights and state-dict names are the parent's."""

    def gelu(self, gate: Tensor) -> Tensor:
        x = gate.float()
        return (x * torch.sigmoid(_TWO_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))).to(gate.dtype)


def use_sigmoid_gelu(module: nn.Module) -> int:
    """Every diffusers ``GELU(approximate="tanh")`` inside ``module`` becomes a :class:`SigmoidFormGELU` in place
    (its class is swapped: parameters, buffers and hooks stay). Returns how many were swapped."""
    swapped = 0
    for child in module.modules():
        if type(child) is GELU and child.approximate == "tanh":
            child.__class__ = SigmoidFormGELU
            swapped += 1
    return swapped
