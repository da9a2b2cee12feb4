"""Rectified-flow math shared by every sampler, surrogate and loss.

Conventions (rectified flow as in SD3, Esser et al. 2024, and diffusers' SD3 / FLUX pipelines; V-GRPO Sec. 3):
``t`` in [0, 1] with ``t = 1`` pure noise, ``x_t = (1 - t) x0 + t eps`` and the network predicts the velocity
``v = eps - x0``.
All functions broadcast a per-sample ``t`` of shape ``(N,)`` over latents of shape ``(N, ...)``.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Schedule",
    "eps_from_velocity",
    "expand_like",
    "interpolate",
    "resolution_shift_mu",
    "shift_timesteps",
    "time_shift_exponential",
    "timestep_grid",
    "velocity_from_eps",
    "velocity_from_x0",
    "velocity_target",
    "x0_from_velocity",
]

Schedule = Literal["uniform", "diffusers"]
"""How :func:`timestep_grid` spaces the sigmas before the shift (see there)."""


def expand_like(t: Tensor, x: Tensor) -> Tensor:
    """Reshape a per-sample ``t`` of shape ``(N,)`` (or a scalar) to broadcast over ``x`` ``(N, ...)``."""
    if t.ndim == 0:
        return t
    if t.shape[0] != x.shape[0]:
        raise ValueError(f"t has {t.shape[0]} entries but x has batch size {x.shape[0]}")
    return t.reshape(t.shape[0], *([1] * (x.ndim - 1)))


def interpolate(x0: Tensor, eps: Tensor, t: Tensor) -> Tensor:
    """Forward process (V-GRPO Sec. 3, rectified flow): ``x_t = (1 - t) x0 + t eps``."""
    tt = expand_like(t, x0)
    return (1 - tt) * x0 + tt * eps


def velocity_target(x0: Tensor, eps: Tensor) -> Tensor:
    """Rectified-flow velocity (V-GRPO Sec. 3): ``v = eps - x0`` (independent of t)."""
    return eps - x0


def x0_from_velocity(x_t: Tensor, v: Tensor, t: Tensor) -> Tensor:
    """x-prediction (V-GRPO Sec. 3): ``x0_hat = x_t - t v_hat``; ``||x0_hat - x0||^2 = t^2 ||v_hat - v||^2``."""
    return x_t - expand_like(t, x_t) * v


def eps_from_velocity(x_t: Tensor, v: Tensor, t: Tensor) -> Tensor:
    """eps-prediction (V-GRPO Sec. 3): ``eps_hat = x_t + (1 - t) v_hat``."""
    return x_t + (1 - expand_like(t, x_t)) * v


def velocity_from_x0(x_t: Tensor, x0: Tensor, t: Tensor) -> Tensor:
    """Inverse of :func:`x0_from_velocity`: ``v = (x_t - x0) / t`` (undefined at t = 0)."""
    return (x_t - x0) / expand_like(t, x_t)


def velocity_from_eps(x_t: Tensor, eps: Tensor, t: Tensor) -> Tensor:
    """Inverse of :func:`eps_from_velocity`: ``v = (eps - x_t) / (1 - t)`` (undefined at t = 1)."""
    return (eps - x_t) / (1 - expand_like(t, x_t))


def shift_timesteps(t: Tensor, shift: float) -> Tensor:
    """SD3's static timestep shift (Esser et al. 2024): ``t' = s t / (1 + (s - 1) t)`` (SD3.5 uses s = 3)."""
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    return shift * t / (1 + (shift - 1) * t)


def resolution_shift_mu(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """FLUX resolution-dependent shift parameter (diffusers ``calculate_shift``): linear in token count."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * slope + (base_shift - slope * base_seq_len)


def time_shift_exponential(t: Tensor, mu: float, sigma: float = 1.0) -> Tensor:
    """FLUX dynamic shift (diffusers ``time_shift``): ``e^mu / (e^mu + (1/t - 1)^sigma)``; maps 0 -> 0, 1 -> 1."""
    t64 = t.double()
    safe = torch.where(t64 > 0, t64, torch.ones_like(t64))
    shifted = math.exp(mu) / (math.exp(mu) + (1 / safe - 1) ** sigma)
    return torch.where(t64 > 0, shifted, torch.zeros_like(t64)).to(t.dtype)


def timestep_grid(
    num_steps: int,
    *,
    shift: float | None = None,
    mu: float | None = None,
    schedule: Schedule = "uniform",
    num_train_timesteps: int = 1000,
) -> Tensor:
    """The sampler's sigmas: ``num_steps + 1`` values from 1 down to a final 0, shape ``(num_steps + 1,)``.

    Give ``shift`` for SD3's static shift or ``mu`` for FLUX's resolution-dependent one, not both. Two grids:

    * ``"uniform"``: ``shift(linspace(1, 0, T + 1))``. What diffusers' ``FluxPipeline`` samples with (it passes
      ``sigmas = linspace(1, 1/T, T)`` with its ``mu``, and the scheduler appends 0), and the grid of the
      FastVideo-based RL code (DanceGRPO; MixGRPO, Li et al. 2025: ``sd3_time_shift(shift, linspace(1, 0, T + 1))``).
    * ``"diffusers"``: ``FlowMatchEulerDiscreteScheduler.set_timesteps(T)`` without sigmas, what
      ``StableDiffusion3Pipeline`` and Flow-GRPO's SD3 sampler (Liu et al. 2025) use: ``linspace`` from the
      scheduler's largest to its smallest training sigma (``shift(1 / num_train_timesteps)``; unshifted under a
      dynamic shift), shifted, then 0 appended. Its last step is short: at T = 10 and shift 3 the penultimate sigma
      is 0.0089, against 0.25 on the uniform grid. Computed as the scheduler computes it (float32 training sigmas,
      float64 numpy in between), so the two are equal bit for bit.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift is not None and mu is not None:
        raise ValueError("give either a static `shift` or a dynamic `mu`, not both")
    if schedule == "diffusers":
        return _diffusers_default_grid(num_steps, shift, mu, num_train_timesteps)
    if schedule != "uniform":
        raise ValueError(f"schedule must be 'uniform' or 'diffusers', got {schedule!r}")
    sigmas = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    if shift is not None:
        sigmas = shift_timesteps(sigmas, shift)
    elif mu is not None:
        sigmas = time_shift_exponential(sigmas, mu)
    return sigmas.float()


def _diffusers_default_grid(num_steps: int, shift: float | None, mu: float | None, num_train: int) -> Tensor:
    """:func:`timestep_grid`'s ``"diffusers"`` grid, step by step as ``FlowMatchEulerDiscreteScheduler`` builds it."""

    # __init__: the training sigmas' ends, float32, shifted unless the shift is dynamic.
    ends = torch.tensor([float(num_train), 1.0]) / num_train
    static = 1.0 if shift is None else shift
    if mu is None:
        ends = static * ends / (1 + (static - 1) * ends)
    sigma_max, sigma_min = ends.tolist()
    # set_timesteps(T): timesteps from sigma_max to sigma_min in float64, shifted (again), then a final 0.
    sigmas = np.linspace(sigma_max * num_train, sigma_min * num_train, num_steps) / num_train
    if mu is None:
        sigmas = static * sigmas / (1 + (static - 1) * sigmas)
    else:
        sigmas = math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1))
    return torch.cat([torch.from_numpy(sigmas).float(), torch.zeros(1)])
