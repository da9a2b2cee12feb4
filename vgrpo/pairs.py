"""Timestep-noise pairs ``(t_j, eps_j)``, j = 1..N_MC, for the Monte Carlo ELBO surrogate.

V-GRPO's variance-reduction techniques 1 and 2 (V-GRPO Sec. 4.4): pairs drawn once per iteration
and *shared* (scope ``batch``: one draw for the whole batch, the official default; ``group``: one
draw per prompt group; ``none``: independent per sample, the naive surrogate), and timesteps
*stratified* over the rollout's grid (one uniform pick inside each of N_MC contiguous chunks)
instead of ``U(0, 1)`` or the pretraining logit-normal.

Pairs are stored once per *row* (1 row for ``batch``, B for ``group``, B * G for ``none``) and
looked up per sample, so sharing also saves memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from vgrpo.flow import interpolate

__all__ = ["ShareScope", "SharedPairs", "TimestepSampling", "draw_pairs", "stratified_timesteps"]

ShareScope = Literal["batch", "group", "none"]
TimestepSampling = Literal["stratified", "uniform", "logit_normal"]


@dataclass(frozen=True)
class SharedPairs:
    """The iteration's pairs.

    Attributes:
        t: ``(R, N_MC)`` timesteps in (0, 1].
        eps: ``(R, N_MC, *S)`` standard normal noise.
        share: the scope, which sets the number of rows ``R``.
        group_size: ``G``, to map a sample to its group's row.
    """

    t: Tensor
    eps: Tensor
    share: ShareScope
    group_size: int

    @property
    def n_mc(self) -> int:
        return int(self.t.shape[1])

    def rows(self, sample_idx: Tensor) -> Tensor:
        """Row of each sample in ``sample_idx`` ``(n,)``."""
        if self.share == "batch":
            return torch.zeros_like(sample_idx)
        if self.share == "group":
            return sample_idx // self.group_size
        return sample_idx

    def select(self, start: int, count: int) -> SharedPairs:
        """The pairs of samples ``start .. start + count - 1`` of the batch, re-indexed from 0: one rank's
        block of the global batch's pairs. Blocks are whole prompt groups (``start``, ``count`` multiples of G).
        """
        if start % self.group_size or count % self.group_size:
            raise ValueError(f"samples {start}..{start + count} are not whole groups of {self.group_size}")
        if self.share == "batch":
            return self
        first, size = (start, count) if self.share == "none" else (start // self.group_size, count // self.group_size)
        if first + size > self.t.shape[0]:
            raise ValueError(f"rows {first}..{first + size} are outside the {self.t.shape[0]} rows of the pairs")
        return SharedPairs(
            t=self.t[first : first + size],
            eps=self.eps[first : first + size],
            share=self.share,
            group_size=self.group_size,
        )

    def timesteps(self, j: int, sample_idx: Tensor) -> Tensor:
        """``(n,)`` timestep of pair ``j`` for each sample."""
        return self.t[self.rows(sample_idx).to(self.t.device), j]

    def noise(self, j: int, sample_idx: Tensor) -> Tensor:
        """``(n, *S)`` noise of pair ``j`` for each sample (a broadcast view when shared by the batch)."""
        if self.share == "batch":
            return self.eps[0, j].expand(sample_idx.shape[0], *self.eps.shape[2:])
        return self.eps[self.rows(sample_idx).to(self.eps.device), j]

    def noised(self, j: int, sample_idx: Tensor, samples: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Pair ``j`` applied to ``samples[sample_idx]``: ``(x0, t, eps, z)`` with
        ``z = (1 - t) x0 + t eps`` on the samples' device and dtype."""
        x0 = samples[sample_idx.to(samples.device)]
        t = self.timesteps(j, sample_idx).to(x0.device)
        eps = self.noise(j, sample_idx).to(device=x0.device, dtype=x0.dtype)
        return x0, t, eps, interpolate(x0, eps, t).to(x0.dtype)


def stratified_timesteps(sigmas: Tensor, n_mc: int, num_rows: int, generator: torch.Generator) -> Tensor:
    """V-GRPO technique 2: split the grid (``sigmas`` without its final 0) by index into ``n_mc``
    contiguous chunks and pick one entry uniformly from each; returns ``(num_rows, n_mc)``."""
    grid = sigmas[sigmas > 0] if sigmas[-1] == 0 else sigmas
    if n_mc > grid.shape[0]:
        raise ValueError(f"n_mc={n_mc} stratified timesteps need at least {n_mc} grid steps, got {grid.shape[0]}")
    chunks = torch.tensor_split(torch.arange(grid.shape[0]), n_mc)
    picks = []
    for chunk in chunks:
        offset = torch.randint(len(chunk), (num_rows,), generator=generator)
        picks.append(grid[chunk[offset]])
    return torch.stack(picks, dim=1)


def draw_pairs(
    *,
    num_prompts: int,
    group_size: int,
    n_mc: int,
    latent_shape: tuple[int, ...],
    share: ShareScope,
    timestep_sampling: TimestepSampling,
    sigmas: Tensor,
    generator: torch.Generator,
    logit_normal_mean: float = 0.0,
    logit_normal_std: float = 1.0,
    t_min: float = 1e-3,
) -> SharedPairs:
    """Draw the iteration's N_MC timestep-noise pairs (on the generator's device, CPU by default).

    Args:
        sigmas: the rollout's grid ``(T + 1,)``, used by ``stratified``.
        t_min: floor for ``uniform``/``logit_normal`` draws, keeping ``t`` away from the clean end
            where every prediction degenerates.
    """
    if n_mc < 1:
        raise ValueError(f"n_mc must be >= 1, got {n_mc}")
    rows = {"batch": 1, "group": num_prompts, "none": num_prompts * group_size}.get(share)
    if rows is None:
        raise ValueError(f"share must be one of batch, group, none; got {share!r}")
    if timestep_sampling == "stratified":
        t = stratified_timesteps(sigmas, n_mc, rows, generator)
    elif timestep_sampling == "uniform":
        t = torch.rand(rows, n_mc, generator=generator)
    elif timestep_sampling == "logit_normal":
        t = torch.sigmoid(logit_normal_mean + logit_normal_std * torch.randn(rows, n_mc, generator=generator))
    else:
        raise ValueError(f"timestep_sampling must be stratified, uniform or logit_normal; got {timestep_sampling!r}")
    t = t.clamp(min=t_min, max=1.0).float()
    eps = torch.randn(rows, n_mc, *latent_shape, generator=generator)
    return SharedPairs(t=t, eps=eps, share=share, group_size=group_size)
