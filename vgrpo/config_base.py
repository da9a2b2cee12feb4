"""The base of every typed config: a frozen pydantic model in which an unknown key or a non-finite number is an
error; and the upper bounds of its counts and sizes.

Each config lives beside the code that reads it; :mod:`vgrpo.config` composes them into a run's config and
loads them from YAML.

The bounds are typo guards, not limits of the method: each sits orders of magnitude above what the papers' recipes
use (V-GRPO SD3.5-M: 48 prompts x 24 samples, 40 steps, 512 px; FLUX.1-dev: 1024 px, 50 evaluation steps; 300
iterations at most), so a real run never meets one and a stray digit (``num_steps: 1000000000``) is refused when the
params load, before a pipeline is built or a buffer of that size is allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

__all__ = [
    "MAX_GROUP_SIZE",
    "MAX_ITERATIONS",
    "MAX_LORA_RANK",
    "MAX_MICRO_BATCH",
    "MAX_N_MC",
    "MAX_PROCESSES",
    "MAX_PROMPTS",
    "MAX_PROMPTS_PER_ITERATION",
    "MAX_RESOLUTION",
    "MAX_SAMPLES_PER_ITERATION",
    "MAX_STEPS",
    "FrozenConfig",
]

MAX_ITERATIONS = 100_000
"""Iterations of a stage, and every per-iteration cadence (checkpoints, evaluations, EMA, MixGRPO's window)."""
MAX_STEPS = 1_000
"""Sampler steps of a rollout or an evaluation (the scheduler's training grid has 1000 timesteps)."""
MAX_GROUP_SIZE = 1_024
"""Samples per prompt, in rollouts and evaluations."""
MAX_PROMPTS_PER_ITERATION = 4_096
"""Prompts per iteration."""
MAX_SAMPLES_PER_ITERATION = 65_536
"""Prompts per iteration x samples per prompt."""
MAX_N_MC = 256
"""Monte Carlo timestep-noise pairs (or training timesteps) per sample."""
MAX_RESOLUTION = 8_192
"""Image side in pixels."""
MAX_MICRO_BATCH = 65_536
"""Samples per model call, and minibatches per iteration."""
MAX_PROMPTS = 10_000_000
"""Prompts an evaluation reads (a prompt file holds at most 64 MB)."""
MAX_LORA_RANK = 4_096
"""LoRA rank and alpha."""
MAX_PROCESSES = 65_536
"""Processes (and machines) a stage is launched on."""


class FrozenConfig(BaseModel):
    """Base of every config: frozen; an unknown key, NaN or infinity is an error.

    A config that gains an option after runs were fingerprinted lists it in :attr:`LATER_OPTIONS` with its
    default: while at that default the option is left out of the dump, so a config that does not set it dumps
    (and so fingerprints, and is recorded in benchmark cells) as it did before the option existed."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    LATER_OPTIONS: ClassVar[Mapping[str, Any]] = {}

    @model_serializer(mode="wrap")
    def _without_later_options_at_default(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key, default in self.LATER_OPTIONS.items():
                if key in data and data[key] == default:
                    del data[key]
        return data
