"""Typed configs of the embedded world's training jobs: base pretraining (``params/embedded/pretrain.yaml``) and
the world's learned reward models (``params/embedded/rewards.yaml``). Every value is spelled out in those files
so that DVC's params tracking sees all of them, but ``pretrain.vae``'s weight decay and gradient clip, which keep
the defaults of :mod:`vgrpo.training.optim` (a dependency of the pretraining stage).

Each job's optimiser is the shared :class:`vgrpo.training.optim.AdamWConfig`, whose fields (``lr``, ``weight_decay``,
``max_grad_norm``) each job config inherits at the top of its section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vgrpo.config_base import FrozenConfig
from vgrpo.models.config import EmbeddedModelConfig
from vgrpo.training.optim import AdamWConfig, LearningRate, WeightDecay

__all__ = [
    "PretrainConfig",
    "VAETrainConfig",
    "WorldAugmentConfig",
    "WorldCLIPConfig",
    "WorldPreferenceConfig",
    "WorldRewardModelsConfig",
]


class VAETrainConfig(AdamWConfig):
    """Stage 1 of pretraining: the autoencoder, on rendered world images (AdamW, warm-up over the first 5% of the
    steps, then cosine decay)."""

    lr: LearningRate = 4e-3
    steps: int = Field(800, ge=1)
    batch_size: int = Field(32, ge=1)
    kl_weight: float = Field(1e-6, ge=0, description="Weight of the KL to N(0, I) (SD-VAE scale).")
    decoder_steps: int = Field(
        0, ge=0, le=100_000, description="Then the decoder alone, the encoder frozen (0: no second phase)."
    )
    decoder_lr: LearningRate = Field(1e-3, description="Peak learning rate of the decoder phase.")
    text_band_weight: float = Field(
        1.0, ge=1, le=100, description="Weight of the text band's pixels in the decoder phase's loss."
    )


class PretrainConfig(AdamWConfig):
    """Pretraining of the embedded base pipeline on freshly rendered world pairs; the transformer's optimiser is
    AdamW (the inherited fields) with warm-up and cosine decay."""

    seed: int = 0
    model: EmbeddedModelConfig = EmbeddedModelConfig()
    vae: VAETrainConfig = VAETrainConfig()
    steps: int = Field(1900, ge=1, description="Transformer optimizer steps.")
    batch_size: int = Field(32, ge=1)
    warmup_steps: int = Field(200, ge=0)
    ema_decay: float = Field(
        0.99, ge=0, lt=1, description="EMA of the transformer weights that is saved (0.999 lags ~1000 steps)."
    )
    train_text_encoders: bool = Field(
        True, description="Train the CLIP encoders with the transformer (False: random and frozen)."
    )
    logit_normal_mean: float = Field(0.0, description="SD3 timestep density: t = sigmoid(N(mean, std)).")
    logit_normal_std: float = Field(1.0, gt=0)
    tags: tuple[str, ...] = Field(
        ("single_object", "two_object", "counting", "colors", "position", "color_attr", "ocr", "preference"),
        min_length=1,
        description="World prompt tags of the pretraining mix, drawn uniformly.",
    )
    held_out_pairs: tuple[tuple[str, str], ...] = (("red", "triangle"), ("blue", "circle"))
    split_tags: tuple[str, ...] = Field(
        ("single_object", "two_object", "counting", "colors", "position", "color_attr", "ocr"),
        min_length=1,
        description="Tags of the written train/test splits (the RL and evaluation prompts), cycled.",
    )
    train_prompts: int = Field(20000, ge=1, description="Size of the written train split.")
    test_prompts: int = Field(480, ge=1, description="Size of the written test split (GenEval tags + ocr).")
    probe_prompts: int = Field(
        120, ge=0, description="Size of the written probe split: colour prompts naming a held-out pair."
    )
    release_step: int | None = Field(
        None,
        ge=1,
        description="Stop at this step of the `steps`-long schedule and release its EMA as the base (None: steps).",
    )
    eval_every: int = Field(500, ge=1, description="Evaluate (and keep that step's checkpoint) every this many steps.")
    eval_prompts: int = Field(48, ge=1, description="Prompts of the periodic evaluation (x eval_group).")
    eval_group: int = Field(4, ge=1)
    sample_steps: int = Field(20, ge=1, description="Euler steps when sampling for evaluation.")
    checkpoint_every: int = Field(200, ge=1)

    @model_validator(mode="after")
    def _check_release(self) -> PretrainConfig:
        if self.release_step is not None and self.release_step > self.steps:
            raise ValueError(f"release_step={self.release_step} is past the schedule's steps={self.steps}")
        return self


class WorldAugmentConfig(FrozenConfig):
    """Mild perturbations put on every training render so that scores transfer to generated images
    (:func:`vgrpo.world.degrade.augment`); kept weaker than the preference degradations."""

    shift_px: int = Field(1, ge=0, description="Largest translation in pixels.")
    color_jitter: float = Field(0.06, ge=0, lt=1, description="Per-channel gain drawn from 1 +- this.")
    blur_prob: float = Field(0.5, ge=0, le=1)
    blur_sigma_max: float = Field(0.7, ge=0.3, description="Blur sigma drawn from [0.3, this] when blurred.")
    noise_std_max: float = Field(6.0, ge=0, description="Gaussian noise std (0-255 units) drawn from [0, this].")


class WorldCLIPConfig(AdamWConfig):
    """A tiny ``transformers.CLIPModel`` trained contrastively on world image-caption pairs (the CLIPScore
    reward of the embedded world), by AdamW (the inherited fields) with warm-up and cosine decay."""

    seed: int = 0
    image_size: int = Field(32, ge=8, description="The world's native resolution; no resizing.")
    patch_size: int = Field(4, ge=1, description="8 x 8 = 64 image tokens at 32 px.")
    vision_hidden_size: int = Field(96, ge=8)
    vision_layers: int = Field(3, ge=1)
    vision_heads: int = Field(4, ge=1)
    text_hidden_size: int = Field(64, ge=8)
    text_layers: int = Field(2, ge=1)
    text_heads: int = Field(4, ge=1)
    projection_dim: int = Field(64, ge=4)
    vocab_size: int = Field(1000, ge=300, description="BPE cap (the world's captions need about 430).")
    max_text_tokens: int = Field(24, ge=4, description="Context length; a longer caption is an error.")
    image_mean: tuple[float, float, float] = Field((0.5, 0.5, 0.5), description="Processor normalisation.")
    image_std: tuple[float, float, float] = Field((0.5, 0.5, 0.5))
    logit_scale_init: float = Field(2.6592, description="log(1 / 0.07), CLIP's initial temperature.")
    steps: int = Field(3000, ge=1)
    batch_size: int = Field(128, ge=2)
    warmup_steps: int = Field(150, ge=0)
    weight_decay: WeightDecay = 0.1
    hard_negatives: int = Field(
        1, ge=0, description="Attribute-swapped captions per image added to the image->text softmax (NegCLIP)."
    )
    tags: tuple[str, ...] = Field(
        ("single_object", "two_object", "counting", "colors", "position", "color_attr", "ocr", "preference"),
        min_length=1,
        description="World prompt tags of the training captions, drawn uniformly.",
    )
    held_out_pairs: tuple[tuple[str, str], ...] = (("red", "triangle"), ("blue", "circle"))
    augment: WorldAugmentConfig = WorldAugmentConfig()
    eval_seed: int = Field(1234, description="Seed of the held-out negatives and the extra preference prompts.")
    eval_preference_prompts: int = Field(
        96, ge=0, description="Preference captions added to the test split's prompts for evaluation."
    )
    eval_negatives: int = Field(4, ge=1, description="Hard-negative captions per image in caption retrieval.")
    eval_batch: int = Field(64, ge=2, description="Batch of the in-batch image->text top-1 accuracy.")

    @model_validator(mode="after")
    def _check_shapes(self) -> WorldCLIPConfig:
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        if self.vision_hidden_size % self.vision_heads:
            raise ValueError(f"vision_heads={self.vision_heads} must divide vision_hidden_size")
        if self.text_hidden_size % self.text_heads:
            raise ValueError(f"text_heads={self.text_heads} must divide text_hidden_size")
        return self


class WorldPreferenceConfig(AdamWConfig):
    """A PickScore-style preference model: the world CLIP fine-tuned with a Bradley-Terry loss on (clean render,
    degraded render) pairs (Kirstain et al. 2023, Sec. 4), by AdamW (the inherited fields) with warm-up and cosine
    decay."""

    seed: int = 0
    steps: int = Field(1200, ge=1)
    batch_size: int = Field(64, ge=1, description="Pairs per step.")
    lr: LearningRate = 3e-4
    warmup_steps: int = Field(60, ge=0)
    weight_decay: WeightDecay = 0.1
    degradations: tuple[
        Literal["blur", "noise", "color_shift", "clutter", "wrong_color", "wrong_shape", "wrong_position"], ...
    ] = Field(
        ("blur", "noise", "color_shift", "clutter", "wrong_color", "wrong_shape", "wrong_position"),
        min_length=1,
        description="Kinds of rejected image, drawn uniformly per pair.",
    )
    tags: tuple[str, ...] = Field(
        ("single_object", "two_object", "counting", "colors", "position", "color_attr", "preference"),
        min_length=1,
        description="World prompt tags of the pairs' captions.",
    )
    held_out_pairs: tuple[tuple[str, str], ...] = (("red", "triangle"), ("blue", "circle"))
    blur_sigma: tuple[float, float] = Field((1.0, 1.6), description="Degradation ranges (low, high).")
    noise_std: tuple[float, float] = Field((20.0, 40.0), description="0-255 units.")
    color_shift: tuple[float, float] = Field((40.0, 80.0), description="Per-channel offset, 0-255 units.")
    clutter_objects: tuple[int, int] = Field((1, 2), description="Extra distractor shapes.")
    augment: WorldAugmentConfig = WorldAugmentConfig()
    eval_seed: int = 4321
    eval_pairs_per_kind: int = Field(200, ge=1)

    @model_validator(mode="after")
    def _check_ranges(self) -> WorldPreferenceConfig:
        for key in ("blur_sigma", "noise_std", "color_shift", "clutter_objects"):
            lo, hi = getattr(self, key)
            if not 0 <= lo <= hi:
                raise ValueError(f"{key}=({lo}, {hi}) must satisfy 0 <= low <= high")
        if self.clutter_objects[0] < 1:
            raise ValueError("clutter_objects low must be >= 1 (a clutter pair must differ)")
        return self


class WorldRewardModelsConfig(FrozenConfig):
    """The whole of ``params/embedded/rewards.yaml``: one section per learned reward model."""

    world_clip: WorldCLIPConfig = WorldCLIPConfig()
    world_pickscore: WorldPreferenceConfig = WorldPreferenceConfig()
