"""Configs of the rollouts, the advantages and the five algorithms (the ``rollout:``, ``advantage:`` and
``algorithm:`` sections of a run's params).

Defaults are the V-GRPO paper's (Tang et al. 2026, Sec. 4; SD3.5-M stage 1, App. A.2) unless a description says
otherwise; ``[inferred]`` marks reconstructions the paper's text could not confirm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from vgrpo.config_base import (
    MAX_GROUP_SIZE,
    MAX_ITERATIONS,
    MAX_MICRO_BATCH,
    MAX_N_MC,
    MAX_PROMPTS_PER_ITERATION,
    MAX_RESOLUTION,
    MAX_STEPS,
    FrozenConfig,
)

__all__ = [
    "AdvantageConfig",
    "AlgorithmConfig",
    "AlgorithmOptions",
    "DiffusionNFTConfig",
    "FlowGRPOConfig",
    "MixGRPOConfig",
    "NaiveELBOConfig",
    "RolloutConfig",
    "VGRPOConfig",
]


class RolloutConfig(FrozenConfig):
    prompts_per_iteration: int = Field(
        8, ge=1, le=MAX_PROMPTS_PER_ITERATION, description="B: prompts per iteration (paper SD3.5: 48)."
    )
    group_size: int = Field(
        8, ge=2, le=MAX_GROUP_SIZE, description="G: samples per prompt (paper SD3.5: 24; FLUX: 12)."
    )
    num_steps: int = Field(10, ge=1, le=MAX_STEPS, description="Sampler steps T (paper SD3.5: 40 ODE steps).")
    shift: float | None = Field(3.0, gt=0, description="SD3 static timestep shift; None for no shift.")
    dynamic_shift: bool = Field(
        False, description="FLUX: shift from the image token count (diffusers calculate_shift); needs shift: null."
    )
    resolution: int | None = Field(
        None,
        gt=0,
        le=MAX_RESOLUTION,
        description="Image side in pixels (FLUX: 720); None = the pipeline's default. The adapter "
        "checks it is a multiple of the VAE factor x patch size (FLUX.1: 16).",
    )
    num_frames: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Frames per video of a video family (Wan2.1: 4k + 1; its latents carry a frame axis); None = "
        "the pipeline's default (Wan2.1: 81); an image family refuses it.",
    )
    schedule: Literal["uniform", "diffusers"] = Field(
        "uniform",
        description="Sigma grid (vgrpo.flow.timestep_grid): `uniform` = shift(linspace(1, 0, T + 1)), FluxPipeline's "
        "and the FastVideo-based RL code's (DanceGRPO, MixGRPO); `diffusers` = FlowMatchEulerDiscreteScheduler."
        "set_timesteps(T) without sigmas, StableDiffusion3Pipeline's and Flow-GRPO's (its last step is short: "
        "penultimate sigma 0.0089 at T = 10, shift 3, against 0.25).",
    )
    micro_batch_size: int = Field(
        32, ge=1, le=MAX_MICRO_BATCH, description="Samples per model call in rollouts (memory only)."
    )
    group_noise: Literal["independent", "shared"] = Field(
        "independent",
        description="Initial noise of a prompt's G samples: `shared` = one draw for the whole group, MixGRPO's "
        "init_same_noise (the group then differs only by its SDE noise, so an ODE rollout refuses it).",
    )

    LATER_OPTIONS: ClassVar[Mapping[str, Any]] = {"group_noise": "independent"}

    @model_validator(mode="after")
    def _check_shift(self) -> RolloutConfig:
        if self.dynamic_shift and self.shift is not None:
            raise ValueError(f"dynamic_shift replaces the static shift: set shift to null (got shift={self.shift})")
        if self.dynamic_shift and self.schedule == "diffusers":
            raise ValueError(
                "schedule: diffusers is the SD3 pipeline's static-shift schedule; with FLUX's dynamic shift "
                "FluxPipeline passes its own sigmas, which is schedule: uniform"
            )
        return self


class AdvantageConfig(FrozenConfig):
    aggregation: Literal["normalize_then_sum", "sum_then_normalize"] = "normalize_then_sum"
    std_scope: Literal["group", "global"] = "group"
    std_ddof: Literal[0, 1] = Field(
        0,
        description="Delta degrees of freedom of the std. 0 (the default) = the population std, Flow-GRPO's np.std "
        "(its per-prompt stat tracker), with which the embedded curriculum was recorded; 1 = torch's unbiased std, "
        "by which the FastVideo-based GRPO code (DanceGRPO, MixGRPO) divides, the lineage of the official V-GRPO "
        "code ([inferred]: the SD3.5 and FLUX params set 1).",
    )
    delta: float = Field(1e-4, gt=0, description="Added to the std so constant groups stay finite.")
    soft_clip_eta: float | None = Field(3.0, gt=0, description="V-GRPO Eq. 17 (SD3.5: 3, FLUX: 2); None = off.")
    clamp: float | None = Field(None, gt=0, description="Hard clamp |A| (Flow-GRPO: 5); None = off.")
    weights: dict[str, float] = Field(default_factory=dict, description="Reward weights; empty = 1 each.")


class AlgorithmOptions(FrozenConfig):
    """What every algorithm's config answers besides its options: whether a rollout suits it, and how many copies
    of the weights it keeps besides the policy (what a checkpoint saves, :meth:`vgrpo.algorithms.base.Algorithm.
    snapshots`; the preflight's disk estimate reads it)."""

    def check_rollout(self, rollout: RolloutConfig) -> None:
        """Raise ``ValueError`` (naming the keys) when ``rollout`` cannot feed this algorithm."""

    def weight_copies(self) -> int:
        """Copies of the policy's trainable weights the algorithm keeps (a frozen reference, an old policy)."""
        return 0


def _check_ode_rollout(name: str, rollout: RolloutConfig) -> None:
    """An ODE rollout is a function of its initial noise: shared group noise would make a group one image."""
    if rollout.group_noise == "shared":
        raise ValueError(
            f"rollout.group_noise=shared: {name} samples by ODE, so every sample of a group would be the same image "
            "(shared noise is for SDE rollouts: flow_grpo, mixgrpo)"
        )


def _check_stratified(n_mc: int, timestep_sampling: str, rollout: RolloutConfig) -> None:
    """Stratified timesteps draw one timestep from each of ``n_mc`` strata of the rollout's steps."""
    if timestep_sampling == "stratified" and n_mc > rollout.num_steps:
        raise ValueError(
            f"algorithm.n_mc={n_mc} stratified timesteps need rollout.num_steps >= n_mc (got {rollout.num_steps})"
        )


class VGRPOConfig(AlgorithmOptions):
    """V-GRPO (Tang et al. 2026, Sec. 4): the ELBO surrogate with each variance-reduction technique (Sec. 4.4)
    and each gradient-step control (Sec. 4.5) switchable."""

    name: Literal["vgrpo"] = "vgrpo"
    n_mc: int = Field(
        4, ge=1, le=MAX_N_MC, description="Monte Carlo pairs per sample (paper: 4; [inferred] 10 GenEval/OCR)."
    )
    share: Literal["batch", "group", "none"] = Field("batch", description="Technique 1: pair sharing scope.")
    timestep_sampling: Literal["stratified", "uniform", "logit_normal"] = Field(
        "stratified", description="Technique 2."
    )
    prediction: Literal["x", "v", "eps"] = Field("x", description="Technique 3: residual space.")
    self_normalize: bool = Field(True, description="Technique 4: divide by sg(mean |residual|).")
    clip_range: float | None = Field(None, gt=0, description="PPO ratio clip (FLUX: 1e-2 / 6e-3); None = off.")
    kl_coef: float = Field(
        0.0, ge=0, description="beta of the x-space KL to the behaviour policy, V-GRPO Eq. 16 (stage 5: 0.3)."
    )
    ref_kl_coef: float = Field(
        0.0,
        ge=0,
        description="beta_ref of the same x-space KL to the stage's starting weights (the frozen reference, as "
        "Flow-GRPO's KL); 0 = off, as in the paper.",
    )
    ref_kl_reference: Literal["start", "base"] = Field(
        "start",
        description="The frozen reference of ref_kl_coef: `start` = the stage's starting weights; `base` = the "
        "pretrained model (a LoRA's deltas zeroed, as FlowGRPOConfig.reference), so every stage is held to the base.",
    )
    memory_bounded: bool | Literal["auto"] = Field(
        True,
        description="Two-pass update (one graph at a time) vs one full graph (faster, every graph alive at once); "
        "`auto` = the full graph when its measured size fits update_memory_mb.",
    )
    update_memory_mb: float | None = Field(
        None,
        gt=0,
        description="With memory_bounded=auto: the MB the update's graphs may hold; None = half the memory the "
        "device has available at the first update (so the choice depends on the machine).",
    )
    logit_normal_mean: float = 0.0
    logit_normal_std: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _budget_needs_auto(self) -> VGRPOConfig:
        if self.update_memory_mb is not None and self.memory_bounded != "auto":
            raise ValueError(
                f"algorithm.update_memory_mb={self.update_memory_mb} is read only with algorithm.memory_bounded=auto "
                f"(got memory_bounded={self.memory_bounded})"
            )
        return self

    def check_rollout(self, rollout: RolloutConfig) -> None:
        _check_stratified(self.n_mc, self.timestep_sampling, rollout)
        _check_ode_rollout(f"algorithm.name={self.name}", rollout)

    def weight_copies(self) -> int:
        return int(self.ref_kl_coef > 0)  # the frozen reference of ref_kl_coef

    LATER_OPTIONS: ClassVar[Mapping[str, Any]] = {"ref_kl_reference": "start", "update_memory_mb": None}


class NaiveELBOConfig(VGRPOConfig):
    """The paper's unstable baseline: V-GRPO with all four variance-reduction techniques off."""

    name: Literal["naive_elbo"] = "naive_elbo"  # type: ignore[assignment]
    share: Literal["batch", "group", "none"] = "none"
    timestep_sampling: Literal["stratified", "uniform", "logit_normal"] = "uniform"
    prediction: Literal["x", "v", "eps"] = "v"
    self_normalize: bool = False


class FlowGRPOConfig(AlgorithmOptions):
    """Flow-GRPO (Liu et al. 2025): an MDP over the steps of its ODE-to-SDE sampler (Sec. 4.1)."""

    name: Literal["flow_grpo"] = "flow_grpo"
    noise_level: float = Field(0.7, gt=0, description="a in sigma_t = a sqrt(t / (1 - t)).")
    clip_range: float = Field(1e-4, gt=0)
    kl_coef: float = Field(0.04, ge=0, description="KL to the frozen reference (GenEval/OCR 0.04, PickScore 0.01).")
    timestep_fraction: float = Field(0.99, gt=0, le=1, description="Fraction of SDE steps trained per sample.")
    timestep_order: Literal["shuffled", "first"] = Field(
        "shuffled",
        description="Which of the SDE steps each sample trains on: `shuffled` = a random subset per sample (the "
        "first Flow-GRPO release's per-sample time shuffle); `first` = the first timestep_fraction of them in order, "
        "the same for every sample (the later release's train_timesteps: at 0.99 every step but the last).",
    )
    reference: Literal["base", "start"] = Field(
        "base",
        description="The KL's frozen reference: `base` = the pretrained model (a LoRA's weights zeroed, so a stage "
        "that starts from an earlier stage's adapter is still held to the base, as Flow-GRPO's reference is the "
        "base model); `start` = the stage's starting weights. Under full fine-tuning both are the weights the "
        "stage loaded.",
    )

    def weight_copies(self) -> int:
        return int(self.kl_coef > 0)  # the KL's frozen reference

    LATER_OPTIONS: ClassVar[Mapping[str, Any]] = {"timestep_order": "shuffled"}


class MixGRPOConfig(FlowGRPOConfig):
    """MixGRPO (Li et al. 2025): SDE and training only inside a sliding window of steps, ODE elsewhere."""

    name: Literal["mixgrpo"] = "mixgrpo"  # type: ignore[assignment]
    window_size: int = Field(4, ge=1, le=MAX_STEPS)
    shift_interval: int = Field(25, ge=1, le=MAX_ITERATIONS, description="Iterations between window advances.")
    timestep_fraction: float = Field(1.0, gt=0, le=1)
    kl_coef: float = Field(0.0, ge=0)

    def check_rollout(self, rollout: RolloutConfig) -> None:
        if self.window_size > rollout.num_steps:
            raise ValueError(f"algorithm.window_size={self.window_size} > rollout.num_steps={rollout.num_steps}")


class DiffusionNFTConfig(AlgorithmOptions):
    """DiffusionNFT (Zheng et al. 2025): likelihood-free, trained on positive and negative velocities."""

    name: Literal["diffusion_nft"] = "diffusion_nft"
    beta: float = Field(1.0, gt=0, description="b in v+ = b v_theta + (1 - b) v_old.")
    adv_max: float = Field(5.0, gt=0, description="r = clip(A / adv_max / 2 + 0.5, 0, 1).")
    n_mc: int = Field(4, ge=1, le=MAX_N_MC, description="[inferred] training timesteps per sample and iteration.")
    timestep_sampling: Literal["stratified", "uniform", "logit_normal"] = "uniform"
    ema_decay_rate: float = Field(
        0.001, ge=0, description="[inferred] old-policy EMA decay = min(rate * max(0, it - flat), max)."
    )
    ema_decay_max: float = Field(0.5, ge=0, le=1)
    ema_decay_flat: float = Field(
        0.0, ge=0, description="Iterations the decay stays 0 (the old policy is the policy) before it ramps up."
    )
    LATER_OPTIONS: ClassVar[Mapping[str, Any]] = {"ema_decay_flat": 0.0}

    def check_rollout(self, rollout: RolloutConfig) -> None:
        _check_stratified(self.n_mc, self.timestep_sampling, rollout)
        _check_ode_rollout(f"algorithm.name={self.name}", rollout)

    def weight_copies(self) -> int:
        return 1  # the old policy, an EMA of the policy


AlgorithmConfig = Annotated[
    VGRPOConfig | NaiveELBOConfig | FlowGRPOConfig | MixGRPOConfig | DiffusionNFTConfig,
    Field(discriminator="name"),
]
