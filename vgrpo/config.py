"""Typed, frozen configs for a training run, loaded from YAML; an unknown or mistyped key is an error.

Defaults are the paper's (algorithm.md §3-4, SD3.5-M stage 1) unless a comment says otherwise;
``[inferred]`` marks reconstructions the reference could not confirm. ``params/`` files hold only
overrides of these defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, overload

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "AdvantageConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CurriculumConfig",
    "DiffusionNFTConfig",
    "EmbeddedModelConfig",
    "EvaluationConfig",
    "FlowGRPOConfig",
    "FrozenConfig",
    "LoraConfig",
    "MixGRPOConfig",
    "NaiveELBOConfig",
    "OptimConfig",
    "PrecisionConfig",
    "RewardConfig",
    "RolloutConfig",
    "StageConfig",
    "TrainConfig",
    "VGRPOConfig",
    "load_config",
    "load_curriculum",
    "merge_overrides",
    "overrides_from_pairs",
]


class ConfigError(ValueError):
    """A params file or override is invalid; the message names the file and the key."""


class FrozenConfig(BaseModel):
    """Base of every config: frozen, and an unknown key is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RolloutConfig(FrozenConfig):
    prompts_per_iteration: int = Field(8, ge=1, description="B: prompts per iteration (paper SD3.5: 48).")
    group_size: int = Field(8, ge=2, description="G: samples per prompt (paper SD3.5: 24; FLUX: 12).")
    num_steps: int = Field(10, ge=1, description="Sampler steps T (paper SD3.5: 40 ODE steps).")
    shift: float | None = Field(3.0, gt=0, description="SD3 static timestep shift; None for no shift.")
    dynamic_shift: bool = Field(
        False, description="FLUX: shift from the image token count (diffusers calculate_shift); needs shift: null."
    )
    resolution: int | None = Field(
        None, gt=0, description="Image side in pixels (FLUX: 720); None = the pipeline's default. The adapter "
        "checks it is a multiple of the VAE factor x patch size (FLUX.1: 16).",
    )  # fmt: skip
    micro_batch_size: int = Field(32, ge=1, description="Samples per model call in rollouts (memory only).")

    @model_validator(mode="after")
    def _check_shift(self) -> RolloutConfig:
        if self.dynamic_shift and self.shift is not None:
            raise ValueError(f"dynamic_shift replaces the static shift: set shift to null (got shift={self.shift})")
        return self


class AdvantageConfig(FrozenConfig):
    aggregation: Literal["normalize_then_sum", "sum_then_normalize"] = "normalize_then_sum"
    std_scope: Literal["group", "global"] = "group"
    delta: float = Field(1e-4, gt=0, description="Added to the std so constant groups stay finite.")
    soft_clip_eta: float | None = Field(3.0, gt=0, description="V-GRPO Eq. 17 (SD3.5: 3, FLUX: 2); None = off.")
    clamp: float | None = Field(None, gt=0, description="Hard clamp |A| (Flow-GRPO: 5); None = off.")
    weights: dict[str, float] = Field(default_factory=dict, description="Reward weights; empty = 1 each.")


