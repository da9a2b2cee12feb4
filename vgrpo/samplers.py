"""Samplers over any velocity model: the Euler ODE (V-GRPO, DiffusionNFT) and the Flow-GRPO SDE.

Samplers are pure in their randomness: the caller passes the initial noise and, for the SDE, the
per-step noise, so a rollout is a deterministic function of (weights, conditioning, noise) and
does not depend on how the batch is split into micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from vgrpo.flow import expand_like
from vgrpo.policy import Conditioning, VelocityModel

__all__ = [
    "ClassifierFreeGuidance",
    "SDEStep",
    "SDETrajectory",
    "euler_ode_sample",
    "flow_grpo_sde_std",
    "gaussian_log_prob",
    "hybrid_euler_sample",
    "mixgrpo_window_start",
    "sde_sample",
    "sde_step",
    "window_mask",
]


def _timesteps(value: Tensor, n: int, like: Tensor) -> Tensor:
    return value.to(device=like.device, dtype=torch.float32).expand(n)


@torch.no_grad()
def euler_ode_sample(velocity: VelocityModel, noise: Tensor, cond: Conditioning, sigmas: Tensor) -> Tensor:
    """Euler ODE rollout (V-GRPO Sec. 3: an ODE sampler adds no noise): ``x_{t+dt} = x_t + v_hat dt``; returns
    only the final latents.

    Args:
        velocity: the policy.
        noise: ``(N, *S)`` initial latents at ``t = sigmas[0]``.
        cond: conditioning with ``N`` rows.
        sigmas: ``(T + 1,)`` decreasing grid ending at 0 (:func:`vgrpo.flow.timestep_grid`).

    Returns:
        ``(N, *S)`` final latents ``o`` (the V-GRPO action).
    """
    x = noise
    n = noise.shape[0]
    for k in range(sigmas.shape[0] - 1):
        t, t_next = sigmas[k], sigmas[k + 1]
        v = velocity(x, _timesteps(t, n, x), cond)
        x = x + v.to(x.dtype) * (t_next - t).item()
    return x


@torch.no_grad()
def hybrid_euler_sample(
    policy: VelocityModel, base: VelocityModel, noise: Tensor, cond: Conditioning, sigmas: Tensor, p_mix: float
) -> Tensor:
    """MixGRPO's hybrid sampling (used by V-GRPO's FLUX evaluation, App. A.1): the trained ``policy``
    runs the first ``round(p_mix * T)`` Euler steps and the ``base`` model the rest.

    ``p_mix = 1`` is the policy alone and ``p_mix = 0`` the base alone."""
    if not 0.0 <= p_mix <= 1.0:
        raise ValueError(f"p_mix must be in [0, 1], got {p_mix}")
    switch = round(p_mix * (sigmas.shape[0] - 1))
    x = euler_ode_sample(policy, noise, cond, sigmas[: switch + 1]) if switch > 0 else noise
    return euler_ode_sample(base, x, cond, sigmas[switch:]) if switch < sigmas.shape[0] - 1 else x


class ClassifierFreeGuidance(torch.nn.Module):
    """Classifier-free guidance (Ho & Salimans 2022) as diffusers' SD3 pipeline applies it:
    ``v = v_uncond + scale * (v_cond - v_uncond)``, both halves in one batched call.

    Args:
        velocity: the conditional model.
        uncond: conditioning of the negative (empty) prompt with one row, broadcast to the batch.
        scale: guidance scale (SD3.5-M default 4.5 in the V-GRPO evaluation with CFG; 1 = no guidance).
    """

    def __init__(self, velocity: VelocityModel, uncond: Conditioning, scale: float):
        super().__init__()
        if len(uncond) != 1:
            raise ValueError(f"uncond must have one row, got {len(uncond)}")
        self.velocity, self.uncond, self.scale = velocity, uncond, scale

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        n = latents.shape[0]
        uncond = self.uncond.index(torch.zeros(n, dtype=torch.long)).to(latents.device)
        pooled = None
        if cond.pooled_prompt_embeds is not None and uncond.pooled_prompt_embeds is not None:
            pooled = torch.cat([uncond.pooled_prompt_embeds, cond.pooled_prompt_embeds])
        # An editing family's condition image enters both halves (FluxKontextPipeline's true CFG does the same).
        image = None if cond.image_latents is None else torch.cat([cond.image_latents, cond.image_latents])
        both = Conditioning(
            prompt_embeds=torch.cat([uncond.prompt_embeds, cond.prompt_embeds]),
            pooled_prompt_embeds=pooled,
            image_latents=image,
        )
        v_uncond, v_cond = self.velocity(torch.cat([latents, latents]), torch.cat([t, t]), both).chunk(2)
        return v_uncond + self.scale * (v_cond - v_uncond)


def flow_grpo_sde_std(t: Tensor, *, noise_level: float, t_cap: float) -> Tensor:
    """Flow-GRPO's diffusion coefficient ``sigma_t = a sqrt(t / (1 - t))``; at ``t = 1`` the
    denominator uses ``t_cap`` (the next grid value) so the first step stays finite."""
    t_den = torch.where(t >= 1.0, torch.full_like(t, t_cap), t)
    return noise_level * torch.sqrt(t / (1 - t_den))


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Diagonal Gaussian log-density averaged over all but the batch dimension: ``(N, *S) -> (N,)``.

    Computed in float32 (style rule 9); ``std`` broadcasts per sample.
    """
    x32, mean32 = x.float(), mean.float()
    std32 = expand_like(std.float(), x32)
    log_p = -((x32 - mean32) ** 2) / (2 * std32**2) - torch.log(std32) - 0.5 * math.log(2 * math.pi)
    return log_p.mean(dim=tuple(range(1, x.ndim)))


