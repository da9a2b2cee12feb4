"""Pixel conversions between uint8 images (what rewards score) and the float tensors a VAE reads and writes."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["images_to_tensor", "tensor_to_images"]


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(B, H, W, 3)`` -> float ``(B, 3, H, W)`` in [-1, 1] (the VAE's input range)."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def tensor_to_images(x: torch.Tensor) -> np.ndarray:
    """Inverse of :func:`images_to_tensor`, rounding and clamping to uint8."""
    x = ((x.detach().float().clamp(-1, 1) + 1) * 127.5).round()
    return x.permute(0, 2, 3, 1).to(torch.uint8).cpu().numpy()