class OptimConfig(FrozenConfig):
    lr: float = Field(3e-4, gt=0, description="AdamW lr (SD3.5 LoRA: 3e-4; FLUX full: 1e-5).")
    weight_decay: float = Field(1e-4, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(1e-8, gt=0)
    max_grad_norm: float | None = Field(1.0, gt=0, description="[inferred] global-norm clip; None = off.")
    gradient_steps: int = Field(1, ge=1, description="Optimizer steps per iteration (SD3.5: 1, FLUX: 4).")
    minibatches: int = Field(
        1, ge=1, description="Each step uses 1/minibatches of the batch, cycling; 1 = full batch [inferred]."
    )
    micro_batch_size: int = Field(16, ge=1, description="Samples per forward/backward (memory only).")


class LoraConfig(FrozenConfig):
    rank: int = Field(32, ge=1)
    alpha: int = Field(64, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: tuple[str, ...] = (
        "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    )  # fmt: skip


class PrecisionConfig(FrozenConfig):
    """How the model computes; the surrogates, ratios and losses are always float32."""

    autocast: Literal["fp32", "bf16"] = Field(
        "fp32", description="bf16 autocast of the transformer in rollouts and training (GPU runs); fp32 = off."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward (memory for time).")


class VGRPOConfig(FrozenConfig):
    """V-GRPO, algorithm.md §3: every variance-reduction technique and step control switchable."""

    name: Literal["vgrpo"] = "vgrpo"
    n_mc: int = Field(4, ge=1, description="Monte Carlo pairs per sample (paper: 4; [inferred] 10 GenEval/OCR).")
    share: Literal["batch", "group", "none"] = Field("batch", description="Technique 1: pair sharing scope.")
    timestep_sampling: Literal["stratified", "uniform", "logit_normal"] = Field(
        "stratified", description="Technique 2."
    )
    prediction: Literal["x", "v", "eps"] = Field("x", description="Technique 3: residual space.")
    self_normalize: bool = Field(True, description="Technique 4: divide by sg(mean |residual|).")
    clip_range: float | None = Field(None, gt=0, description="PPO ratio clip (FLUX: 1e-2 / 6e-3); None = off.")
    kl_coef: float = Field(0.0, ge=0, description="beta of the x-space KL to the behaviour policy (stage 5: 0.3).")
    ref_kl_coef: float = Field(
        0.0,
        ge=0,
        description="beta_ref of the same x-space KL to the stage's starting weights (the frozen reference, as "
        "Flow-GRPO's KL); 0 = off, as in the paper.",
    )
    memory_bounded: bool = Field(True, description="Two-pass update (one graph at a time) vs one full graph.")
    logit_normal_mean: float = 0.0
    logit_normal_std: float = Field(1.0, gt=0)


class NaiveELBOConfig(VGRPOConfig):
    """The paper's unstable baseline: V-GRPO with all four variance-reduction techniques off."""

    name: Literal["naive_elbo"] = "naive_elbo"  # type: ignore[assignment]
    share: Literal["batch", "group", "none"] = "none"
    timestep_sampling: Literal["stratified", "uniform", "logit_normal"] = "uniform"
    prediction: Literal["x", "v", "eps"] = "v"
    self_normalize: bool = False


class FlowGRPOConfig(FrozenConfig):
    """Flow-GRPO (MDP over SDE steps), algorithm.md §5."""

    name: Literal["flow_grpo"] = "flow_grpo"
    noise_level: float = Field(0.7, gt=0, description="a in sigma_t = a sqrt(t / (1 - t)).")
    clip_range: float = Field(1e-4, gt=0)
    kl_coef: float = Field(0.04, ge=0, description="KL to the frozen reference (GenEval/OCR 0.04, PickScore 0.01).")
    timestep_fraction: float = Field(0.99, gt=0, le=1, description="Fraction of SDE steps trained per sample.")


class MixGRPOConfig(FlowGRPOConfig):
    """MixGRPO: SDE and training only inside a sliding window of steps, ODE elsewhere."""

    name: Literal["mixgrpo"] = "mixgrpo"  # type: ignore[assignment]
    window_size: int = Field(4, ge=1)
    shift_interval: int = Field(25, ge=1, description="Iterations between window advances.")
    timestep_fraction: float = Field(1.0, gt=0, le=1)
    kl_coef: float = Field(0.0, ge=0)


class DiffusionNFTConfig(FrozenConfig):
    """DiffusionNFT (likelihood-free, positive/negative velocities), algorithm.md §5."""

    name: Literal["diffusion_nft"] = "diffusion_nft"
    beta: float = Field(1.0, gt=0, description="b in v+ = b v_theta + (1 - b) v_old.")
    adv_max: float = Field(5.0, gt=0, description="r = clip(A / adv_max / 2 + 0.5, 0, 1).")
    n_mc: int = Field(4, ge=1, description="[inferred] training timesteps per sample and iteration.")
    timestep_sampling: Literal["stratified", "uniform", "logit_normal"] = "uniform"
    ema_decay_rate: float = Field(0.001, ge=0, description="[inferred] old-policy EMA decay = min(rate * it, max).")
    ema_decay_max: float = Field(0.5, ge=0, le=1)


class EMAConfig(FrozenConfig):
    """``ema:`` in a stage's params. Off by default (the paper's FLUX recipe states no EMA)."""

    enabled: bool = Field(False, description="Keep an EMA of the trainable weights; evaluate and export it.")
    decay: float = Field(0.9, ge=0.0, lt=1.0, description="EMA decay (Flow-GRPO's SD3 trainer: 0.9).")
    every: int = Field(1, ge=1, description="Iterations between EMA updates.")
    warmup: bool = Field(
        True, description="Decay min((1 + n) / (10 + n), decay) at update n, as Flow-GRPO's EMA; off: decay throughout."
    )


AlgorithmConfig = Annotated[
    VGRPOConfig | NaiveELBOConfig | FlowGRPOConfig | MixGRPOConfig | DiffusionNFTConfig,
    Field(discriminator="name"),
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

    @model_validator(mode="after")
    def _check_cross_fields(self) -> TrainConfig:
        algo, rollout = self.algorithm, self.rollout
        num_samples = rollout.prompts_per_iteration * rollout.group_size
        if num_samples % self.optim.minibatches:
            raise ValueError(
                f"optim.minibatches={self.optim.minibatches} must divide the batch "
                f"(rollout.prompts_per_iteration x rollout.group_size = {num_samples})"
            )
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
        return self


class EmbeddedModelConfig(FrozenConfig):
    """Architecture of the embedded default pipeline (:mod:`vgrpo.models.embedded`)."""

    resolution: int = Field(32, ge=8, description="Image side in pixels.")
    vocab_size: int = Field(1000, ge=300, description="BPE vocabulary cap (the world needs about 430).")
    max_text_tokens: int = Field(20, ge=4, description="CLIP context length (world prompts need <= 17).")
    text_hidden_size: int = Field(64, ge=8)
    text_layers: int = Field(2, ge=2, description="SD3 reads the penultimate layer, so at least 2.")
    text_heads: int = Field(4, ge=1)
    text_projection_dim: int = Field(32, ge=4)
    vae_channels: tuple[int, ...] = Field(
        (16, 32), min_length=1, description="Encoder widths; each block after the first halves the resolution."
    )
    vae_layers_per_block: int = Field(1, ge=1)
    vae_norm_groups: int = Field(8, ge=1)
    latent_channels: int = Field(4, ge=1)
    patch_size: int = Field(
        2, ge=1, description="Transformer patch on the 16 x 16 latents: 64 tokens of 2 x 2 x 4 = 16 values."
    )
    num_layers: int = Field(4, ge=1)
    attention_head_dim: int = Field(32, ge=4)
    num_attention_heads: int = Field(4, ge=1)
    scheduler_shift: float = Field(1.0, gt=0, description="Static shift of the sampling schedule.")

    @model_validator(mode="after")
    def _check_shapes(self) -> EmbeddedModelConfig:
        down = 2 ** (len(self.vae_channels) - 1)
        if self.resolution % (down * self.patch_size):
            raise ValueError(
                f"resolution={self.resolution} must be divisible by the VAE downsampling ({down}) x patch_size "
                f"({self.patch_size})"
            )
        if any(c % self.vae_norm_groups for c in self.vae_channels):
            raise ValueError(f"vae_norm_groups={self.vae_norm_groups} must divide every vae_channels entry")
        if self.text_hidden_size % self.text_heads:
            raise ValueError(f"text_heads={self.text_heads} must divide text_hidden_size={self.text_hidden_size}")
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
        data = _read_yaml(path)
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


# --- Rewards and evaluation (vgrpo/rewards/, vgrpo/evaluation.py) ------------------------------------------------


class RewardConfig(FrozenConfig):
    """One reward of a set (:class:`vgrpo.rewards.multi.RewardTerm`), built by name from the registry."""

    name: str = Field(
        description="Registry name (vgrpo.rewards.registry.REWARDS: geneval, ocr, pickscore, ...), an entry point of "
        "the `vgrpo.rewards` group, or `module:Class` (a Reward subclass) / `module:function` (a reward function)."
    )
    key: str | None = Field(None, description="Name in logs and tables; default `name`. Needed to use one twice.")
    weight: float = Field(1.0, description="w_m in A = sum_m w_m A^m (algorithm.md §2).")
    offset: float = Field(0.0, description="Normalised score (s - offset) / scale; MixGRPO's PickScore: 18.")
    scale: float = Field(1.0, gt=0, description="MixGRPO's PickScore: 8; flow_grpo's PickScore: 26.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the reward's class.")

    @model_validator(mode="after")
    def _check_name(self) -> RewardConfig:
        from vgrpo.rewards.registry import resolve_reward

        try:
            resolve_reward(self.name)  # imports a user's reward now, so a typo fails before any compute
        except (KeyError, TypeError) as exc:
            raise ValueError(exc.args[0] if exc.args else str(exc)) from exc  # str(KeyError) adds quotes
        return self

    @property
    def resolved_key(self) -> str:
        from vgrpo.rewards.registry import reward_key

        return reward_key(self.name, self.key)


def _unique_reward_keys(rewards: Sequence[RewardConfig]) -> None:
    keys = [r.resolved_key for r in rewards]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"reward keys {dupes} are used twice; give one of them another `key`")


class EvaluationConfig(FrozenConfig):
    """The evaluation routine (:func:`vgrpo.evaluation.evaluate`): fixed prompts, fixed seeds, a table."""

    group_size: int = Field(4, ge=1, description="Samples per prompt (GenEval: 4).")
    num_steps: int = Field(20, ge=1, description="Euler steps (paper: 40 for SD3.5-M, 50 for FLUX).")
    seed: int = 0
    max_prompts: int | None = Field(None, ge=1, description="First N prompts of the prompt file; None = all.")
    guidance_scale: float | None = Field(None, gt=0, description="CFG scale; None or 1 = off (SD3.5-M: 4.5).")
    p_mix: float | None = Field(None, ge=0, le=1, description="Hybrid sampling with `base_pipeline` (FLUX: 0.8).")
    base_pipeline: str | None = Field(None, description="Pipeline directory of the base for hybrid sampling.")
    micro_batch: int = Field(64, ge=1, description="Samples per sampler call (memory only).")
    overlap: bool = Field(
        False, description="Score chunk k while sampling chunk k+1 (helps when they use different devices)."
    )
    grid_prompts: int = Field(8, ge=0, description="Prompts shown in the image grid (all their samples).")
    rewards: tuple[RewardConfig, ...] = Field(
        (RewardConfig(name="geneval"), RewardConfig(name="ocr")), min_length=1, description="What the table reports."
    )

    @model_validator(mode="after")
    def _check(self) -> EvaluationConfig:
        if (self.p_mix is None) != (self.base_pipeline is None):
            raise ValueError("hybrid sampling needs both p_mix and base_pipeline (or neither)")
        _unique_reward_keys(self.rewards)
        return self


# --- One stage of a curriculum (vgrpo/stage.py) ----------------------------------------------------------------


class StageConfig(TrainConfig):
    """A training stage: the run config (rollout, advantage, optim, algorithm, lora) plus its prompts, rewards,
    length, checkpoint cadence and evaluation. Reward weights live on the rewards (``rewards[].weight``)."""

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
        3, ge=1, description="Iterations in a row skipped for NaN/Inf (vgrpo.guards) before the stage stops."
    )
    eval_every: int = Field(0, ge=0, description="Iterations between evaluations; 0 = only after the last one.")
    eval_at_start: bool = Field(
        True, description="With eval_every, also evaluate before the first iteration (off when the start is known)."
    )
    eval_prompts: str | None = Field(None, description="Evaluation prompt file; None = no evaluation.")
    evaluation: EvaluationConfig = EvaluationConfig()

    @model_validator(mode="after")
    def _check_stage(self) -> StageConfig:
        _unique_reward_keys(self.rewards)
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