@dataclass(frozen=True)
class SDEStep:
    """One Flow-GRPO SDE transition ``x_t -> x_next``.

    Attributes:
        x_next: ``(N, *S)`` the next latents (sampled, or the given ones when re-scoring).
        mean: ``(N, *S)`` the transition mean ``mu``.
        std: ``(N,)`` the transition std ``sigma_t sqrt(-dt)``.
        log_prob: ``(N,)`` ``log N(x_next; mu, std^2)`` averaged over dimensions, float32.
    """

    x_next: Tensor
    mean: Tensor
    std: Tensor
    log_prob: Tensor


def sde_step(
    *,
    v: Tensor,
    x_t: Tensor,
    t: Tensor,
    t_next: Tensor,
    noise_level: float,
    t_cap: float,
    step_noise: Tensor | None = None,
    x_next: Tensor | None = None,
) -> SDEStep:
    """Flow-GRPO SDE step with its log-probability (Flow-GRPO, Liu et al. 2025, Sec. 4.1).

    ``mu = x_t (1 + sigma_t^2 dt / (2t)) + v (1 + sigma_t^2 (1 - t) / (2t)) dt`` and
    ``x_next = mu + sigma_t sqrt(-dt) eps``. Give ``step_noise`` to sample, or ``x_next`` to score a
    stored transition under new weights (the PPO ratio). ``t`` and ``t_next`` are ``(N,)``.
    """
    if (step_noise is None) == (x_next is None):
        raise ValueError("give exactly one of `step_noise` (to sample) or `x_next` (to score)")
    t32, dt = t.float(), (t_next - t).float()
    sigma = flow_grpo_sde_std(t32, noise_level=noise_level, t_cap=t_cap)
    te, dte, se = expand_like(t32, x_t), expand_like(dt, x_t), expand_like(sigma, x_t)
    x32, v32 = x_t.float(), v.float()
    mean = x32 * (1 + se**2 * dte / (2 * te)) + v32 * (1 + se**2 * (1 - te) / (2 * te)) * dte
    std = sigma * torch.sqrt(-dt)
    if x_next is None:
        assert step_noise is not None
        x_next = (mean + expand_like(std, x_t) * step_noise.float()).to(x_t.dtype)
    return SDEStep(x_next=x_next, mean=mean, std=std, log_prob=gaussian_log_prob(x_next, mean, std))


