"""The small interface every algorithm implements, so one training step serves them all.

An iteration is ``rollout -> rewards -> advantages -> prepare -> K x accumulate_gradients -> end_iteration``
(:func:`vgrpo.training.iteration.train_iteration`). Algorithms differ only in how they sample, what they
precompute with the behaviour policy (their payload, a dataclass of their own), and how a minibatch turns
into gradients.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor, nn

from vgrpo.pairs import SharedPairs
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import Conditioning, ParameterSnapshot, trainable_parameters
from vgrpo.samplers import SDETrajectory, euler_ode_sample

__all__ = ["Algorithm", "Payload", "PreparedBatch", "Rollout", "ScoredRollout", "micro_batches", "zero_lora_deltas"]


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


@dataclass(frozen=True)
class ScoredRollout:
    """What an algorithm prepares from: this rank's rollout, its conditioning (``N`` rows), its advantages ``(N,)``
    and, from a stage's replay (:mod:`vgrpo.training.replay`), the reference KL's weight of each sample ``(N,)``."""

    rollout: Rollout
    cond: Conditioning
    advantages: Tensor
    ref_kl_weights: Tensor | None = None


@dataclass(frozen=True)
class Payload:
    """Base of the algorithms' payloads: the dataclass of what one algorithm precomputed for its gradient steps
    (old surrogates, pairs, trajectories, ...), one field a quantity."""

    def tensors(self) -> dict[str, Tensor]:
        """The fields that are tensors, by name (records such as pairs or a trajectory are not opened)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if isinstance(value, Tensor)}


PayloadT = TypeVar("PayloadT", bound=Payload)


@dataclass
class PreparedBatch(Generic[PayloadT]):
    """Everything an algorithm precomputed for the gradient steps of one iteration.

    Attributes:
        samples: ``(N, *S)``; cond: ``N`` rows; advantages: ``(N,)``.
        payload: the algorithm's own precomputation (``VGRPOPayload``, ``FlowGRPOPayload``, ...).
        metrics: diagnostics measured while preparing (surrogate CV, ...), of the global batch: the same on
            every rank.
    """

    samples: Tensor
    cond: Conditioning
    advantages: Tensor
    payload: PayloadT
    metrics: dict[str, float] = field(default_factory=dict)


