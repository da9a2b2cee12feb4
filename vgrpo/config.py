"""A run's config, composed from the configs that sit beside their readers: :class:`TrainConfig` is one run's
training (rollouts, advantages, optimiser, algorithm, LoRA, precision); :class:`StageConfig` adds a curriculum
stage's prompts, rewards, length and evaluation, and :class:`CurriculumConfig` lists the stages. Their parts'
defaults are the V-GRPO paper's (Tang et al. 2026, Sec. 4; SD3.5-M stage 1, App. A.2) unless a description says
otherwise; ``params/`` files hold only overrides.

The files are read by :mod:`vgrpo.params_file` (the hardened YAML reader, merging, ``--set`` overrides and
``${VGRPO_*}`` variables); its names are also importable from here, the run config's one front door.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, overload

from pydantic import BaseModel, Field, model_validator

from vgrpo.algorithms.config import AdvantageConfig, AlgorithmConfig, RolloutConfig, VGRPOConfig
from vgrpo.config_base import MAX_ITERATIONS, MAX_SAMPLES_PER_ITERATION, FrozenConfig
from vgrpo.config_batch import check_batch
from vgrpo.errors import ConfigError
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.models.config import LoraConfig, PrecisionConfig
from vgrpo.parallel.distributed import DistributedConfig
from vgrpo.parallel.launch import LaunchConfig
from vgrpo.params_file import (
    EXPANDED_PREFIX,
    ConfigT,
    expand_variables,
    load_params,
    merge_overrides,
    overrides_from_pairs,
    read_params,
    unset_variables,
)
from vgrpo.rewards.config import RewardConfig, check_unique_keys, unrewarded_tags
from vgrpo.training.ema import EMAConfig
from vgrpo.training.hold import HoldConfig, unknown_held_problem
from vgrpo.training.optim import OptimConfig
from vgrpo.training.replay import ReplayConfig, replay_problem

__all__ = [
    "EXPANDED_PREFIX",
    "CurriculumConfig",
    "StageConfig",
    "TrainConfig",
    "expand_variables",
    "load_config",
    "load_curriculum",
    "load_stage",
    "merge_overrides",
    "overrides_from_pairs",
    "read_params",
    "unset_variables",
]


class TrainConfig(FrozenConfig):
    seed: int = 0
    rollout: RolloutConfig = RolloutConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    optim: OptimConfig = OptimConfig()
    algorithm: AlgorithmConfig = VGRPOConfig()
    lora: LoraConfig | None = LoraConfig()
    precision: PrecisionConfig = PrecisionConfig()
    ema: EMAConfig = EMAConfig()
    distributed: DistributedConfig = DistributedConfig()

    @model_validator(mode="after")
    def _check_cross_fields(self) -> TrainConfig:
        rollout = self.rollout
        if rollout.prompts_per_iteration * rollout.group_size > MAX_SAMPLES_PER_ITERATION:
            raise ValueError(
                f"rollout.prompts_per_iteration x rollout.group_size = {rollout.prompts_per_iteration} x "
                f"{rollout.group_size} samples per iteration, more than {MAX_SAMPLES_PER_ITERATION:,}"
            )
        if self.distributed.strategy == "fsdp" and self.lora is not None:
            raise ValueError("distributed.strategy=fsdp shards a full fine-tune: set lora: null (or strategy: ddp)")
        check_batch(rollout.prompts_per_iteration, rollout.group_size, self.optim.minibatches)
        self.algorithm.check_rollout(rollout)
        if self.lora is None and self.precision.text_encoders == "drop_after_encoding":
            raise ValueError(
                "precision.text_encoders: drop_after_encoding needs lora: a full fine-tune exports the "
                "whole pipeline, text encoders included (use text_encoders: cpu)"
            )
        if self.lora is None and self.precision.merged_lora:
            raise ValueError("precision.merged_lora needs lora: a full fine-tune has no adapter to merge")
        if self.precision.lora_base_dtype == "bf16":
            if self.lora is None:
                raise ValueError("precision.lora_base_dtype: bf16 needs lora: a full fine-tune trains the weights")
            if self.precision.autocast != "bf16":
                raise ValueError(
                    "precision.lora_base_dtype: bf16 needs precision.autocast: bf16 (fp32 activations cannot meet "
                    "bf16 weights)"
                )
            if self.precision.merged_lora:
                raise ValueError(
                    "precision.lora_base_dtype: bf16 cannot be combined with precision.merged_lora (merging into and "
                    "out of bf16 weights does not restore them)"
                )
        return self


@overload
def load_config(
    paths: Sequence[str | Path] = (), overrides: Mapping[str, Any] | None = None, *, section: str | None = None
) -> TrainConfig: ...


@overload
def load_config(
    paths: Sequence[str | Path] = (),
    overrides: Mapping[str, Any] | None = None,
    *,
    section: str | None = None,
    schema: type[ConfigT],
) -> ConfigT: ...


def load_config(
    paths: Sequence[str | Path] = (),
    overrides: Mapping[str, Any] | None = None,
    *,
    section: str | None = None,
    schema: type[BaseModel] = TrainConfig,
) -> BaseModel:
    """A ``schema`` config (by default :class:`TrainConfig`) from YAML files merged in order, then ``overrides``
    (:func:`vgrpo.params_file.load_params`).

    Raises:
        ConfigError: naming the file(s) and every offending key.
    """
    return load_params(paths, overrides, schema=schema, section=section)


_NAME = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$"
"""A stage's or a curriculum's name, a folder of its run: never '.', '..' or hidden (a leading dot)."""


class StageConfig(TrainConfig):
    """A training stage: the run config (rollout, advantage, optim, algorithm, lora) plus its prompts, rewards,
    length, checkpoint cadence, evaluation and how many processes train it (``launch``). Reward weights live on
    the rewards (``rewards[].weight``)."""

    name: str = Field("stage", pattern=_NAME, description="Directory and run name (not '.', '..' or hidden).")
    pipeline: str = Field("models/embedded-base", description="Base pipeline directory (the model params file's).")
    prompts: str = Field(description="Training prompt file (.jsonl metadata or .txt), relative to the project root.")
    prompt_tags: tuple[str, ...] | None = Field(None, description="Keep only rows with these `tag`s; None = all.")
    prompt_tag_weights: dict[str, float] | None = Field(
        None,
        description="Share of each `tag` among the prompts drawn (rows uniform within a tag; every kept tag "
        "needs a weight > 0); None = every row equally likely.",
    )
    rewards: tuple[RewardConfig, ...] = Field(min_length=1)
    iterations: int = Field(
        ge=1, le=MAX_ITERATIONS, description="Iterations of the stage (paper SD3.5: 150 / 200 / 150 / 50 / 30)."
    )
    checkpoint_every: int = Field(10, ge=1, le=MAX_ITERATIONS, description="Iterations between resumable checkpoints.")
    keep_checkpoints: int = Field(
        2, ge=1, le=1_000, description="Newest checkpoints of the run kept; older ones are deleted."
    )
    max_consecutive_skips: int = Field(
        3,
        ge=1,
        le=MAX_ITERATIONS,
        description="Iterations in a row skipped for NaN/Inf (vgrpo.training.guards) before the stage stops.",
    )
    eval_every: int = Field(
        0, ge=0, le=MAX_ITERATIONS, description="Iterations between evaluations; 0 = only after the last one."
    )
    eval_at_start: bool = Field(
        True, description="With eval_every, also evaluate before the first iteration (off when the start is known)."
    )
    eval_prompts: str | None = Field(None, description="Evaluation prompt file; None = no evaluation.")
    evaluation: EvaluationConfig = EvaluationConfig()
    launch: LaunchConfig = LaunchConfig()
    hold: HoldConfig | None = Field(
        None,
        description="Rewards the stage must hold, checked on validation prompts; the stage exports its last "
        "checkpoint that holds them (vgrpo.training.hold). None = export the last weights.",
    )
    replay: ReplayConfig | None = Field(
        None,
        description="Earlier stages' prompts rolled out each iteration as KL-only groups (vgrpo.training.replay); "
        "None = none.",
    )

    @property
    def batch_prompts(self) -> int:
        """Prompts an iteration rolls out: the stage's own and the replay's."""
        replayed = 0 if self.replay is None else self.replay.prompts_per_iteration
        return self.rollout.prompts_per_iteration + replayed

    @model_validator(mode="after")
    def _check_stage(self) -> StageConfig:
        check_unique_keys(self.rewards)
        if self.hold is not None:
            if self.launch.processes > 1 or self.distributed.strategy == "fsdp":
                raise ValueError("hold: checks run in one process; a launched or sharded stage cannot hold yet")
            if self.hold.reference == "base" and self.lora is None:
                raise ValueError("hold.reference: base needs lora (a full fine-tune keeps no base weights apart)")
            if problem := unknown_held_problem(self.hold, self.evaluation.rewards, self.rewards):
                raise ValueError(problem)

        rollout = self.rollout
        self.launch.check_fits(
            autocast=self.precision.autocast,
            prompts_per_iteration=self.batch_prompts,
            group_size=rollout.group_size,
            minibatches=self.optim.minibatches,
        )
        if self.replay is not None and (problem := replay_problem(self.replay, self.algorithm)):
            raise ValueError(problem)
        if self.prompt_tag_weights is not None and any(w <= 0 for w in self.prompt_tag_weights.values()):
            raise ValueError(f"prompt_tag_weights must all be > 0, got {self.prompt_tag_weights}")
        drawn = self.prompt_tags if self.prompt_tags is not None else tuple(self.prompt_tag_weights or ())
        if unscored := unrewarded_tags(self.rewards, drawn):
            raise ValueError(
                f"prompt tags {unscored} would be scored by no reward: every reward's prompt_tags leaves them out "
                "(name them in one, or leave them out of the stage's prompt_tags)"
            )
        if self.advantage.weights:
            raise ValueError("a stage weights its rewards with rewards[].weight; leave advantage.weights empty")
        return self

    LATER_OPTIONS: ClassVar[Mapping[str, Any]] = {"hold": None, "replay": None}


class CurriculumConfig(FrozenConfig):
    """Stages in order, each starting from the previous one's adapter: params files merged as
    ``base files -> model file -> stage file -> overlays -> overrides``."""

    name: str = Field(pattern=_NAME)
    base: tuple[str, ...] = ("params/base.yaml",)
    model: str = Field(description="Params file of the model (pipeline, rollout, LoRA, evaluation).")
    stages: tuple[str, ...] = Field(min_length=1, description="Params files of the stages, in order.")
    overlays: tuple[str, ...] = Field(
        (),
        description="Params files merged after each stage's file (e.g. params/embedded/validation.yaml: evaluate "
        "on the validation split, as recipe selection must).",
    )
    choices: tuple[str, ...] = Field(
        (),
        description="The tuning records (JSON files that say which prompts they read: their 'split') this recipe's "
        "settings were chosen on. A final report on the test split refuses a curriculum without them, or with one "
        "that read test (vgrpo.splits.choice_record_problems).",
    )


def load_curriculum(
    path: str | Path,
    overrides: Mapping[str, Any] | None = None,
    *,
    root: str | Path = ".",
    extra: Sequence[str | Path] = (),
) -> tuple[CurriculumConfig, list[StageConfig]]:
    """The curriculum file at ``path`` and every stage's validated config (all checked before any compute).
    ``extra`` params files (an ablation) merge after each stage file, then ``overrides`` apply to every stage.
    Paths inside the curriculum file are relative to ``root``."""
    curriculum = load_config([path], section="curriculum", schema=CurriculumConfig)
    root = Path(root)
    stages = [
        load_config(
            [*(root / f for f in (*curriculum.base, curriculum.model, stage, *curriculum.overlays)), *extra],
            overrides,
            schema=StageConfig,
        )
        for stage in curriculum.stages
    ]
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: stage names must differ, got {names}")
    return curriculum, stages


def load_stage(
    paths: Sequence[str | Path], overrides: Mapping[str, Any] | None = None, *, world_size: int = 1
) -> StageConfig:
    """A stage's config from its params files (as :func:`load_config`), checked to split over ``world_size``
    processes, before they start waiting for each other.

    Raises:
        ConfigError: naming the files and every offending key, or why the batch does not split.
    """
    config = load_config(paths, overrides, schema=StageConfig)
    rollout = config.rollout
    try:
        check_batch(rollout.prompts_per_iteration, rollout.group_size, config.optim.minibatches, world_size)
    except ValueError as exc:
        raise ConfigError(f"{' + '.join(str(p) for p in paths)}: {exc}") from exc
    return config
