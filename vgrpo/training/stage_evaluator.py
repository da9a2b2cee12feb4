"""The evaluator a stage's params ask for (:class:`vgrpo.evaluation.evaluator.Evaluator`): its prompts, its rewards,
and the base pipeline that MixGRPO's hybrid sampling hands the last steps to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vgrpo.config import StageConfig
from vgrpo.evaluation.evaluator import Evaluator
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.precision import frozen_dtype
from vgrpo.parallel.distributed import Distributed
from vgrpo.rewards.multi import MultiReward

__all__ = ["build_evaluator"]


def build_evaluator(
    config: StageConfig, rows: list[dict[str, Any]] | None, root: Path, shift: float | None, dist: Distributed
) -> Evaluator | None:
    """The stage's :class:`Evaluator`, or ``None`` without evaluation prompts (and on ranks other than 0, except
    under FSDP: every rank takes part in the sharded policy's forward passes, so every rank evaluates); ``shift``
    is the rollout's, resolved (:meth:`vgrpo.models.adapter.PipelineAdapter.sigma_shift`)."""
    if not rows or not (dist.is_main or config.distributed.strategy == "fsdp"):
        return None
    base = None
    if config.evaluation.base_pipeline is not None:
        # Only the base's transformer samples (the policy's adapter encodes the prompts and decodes): its text
        # encoders and VAE load in the frozen dtype and stay on the CPU.
        frozen = frozen_dtype(config.precision.frozen_dtype, dist.device)
        base_pipe = load_pipeline(root / config.evaluation.base_pipeline, frozen_dtype=frozen)
        base_pipe.transformer.to(dist.device)
        base = build_adapter(base_pipe, resolution=config.rollout.resolution)[1].eval()
    rewards = MultiReward.from_configs(config.evaluation.rewards)
    return Evaluator(
        rows=rows,
        rewards=rewards,
        config=config.evaluation,
        shift=shift,
        base=base,
        dynamic_shift=config.rollout.dynamic_shift,
    )
