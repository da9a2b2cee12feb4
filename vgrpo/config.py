"""A run's config, composed from the configs that sit beside their readers, and loaded from YAML files merged in
order; an unknown or mistyped key is an error (:class:`vgrpo.errors.ConfigError`, naming the file and the key).

:class:`TrainConfig` is one run's training (rollouts, advantages, optimiser, algorithm, LoRA, precision);
:class:`StageConfig` adds a curriculum stage's prompts, rewards, length and evaluation, and
:class:`CurriculumConfig` lists the stages. Their parts' defaults are the V-GRPO paper's (Tang et al. 2026,
Sec. 4; SD3.5-M stage 1, App. A.2) unless a description says otherwise; ``params/`` files hold only overrides.
``${NAME}`` in a string value is the environment variable ``NAME`` (the real-model params name their weights
``${VGRPO_MODELS}/...``: :func:`expand_variables`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from vgrpo.algorithms.config import (
    AdvantageConfig,
    AlgorithmConfig,
    DiffusionNFTConfig,
    MixGRPOConfig,
    RolloutConfig,
    VGRPOConfig,
)
from vgrpo.config_base import FrozenConfig
from vgrpo.config_batch import check_batch
from vgrpo.errors import ConfigError
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.models.config import LoraConfig, PrecisionConfig
from vgrpo.parallel.distributed import DistributedConfig
from vgrpo.parallel.launch import LaunchConfig
from vgrpo.rewards.config import RewardConfig, check_unique_keys
from vgrpo.training.ema import EMAConfig
from vgrpo.training.optim import OptimConfig

__all__ = [
    "CurriculumConfig",
    "StageConfig",
    "TrainConfig",
    "expand_variables",
    "load_config",
    "load_curriculum",
    "load_stage",
    "merge_overrides",
    "overrides_from_pairs",
    "unset_variables",
]

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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
        algo, rollout = self.algorithm, self.rollout
        if self.distributed.strategy == "fsdp" and self.lora is not None:
            raise ValueError("distributed.strategy=fsdp shards a full fine-tune: set lora: null (or strategy: ddp)")
        check_batch(rollout.prompts_per_iteration, rollout.group_size, self.optim.minibatches)
        if (
            isinstance(algo, (VGRPOConfig, DiffusionNFTConfig))
            and algo.timestep_sampling == "stratified"
            and algo.n_mc > rollout.num_steps
        ):
            raise ValueError(
                f"algorithm.n_mc={algo.n_mc} stratified timesteps need rollout.num_steps >= n_mc "
                f"(got {rollout.num_steps})"
            )
        if isinstance(algo, MixGRPOConfig) and algo.window_size > rollout.num_steps:
            raise ValueError(f"algorithm.window_size={algo.window_size} > rollout.num_steps={rollout.num_steps}")
        if self.lora is None and self.precision.text_encoders == "drop_after_encoding":
            raise ValueError(
                "precision.text_encoders: drop_after_encoding needs lora: a full fine-tune exports the "
                "whole pipeline, text encoders included (use text_encoders: cpu)"
            )
        return self


def overrides_from_pairs(pairs: Sequence[str]) -> dict[str, Any]:
    """Nested overrides from ``key.sub=value`` strings (values parsed as YAML): ``["optim.lr=1e-4"]`` ->
    ``{"optim": {"lr": 1e-4}}``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or "" in key.split("."):
            raise ConfigError(f"--set {pair!r}: expected key.sub=value")
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {pair!r}: {p!r} is already set to a value")
            node = child
        node[leaf] = yaml.safe_load(raw)
    return out