class Algorithm(ABC, Generic[PayloadT]):
    """Base class: subclasses are constructed from their typed config plus these plain values, and name the
    payload their ``prepare`` hands to their ``accumulate_gradients`` (``Algorithm[VGRPOPayload]``, ...).

    Args:
        config: the algorithm's typed config (``TrainConfig.algorithm``).
        sigmas: ``(T + 1,)`` the rollout's timestep grid.
        group_size: ``G``; samples are prompt-major (sample ``i`` belongs to prompt ``i // G``).
        latent_shape: ``S``, the shape of one sample's latents.
        rollout_micro_batch, train_micro_batch: samples per model call (memory only).
        dist: the processes sharing each iteration's batch (:mod:`vgrpo.parallel.distributed`); default one process.
            Each rank's ``rollout``/``prepare``/``accumulate_gradients`` see its own block of ``N / W``
            samples; what the batch shares (pairs, diagnostics) is computed for the global batch.
    """

    name: str = "base"
    weighs_ref_kl: bool = False
    """Whether :meth:`prepare` takes a per-sample weight of a reference KL (a stage's replay)."""

    def __init__(
        self,
        config: Any,
        *,
        sigmas: Tensor,
        group_size: int,
        latent_shape: tuple[int, ...],
        rollout_micro_batch: int,
        train_micro_batch: int,
        dist: Distributed | None = None,
        policy: nn.Module | None = None,
    ):
        del policy  # an algorithm that keeps a copy of the weights takes it (keep_snapshot); the others need not
        self.config = config
        self.sigmas = sigmas
        self.num_steps = sigmas.shape[0] - 1
        self.group_size = group_size
        self.latent_shape = latent_shape
        self.rollout_micro_batch = rollout_micro_batch
        self.train_micro_batch = train_micro_batch
        self.dist = dist if dist is not None else Distributed()
        self._snapshots: dict[str, ParameterSnapshot] = {}

    def keep_snapshot(self, name: str, policy: nn.Module) -> ParameterSnapshot:
        """A copy of ``policy``'s trainable weights as they are now, listed under ``name`` in :meth:`snapshots`."""
        snapshot = ParameterSnapshot(trainable_parameters(policy))
        self._snapshots[name] = snapshot
        return snapshot

    def local_pairs(self, pairs: SharedPairs, num_local: int) -> SharedPairs:
        """This rank's rows of the global batch's ``pairs``: rank 0's draw, broadcast (as the official code does;
        every rank drew the same from the shared generator, so this guards rather than changes), then cut to
        the rank's ``num_local`` samples. The identity in one process."""
        if self.dist.world_size == 1:
            return pairs
        pairs = replace(pairs, t=self.dist.broadcast(pairs.t), eps=self.dist.broadcast(pairs.eps))
        return pairs.select(self.dist.rank * num_local, num_local)

    def ode_rollout(self, policy: nn.Module, cond: Conditioning, noise: Tensor) -> Rollout:
        """Euler ODE sampling in micro-batches; only the final latents are kept."""
        chunks = [
            euler_ode_sample(policy, noise[pos], cond.index(mb), self.sigmas)
            for mb, pos in micro_batches(torch.arange(noise.shape[0]), self.rollout_micro_batch)
        ]
        return Rollout(samples=torch.cat(chunks), nfe=self.num_steps)

    @abstractmethod
    def rollout(
        self, policy: nn.Module, cond: Conditioning, noise: Tensor, generator: torch.Generator, iteration: int
    ) -> Rollout:
        """Sample ``N`` final latents from ``noise`` ``(N, *S)`` under the behaviour policy."""

    def prepare(
        self,
        policy: nn.Module,
        rollout: Rollout,
        cond: Conditioning,
        advantages: Tensor,
        generator: torch.Generator,
        ref_kl_weights: Tensor | None = None,
    ) -> PreparedBatch[PayloadT]:
        """Precompute, without gradient, what the gradient steps compare against (:meth:`precompute`), next to
        the samples, conditioning and advantages ``(N,)`` it belongs to. ``ref_kl_weights`` ``(N,)`` weight a
        reference KL per sample, for an algorithm that has one (:attr:`weighs_ref_kl`)."""
        if ref_kl_weights is not None and not self.weighs_ref_kl:
            raise ValueError(f"{self.name} has no reference KL to weight per sample (ref_kl_weights)")
        scored = ScoredRollout(rollout, cond, advantages, ref_kl_weights)
        payload, metrics = self.precompute(policy, scored, generator)
        return PreparedBatch(
            samples=rollout.samples, cond=cond, advantages=advantages, payload=payload, metrics=metrics
        )

    @abstractmethod
    def precompute(
        self, policy: nn.Module, scored: ScoredRollout, generator: torch.Generator
    ) -> tuple[PayloadT, dict[str, float]]:
        """The algorithm's payload for this rank's samples, and diagnostics of the global batch (the same on
        every rank)."""

    @abstractmethod
    def accumulate_gradients(
        self, policy: nn.Module, batch: PreparedBatch[PayloadT], idx: Tensor, step: int
    ) -> dict[str, float]:
        """Backward the loss on samples ``idx`` into ``.grad`` (the caller steps the optimizer).

        ``step`` counts gradient steps within the iteration (0 = weights still equal the rollout's).
        """

    def end_iteration(self, policy: nn.Module, iteration: int) -> dict[str, float]:
        """Hook after the iteration's last optimizer step (DiffusionNFT's EMA)."""
        return {}

    def snapshots(self) -> dict[str, ParameterSnapshot]:
        """Copies of the weights the algorithm keeps besides the policy (Flow-GRPO's reference, DiffusionNFT's
        old policy), made by :meth:`keep_snapshot`: what a checkpoint must save for a resumed run to continue
        exactly."""
        return dict(self._snapshots)


@torch.no_grad()
def zero_lora_deltas(snapshot: ParameterSnapshot, policy: nn.Module) -> None:
    """Zero the LoRA ``B`` matrices in ``snapshot`` (of ``policy``'s trainable parameters): a LoRA layer adds
    ``scale * B A x`` to the frozen base layer, so with ``B = 0`` the snapshot is the base model exactly, whatever
    adapter the stage started from. Without LoRA (full fine-tuning) it leaves the snapshot as it is."""
    names = [name for name, p in policy.named_parameters() if p.requires_grad]  # trainable_parameters' order
    for name, value in zip(names, snapshot.values, strict=True):
        if "lora_B" in name:
            value.zero_()
