"""Config of the evaluation routine (:func:`vgrpo.evaluation.evaluator.evaluate`): the ``evaluation:`` section of a
stage's
params and of ``params/embedded/evaluate.yaml``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from vgrpo.config_base import (
    MAX_GROUP_SIZE,
    MAX_MICRO_BATCH,
    MAX_PROMPTS,
    MAX_RESOLUTION,
    MAX_STEPS,
    FrozenConfig,
)
from vgrpo.rewards.config import RewardConfig, check_unique_keys

__all__ = ["EvaluationConfig"]


class EvaluationConfig(FrozenConfig):
    """The evaluation routine (:func:`vgrpo.evaluation.evaluator.evaluate`): fixed prompts, fixed seeds, a table."""

    group_size: int = Field(4, ge=1, le=MAX_GROUP_SIZE, description="Samples per prompt (GenEval: 4).")
    num_steps: int = Field(20, ge=1, le=MAX_STEPS, description="Euler steps (paper: 40 for SD3.5-M, 50 for FLUX).")
    resolution: int | None = Field(
        None,
        gt=0,
        le=MAX_RESOLUTION,
        description="Image side in pixels (paper: 512 for SD3.5-M, 1024 for FLUX); None = the rollout's in a stage, "
        "the pipeline's default in `vgrpo evaluate`.",
    )
    num_frames: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Frames per video of a video family (Wan2.1: 4k + 1); None = the rollout's in a stage, the "
        "pipeline's default in `vgrpo evaluate`; an image family refuses it.",
    )
    shift: Annotated[float, Field(gt=0)] | Literal["rollout", "dynamic"] = Field(
        "rollout",
        description="Timestep shift of the sampling grid: `rollout` = the stage rollout's (its dynamic shift "
        "recomputed at this resolution; in `vgrpo evaluate` the pipeline scheduler's own), `dynamic` = FLUX's "
        "resolution-dependent shift at this resolution (what FluxPipeline samples with), or a static shift.",
    )
    seed: int = 0
    max_prompts: int | None = Field(
        None, ge=1, le=MAX_PROMPTS, description="First N prompts of the prompt file; None = all."
    )
    guidance_scale: float | None = Field(None, gt=0, description="CFG scale; None or 1 = off (SD3.5-M: 4.5).")
    p_mix: float | None = Field(None, ge=0, le=1, description="Hybrid sampling with `base_pipeline` (FLUX: 0.8).")
    base_pipeline: str | None = Field(None, description="Pipeline directory of the base for hybrid sampling.")
    micro_batch: int = Field(64, ge=1, le=MAX_MICRO_BATCH, description="Samples per sampler call (memory only).")
    overlap: bool = Field(
        False, description="Score chunk k while sampling chunk k+1 (helps when they use different devices)."
    )
    grid_prompts: int = Field(
        8, ge=0, le=MAX_GROUP_SIZE, description="Prompts shown in the image grid (all their samples)."
    )
    rewards: tuple[RewardConfig, ...] = Field(
        (RewardConfig(name="geneval"), RewardConfig(name="ocr")), min_length=1, description="What the table reports."
    )

    @model_validator(mode="after")
    def _check(self) -> EvaluationConfig:
        if (self.p_mix is None) != (self.base_pipeline is None):
            raise ValueError("hybrid sampling needs both p_mix and base_pipeline (or neither)")
        check_unique_keys(self.rewards)
        return self
