"""The small interface every algorithm implements, so one training step serves them all.

An iteration is ``rollout -> rewards -> advantages -> prepare -> K x accumulate_gradients``
(:func:`vgrpo.train_step.train_iteration`). Algorithms differ only in how they sample, what they
precompute with the behaviour policy, and how a minibatch turns into gradients.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.policy import Conditioning
from vgrpo.samplers import SDETrajectory

__all__ = ["Algorithm", "PreparedBatch", "Rollout", "micro_batches"]


def micro_batches(idx: Tensor, size: int) -> Iterator[tuple[Tensor, slice]]:
    """Split sample indices into chunks of at most ``size``: yields ``(indices, positions)`` where
    ``positions`` slices the chunk out of ``idx``-ordered tensors."""
    for start in range(0, idx.shape[0], size):
        yield idx[start : start + size], slice(start, start + size)


@dataclass(frozen=True)
class Rollout:
    """What sampling produced.

    Attributes:
        samples: ``(N, *S)`` final latents ``o_i`` (N = B * G, prompt-major).
        nfe: model evaluations per sample spent sampling.
        trajectory: the stored SDE trajectory (Flow-GRPO, MixGRPO), else None.
    """

    samples: Tensor
    nfe: int
    trajectory: SDETrajectory | None = None


@dataclass
class PreparedBatch:
    """Everything an algorithm precomputed for the gradient steps of one iteration.

    Attributes:
        samples: ``(N, *S)``; cond: ``N`` rows; advantages: ``(N,)``.
        extras: algorithm-specific tensors (old surrogates, pairs, trajectories, ...).
        metrics: diagnostics measured while preparing (surrogate CV, ...).
    """

    samples: Tensor
    cond: Conditioning
    advantages: Tensor
    extras: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


class Algorithm(ABC):
    """Base class: subclasses are constructed from their typed config plus plain values."""

    name: str = "base"

    @abstractmethod
    def rollout(
        self, policy: nn.Module, cond: Conditioning, noise: Tensor, generator: torch.Generator, iteration: int
    ) -> Rollout:
        """Sample ``N`` final latents from ``noise`` ``(N, *S)`` under the behaviour policy."""

    @abstractmethod
    def prepare(
        self,
        policy: nn.Module,
        rollout: Rollout,
        cond: Conditioning,
        advantages: Tensor,
        generator: torch.Generator,
    ) -> PreparedBatch:
        """Precompute, without gradient, what the gradient steps compare against."""

    @abstractmethod
    def accumulate_gradients(self, policy: nn.Module, batch: PreparedBatch, idx: Tensor, step: int) -> dict[str, float]:
        """Backward the loss on samples ``idx`` into ``.grad`` (the caller steps the optimizer).

        ``step`` counts gradient steps within the iteration (0 = weights still equal the rollout's).
        """

    def end_iteration(self, policy: nn.Module, iteration: int) -> dict[str, float]:
        """Hook after the iteration's last optimizer step (DiffusionNFT's EMA)."""
        return {}
