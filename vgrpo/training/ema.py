"""An exponential moving average of the policy's trainable weights, for evaluation and export.

Flow-GRPO's configs commonly set ``train.ema``: its SD3 trainer keeps an EMA of the LoRA (decay 0.9, updated
every 8 optimisation steps, with the warm-up ``min((1 + n) / (10 + n), decay)``) and evaluates and saves it.
Here the EMA is one more :class:`vgrpo.policy.ParameterSnapshot` of the trainable parameters -- the mechanism
DiffusionNFT's "old" policy and Flow-GRPO's reference already use -- so it covers LoRA and full fine-tuning
alike, is saved in every checkpoint beside the algorithm's snapshots, and a resumed stage continues it bit for
bit. It never feeds back into training: rollouts and gradients use the live weights.

The update count is a function of the iteration, so a checkpoint needs no counter: after iteration ``k``
(0-based) the EMA has taken ``(k + 1) // every`` updates.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

from pydantic import Field
from torch import nn

from vgrpo.config_base import MAX_ITERATIONS, FrozenConfig
from vgrpo.policy import ParameterSnapshot

__all__ = ["EMAConfig", "PolicyEMA", "maybe_swapped_in"]


class EMAConfig(FrozenConfig):
    """``ema:`` in a stage's params. Off by default (the paper's FLUX recipe states no EMA)."""

    enabled: bool = Field(False, description="Keep an EMA of the trainable weights; evaluate and export it.")
    decay: float = Field(0.9, ge=0.0, lt=1.0, description="EMA decay (Flow-GRPO's SD3 trainer: 0.9).")
    every: int = Field(1, ge=1, le=MAX_ITERATIONS, description="Iterations between EMA updates.")
    warmup: bool = Field(
        True, description="Decay min((1 + n) / (10 + n), decay) at update n, as Flow-GRPO's EMA; off: decay throughout."
    )


class PolicyEMA:
    """The EMA of ``params`` (the policy's trainable parameters), starting from their current values."""

    SNAPSHOT_NAME = "policy_ema"
    """Its key among a checkpoint's snapshots."""

    def __init__(self, params: Sequence[nn.Parameter], config: EMAConfig):
        self.config = config
        self.snapshot = ParameterSnapshot(params)

    def decay_at(self, update: int) -> float:
        """The decay of the ``update``-th update (0-based)."""
        if not self.config.warmup:
            return self.config.decay
        return min((1 + update) / (10 + update), self.config.decay)

    def step(self, iteration: int) -> dict[str, float]:
        """Fold the live weights in after ``iteration`` (0-based) when it closes a period of ``every``; returns
        the decay used (for logging), or nothing."""
        done = iteration + 1
        if done % self.config.every:
            return {}
        decay = self.decay_at(done // self.config.every - 1)
        self.snapshot.ema_update(decay)
        return {"ema/decay": decay}

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Run the block with the EMA weights in the live parameters (evaluation, export), then restore them."""
        with self.snapshot.swapped_in():
            yield


def maybe_swapped_in(ema: PolicyEMA | None) -> AbstractContextManager[None]:
    """The EMA's weights for the block when there is one, else the live weights."""
    return ema.swapped_in() if ema is not None else nullcontext()