@dataclass(frozen=True)
class SDETrajectory:
    """A stored Flow-GRPO / MixGRPO rollout.

    Attributes:
        latents: ``(N, T + 1, *S)`` the state at every grid point; ``latents[:, -1]`` is the sample.
        log_probs: ``(N, T)`` per-step log-probabilities (float32); 0 on ODE steps.
        sde_steps: ``(T,)`` bool, True where the step was stochastic (and so trainable).
        sigmas: ``(T + 1,)`` the grid.
    """

    latents: Tensor
    log_probs: Tensor
    sde_steps: Tensor
    sigmas: Tensor

    @property
    def samples(self) -> Tensor:
        return self.latents[:, -1]


@torch.no_grad()
def sde_sample(
    velocity: VelocityModel,
    noise: Tensor,
    cond: Conditioning,
    sigmas: Tensor,
    *,
    noise_level: float,
    sde_steps: Tensor,
    step_noise: Tensor,
) -> SDETrajectory:
    """Flow-GRPO rollout (MixGRPO when ``sde_steps`` is a window): SDE on marked steps, Euler ODE elsewhere.

    Args:
        noise: ``(N, *S)`` initial latents.
        sigmas: ``(T + 1,)`` grid.
        sde_steps: ``(T,)`` bool mask of stochastic steps.
        step_noise: ``(N, T, *S)`` standard normal noise for the stochastic steps.
    """
    num_steps = sigmas.shape[0] - 1
    if sde_steps.shape != (num_steps,):
        raise ValueError(f"sde_steps must have shape ({num_steps},), got {tuple(sde_steps.shape)}")
    n = noise.shape[0]
    t_cap = float(sigmas[1])
    states, log_probs = [noise], []
    x = noise
    for k in range(num_steps):
        t, t_next = _timesteps(sigmas[k], n, x), _timesteps(sigmas[k + 1], n, x)
        v = velocity(x, t, cond)
        if bool(sde_steps[k]):
            step = sde_step(
                v=v,
                x_t=x,
                t=t,
                t_next=t_next,
                noise_level=noise_level,
                t_cap=t_cap,
                step_noise=step_noise[:, k],
            )
            x = step.x_next
            log_probs.append(step.log_prob)
        else:
            x = x + v.to(x.dtype) * (sigmas[k + 1] - sigmas[k]).item()
            log_probs.append(torch.zeros(n, device=x.device))
        states.append(x)
    return SDETrajectory(
        latents=torch.stack(states, dim=1),
        log_probs=torch.stack(log_probs, dim=1),
        sde_steps=sde_steps.clone(),
        sigmas=sigmas,
    )


def window_mask(num_steps: int, start: int, size: int) -> Tensor:
    """``(num_steps,)`` bool mask, True on steps ``[start, start + size)``: MixGRPO's SDE window."""
    if not 0 <= start <= num_steps - size or size < 1:
        raise ValueError(f"window [{start}, {start + size}) does not fit in {num_steps} steps")
    mask = torch.zeros(num_steps, dtype=torch.bool)
    mask[start : start + size] = True
    return mask


def mixgrpo_window_start(iteration: int, *, num_steps: int, window_size: int, shift_interval: int) -> int:
    """MixGRPO's sliding window (Li et al. 2025): advance one step every ``shift_interval``
    iterations and roll back to the first step after the last position."""
    positions = num_steps - window_size + 1
    if positions < 1:
        raise ValueError(f"window_size {window_size} exceeds num_steps {num_steps}")
    return (iteration // shift_interval) % positions