def merge_overrides(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into ``base`` (mappings merge key by key; anything else replaces).

    Changing ``algorithm.name`` drops the base algorithm's other keys: they belong to another schema.
    """
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            if key == "algorithm" and "name" in value and value["name"] != old.get("name"):
                merged[key] = dict(value)
            else:
                merged[key] = merge_overrides(old, value)
        else:
            merged[key] = value
    return merged


def expand_variables(value: Any) -> Any:
    """``value`` (a params file's mapping) with ``${NAME}`` in every string replaced by the environment variable
    ``NAME``. An unset variable is left as written: a run that reads the value refuses it before any compute
    (:func:`vgrpo.training.preflight.preflight` names the stage, the key and the variable), and a config that never
    reads it
    (``Trainer(pipeline=...)`` over the params' ``pipeline``) still loads."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: os.environ.get(m.group(1), m.group(0)), value)
    if isinstance(value, Mapping):
        return {key: expand_variables(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expand_variables(item) for item in value]
    return value


def unset_variables(text: str) -> list[str]:
    """The names of the ``${NAME}`` references in ``text`` that :func:`expand_variables` left (the unset ones)."""
    return _VARIABLE.findall(text)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


ConfigT = TypeVar("ConfigT", bound=BaseModel)


@overload
def load_config(
    paths: Sequence[str | Path] = (),
    overrides: Mapping[str, Any] | None = None,
    *,
    section: str | None = None,
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
    """Load a ``schema`` config (by default :class:`TrainConfig`) from YAML files merged in order, then
    ``overrides``.

    Args:
        paths: params files; later files override earlier ones.
        overrides: a nested mapping applied last (for example from the command line).
        section: read the run config from this top-level key of each file (files that also hold
            other sections); None reads the whole file.

    Raises:
        ConfigError: naming the file(s) and every offending key.
    """
    merged: dict[str, Any] = {}
    sources = []
    for raw in paths:
        path = Path(raw)
        data = expand_variables(_read_yaml(path))
        if section is not None:
            data = data.get(section, {}) or {}
        merged = merge_overrides(merged, data)
        sources.append(str(path))
    if overrides:
        merged = merge_overrides(merged, overrides)
        sources.append("overrides")
    try:
        return schema.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(f"invalid params in {', '.join(sources) or 'defaults'}:\n{_describe(exc)}") from exc


class StageConfig(TrainConfig):
    """A training stage: the run config (rollout, advantage, optim, algorithm, lora) plus its prompts, rewards,
    length, checkpoint cadence, evaluation and how many processes train it (``launch``). Reward weights live on
    the rewards (``rewards[].weight``)."""

    name: str = Field("stage", pattern=r"^[A-Za-z0-9_.-]+$", description="Directory and run name.")
    pipeline: str = Field("models/embedded-base", description="Base pipeline directory (the model params file's).")
    prompts: str = Field(description="Training prompt file (.jsonl metadata or .txt), relative to the project root.")
    prompt_tags: tuple[str, ...] | None = Field(None, description="Keep only rows with these `tag`s; None = all.")
    prompt_tag_weights: dict[str, float] | None = Field(
        None,
        description="Share of each `tag` among the prompts drawn (rows uniform within a tag; every kept tag "
        "needs a weight > 0); None = every row equally likely.",
    )
    rewards: tuple[RewardConfig, ...] = Field(min_length=1)
    iterations: int = Field(ge=1, description="Iterations of the stage (paper SD3.5: 150 / 200 / 150 / 50 / 30).")
    checkpoint_every: int = Field(10, ge=1, description="Iterations between resumable checkpoints.")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints of the run kept; older ones are deleted.")
    max_consecutive_skips: int = Field(
        3, ge=1, description="Iterations in a row skipped for NaN/Inf (vgrpo.training.guards) before the stage stops."
    )
    eval_every: int = Field(0, ge=0, description="Iterations between evaluations; 0 = only after the last one.")
    eval_at_start: bool = Field(
        True, description="With eval_every, also evaluate before the first iteration (off when the start is known)."
    )
    eval_prompts: str | None = Field(None, description="Evaluation prompt file; None = no evaluation.")
    evaluation: EvaluationConfig = EvaluationConfig()
    launch: LaunchConfig = LaunchConfig()

    @model_validator(mode="after")
    def _check_stage(self) -> StageConfig:
        check_unique_keys(self.rewards)
        rollout = self.rollout
        self.launch.check_fits(
            autocast=self.precision.autocast,
            prompts_per_iteration=rollout.prompts_per_iteration,
            group_size=rollout.group_size,
            minibatches=self.optim.minibatches,
        )
        if self.prompt_tag_weights is not None and any(w <= 0 for w in self.prompt_tag_weights.values()):
            raise ValueError(f"prompt_tag_weights must all be > 0, got {self.prompt_tag_weights}")
        if self.advantage.weights:
            raise ValueError("a stage weights its rewards with rewards[].weight; leave advantage.weights empty")
        return self


class CurriculumConfig(FrozenConfig):
    """Stages in order, each starting from the previous one's adapter: params files merged as
    ``base files -> model file -> stage file -> overrides``."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    base: tuple[str, ...] = ("params/base.yaml",)
    model: str = Field(description="Params file of the model (pipeline, rollout, LoRA, evaluation).")
    stages: tuple[str, ...] = Field(min_length=1, description="Params files of the stages, in order.")


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
            [*(root / f for f in (*curriculum.base, curriculum.model, stage)), *extra], overrides, schema=StageConfig
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
