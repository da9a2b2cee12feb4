"""A run's config, composed from the configs that sit beside their readers, and loaded from YAML files merged in
order; an unknown or mistyped key is an error (:class:`vgrpo.errors.ConfigError`, naming the file and the key).

:class:`TrainConfig` is one run's training (rollouts, advantages, optimiser, algorithm, LoRA, precision);
:class:`StageConfig` adds a curriculum stage's prompts, rewards, length and evaluation, and
:class:`CurriculumConfig` lists the stages. Their parts' defaults are the V-GRPO paper's (Tang et al. 2026,
Sec. 4; SD3.5-M stage 1, App. A.2) unless a description says otherwise; ``params/`` files hold only overrides.
``${VGRPO_NAME}`` in a string value is the environment variable ``VGRPO_NAME`` (the real-model params name their
weights ``${VGRPO_MODELS}/...``: :func:`expand_variables`); no other variable is read, so a params file cannot copy
a secret (``${AWS_SECRET_ACCESS_KEY}``) into a value that is logged.
"""

from __future__ import annotations

import os
import re
import reprlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast, overload

import yaml
from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer, model_validator

from vgrpo.algorithms.config import (
    AdvantageConfig,
    AlgorithmConfig,
    DiffusionNFTConfig,
    MixGRPOConfig,
    RolloutConfig,
    VGRPOConfig,
)
from vgrpo.config_base import MAX_ITERATIONS, MAX_SAMPLES_PER_ITERATION, FrozenConfig
from vgrpo.config_batch import check_batch
from vgrpo.errors import ConfigError, read_user_text
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.models.config import LoraConfig, PrecisionConfig
from vgrpo.parallel.distributed import DistributedConfig
from vgrpo.parallel.launch import LaunchConfig
from vgrpo.rewards.config import RewardConfig, check_unique_keys
from vgrpo.training.ema import EMAConfig
from vgrpo.training.hold import HoldConfig
from vgrpo.training.optim import OptimConfig

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
        if rollout.prompts_per_iteration * rollout.group_size > MAX_SAMPLES_PER_ITERATION:
            raise ValueError(
                f"rollout.prompts_per_iteration x rollout.group_size = {rollout.prompts_per_iteration} x "
                f"{rollout.group_size} samples per iteration, more than {MAX_SAMPLES_PER_ITERATION:,}"
            )
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
        if self.lora is None and self.precision.merged_lora:
            raise ValueError("precision.merged_lora needs lora: a full fine-tune has no adapter to merge")
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


EXPANDED_PREFIX = "VGRPO_"
"""The environment variables a params file may name (``${VGRPO_MODELS}``): the project's own, never a credential
the process happens to hold (a reward's API key is named by ``api_key_env`` and read where it is sent)."""


def expand_variables(value: Any) -> Any:
    """``value`` (a params file's mapping) with ``${VGRPO_NAME}`` in every string replaced by the environment
    variable ``VGRPO_NAME``. An unset variable is left as written: a run that reads the value refuses it before any
    compute (:func:`vgrpo.training.preflight.preflight` names the stage, the key and the variable), and a config
    that never reads it (``Trainer(pipeline=...)`` over the params' ``pipeline``) still loads.

    Raises:
        ConfigError: a ``${NAME}`` outside :data:`EXPANDED_PREFIX` (naming it).
    """
    if isinstance(value, str):
        return _VARIABLE.sub(_expanded, value)
    if isinstance(value, Mapping):
        return {key: expand_variables(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expand_variables(item) for item in value]
    return value


def _expanded(match: re.Match[str]) -> str:
    name = match.group(1)
    if not name.startswith(EXPANDED_PREFIX):
        raise ConfigError(
            f"${{{name}}}: params may name only {EXPANDED_PREFIX}* environment variables (a secret must never reach "
            "a logged value; a reward's API key goes by api_key_env)"
        )
    return os.environ.get(name, match.group(0))


def unset_variables(text: str) -> list[str]:
    """The names of the ``${NAME}`` references in ``text`` that :func:`expand_variables` left (the unset ones)."""
    return _VARIABLE.findall(text)


MAX_PARAMS_BYTES = 1 << 20
"""Largest params file read (a real one is a few kB)."""
MAX_PARAMS_VALUES = 100_000
"""Most values a params file may hold once its YAML aliases are expanded (a real one holds a few hundred); an alias
bomb, whose few lines expand to billions, is refused before anything walks it."""
MAX_PARAMS_DEPTH = 64
"""Deepest nesting of mappings and lists in a params file."""


def _node_problem(root: yaml.Node, path: Path) -> str | None:
    """A key set twice in one mapping (at any depth), nesting deeper than :data:`MAX_PARAMS_DEPTH`, or more than
    :data:`MAX_PARAMS_VALUES` values after alias expansion; found on the composed node graph, whose aliases are
    shared nodes, so the walk visits each node once however often it is referred to."""
    sizes: dict[int, int] = {}

    def walk(node: yaml.Node, where: str, depth: int) -> int | str:
        if id(node) in sizes:
            return sizes[id(node)]
        if depth > MAX_PARAMS_DEPTH:
            line = node.start_mark.line + 1
            return f"{path}: line {line}: {where or 'the file'} nests deeper than {MAX_PARAMS_DEPTH} levels"
        size = 1
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    key = "<<"
                else:
                    key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                    line = key_node.start_mark.line + 1
                    if key in first_line:
                        dotted = f"{where}.{key}" if where else key
                        return (
                            f"{path}: line {line}: key {dotted!r} is set twice (first on line {first_line[key]}); "
                            "a params file sets each key once"
                        )
                    first_line[key] = line
                found = walk(value_node, f"{where}.{key}" if where else key, depth + 1)
                if isinstance(found, str):
                    return found
                size += found
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                found = walk(item, f"{where}[{i}]", depth + 1)
                if isinstance(found, str):
                    return found
                size += found
        if size > MAX_PARAMS_VALUES:
            return (
                f"{path}: {where or 'the file'} expands to more than {MAX_PARAMS_VALUES:,} values (YAML aliases "
                "referring to aliases); a params file holds a few hundred"
            )
        sizes[id(node)] = size
        return size

    found = walk(root, "", 0)
    return found if isinstance(found, str) else None


def read_params(path: str | Path) -> dict[str, Any]:
    """A params file's mapping, ``${NAME}`` expanded (:func:`expand_variables`).

    Raises:
        ConfigError: naming the file (and the key and line) when it is missing, larger than
            :data:`MAX_PARAMS_BYTES`, not YAML, not a mapping, sets a key twice, nests too deep or expands its
            aliases past :data:`MAX_PARAMS_VALUES` values.
    """
    path = Path(path)
    text = read_user_text(path, "params file", MAX_PARAMS_BYTES, ConfigError)
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return {}
        problem = _node_problem(root, path)
        if problem:
            raise ConfigError(problem)
        data = loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: nests deeper than {MAX_PARAMS_DEPTH} levels") from exc
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return cast(dict[str, Any], expand_variables(data))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _describe(exc: ValidationError) -> str:
    """One line per error, naming its dotted key; a list's "too short" that only echoes its items' errors is left
    out."""
    errors = exc.errors()
    locs = [tuple(err["loc"]) for err in errors]
    lines = []
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "too_short" and any(len(o) > len(loc) and o[: len(loc)] == loc for o in locs):
            continue
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        given = "" if isinstance(err.get("input"), Mapping) else f" (got {reprlib.repr(err.get('input'))})"
        lines.append(f"  {where}: {err['msg']}{given}")
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
        data = read_params(path)
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

    @model_validator(mode="after")
    def _check_stage(self) -> StageConfig:
        check_unique_keys(self.rewards)
        if self.hold is not None:
            if self.launch.processes > 1 or self.distributed.strategy == "fsdp":
                raise ValueError("hold: checks run in one process; a launched or sharded stage cannot hold yet")
            if self.hold.reference == "base" and self.lora is None:
                raise ValueError("hold.reference: base needs lora (a full fine-tune keeps no base weights apart)")

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

    @model_serializer(mode="wrap")
    def _without_unset_hold(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Without ``hold`` when it is None: a stage without it dumps (and so fingerprints, and is recorded in
        benchmark cells) as it did before the option existed."""
        data = handler(self)
        if isinstance(data, dict) and data.get("hold", 0) is None:
            del data["hold"]
        return data


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
