"""PickScore-style preference model of the embedded world (Kirstain et al. 2023): the world CLIP fine-tuned with
a Bradley-Terry loss on (clean render, degraded render) pairs of :mod:`vgrpo.world.degrade`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizer

from vgrpo.world.clip import TrainedRewardModel, embed_images, embed_texts, fit, pixel_values
from vgrpo.world.config import WorldPreferenceConfig
from vgrpo.world.degrade import augment, sample_pair
from vgrpo.world.prompts import Pair, allowed_pairs

__all__ = [
    "PreferencePairs",
    "bradley_terry_loss",
    "degradation_strength",
    "evaluation_pairs",
    "preference_pairs",
    "train_world_preference",
]

PreferencePairs = tuple[list[str], np.ndarray, np.ndarray, list[str]]
"""``(captions, preferred (N, S, S, 3) uint8, rejected (N, S, S, 3) uint8, degradation kinds)``."""


def bradley_terry_loss(
    *, text_embeds: Tensor, preferred_embeds: Tensor, rejected_embeds: Tensor, logit_scale: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """PickScore, Eq. 1 (Kirstain et al. 2023, Sec. 4): cross-entropy of the softmax over the pair's
    ``exp(logit_scale) * cos(text, image)`` against the preferred image (no ties here).

    Args:
        text_embeds, preferred_embeds, rejected_embeds: ``(B, D)`` unit-norm.
        logit_scale: scalar, the log of the temperature's inverse.

    Returns:
        The loss and detached ``pair_acc`` (preferred scored higher), ``margin`` (mean logit gap),
        ``logit_scale`` (exp).
    """
    scale = logit_scale.exp()
    logits = scale * torch.stack(
        [(text_embeds * preferred_embeds).sum(-1), (text_embeds * rejected_embeds).sum(-1)], dim=1
    )  # (B, 2)
    loss = nn.functional.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))
    gap = (logits[:, 0] - logits[:, 1]).detach()
    metrics = {
        "pair_acc": float((gap > 0).float().mean()),
        "margin": float(gap.mean()),
        "logit_scale": float(scale.detach()),
    }
    return loss, metrics


def degradation_strength(config: WorldPreferenceConfig) -> dict[str, tuple[float, float]]:
    """The ``strength`` ranges of :func:`vgrpo.world.degrade.degrade` from ``config``."""
    return {
        "blur": config.blur_sigma,
        "noise": config.noise_std,
        "color_shift": config.color_shift,
        "clutter": (float(config.clutter_objects[0]), float(config.clutter_objects[1])),
    }


def preference_pairs(
    rng: np.random.Generator,
    kinds: Sequence[str],
    config: WorldPreferenceConfig,
    allowed: list[Pair],
    size: int,
    *,
    augmented: bool,
) -> PreferencePairs:
    """One pair per entry of ``kinds``; with ``augmented`` both images get independent mild augmentations (so
    that the mild perturbations of generated images are not what separates preferred from rejected)."""
    captions, preferred, rejected = [], [], []
    strength = degradation_strength(config)
    for kind in kinds:
        caption, good, bad = sample_pair(rng, kind, config.tags, allowed, size=size, strength=strength)
        if augmented:
            good = augment(good, rng, **config.augment.model_dump())
            bad = augment(bad, rng, **config.augment.model_dump())
        captions.append(caption)
        preferred.append(good)
        rejected.append(bad)
    return captions, np.stack(preferred), np.stack(rejected), list(kinds)


def train_world_preference(
    config: WorldPreferenceConfig, clip_dir: str | Path, *, log: Callable[[str], None] | None = None
) -> TrainedRewardModel:
    """Fine-tune the world CLIP in ``clip_dir`` (model, tokenizer, processor) with :func:`bradley_terry_loss`
    on fresh pairs, degradation kinds drawn uniformly from ``config.degradations``."""

    model = CLIPModel.from_pretrained(clip_dir)
    tokenizer = CLIPTokenizer.from_pretrained(clip_dir)
    processor = CLIPImageProcessor.from_pretrained(clip_dir)
    mean, std = tuple(processor.image_mean), tuple(processor.image_std)
    size = int(processor.crop_size["height"])  # the model's image_size (build_processor)
    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)
    allowed = allowed_pairs(config.held_out_pairs)

    def step_loss() -> tuple[Tensor, dict[str, float]]:
        kinds = [config.degradations[int(i)] for i in rng.integers(len(config.degradations), size=config.batch_size)]
        captions, good, bad, _ = preference_pairs(rng, kinds, config, allowed, size, augmented=True)
        images = embed_images(model, pixel_values(np.concatenate([good, bad]), mean, std))
        return bradley_terry_loss(
            text_embeds=embed_texts(model, tokenizer, captions),
            preferred_embeds=images[: len(captions)],
            rejected_embeds=images[len(captions) :],
            logit_scale=model.logit_scale,
        )

    history = fit(model, config.steps, config, step_loss, "world-pickscore", log)
    return TrainedRewardModel(model=model.eval(), tokenizer=tokenizer, processor=processor, history=history)


def evaluation_pairs(config: WorldPreferenceConfig, size: int) -> PreferencePairs:
    """``config.eval_pairs_per_kind`` held-out pairs per degradation kind: seeded by ``config.eval_seed``, over
    all colour-shape pairs (held-out ones included), without augmentation."""
    kinds = [k for k in config.degradations for _ in range(config.eval_pairs_per_kind)]
    rng = np.random.default_rng(config.eval_seed)
    return preference_pairs(rng, kinds, config, allowed_pairs(()), size, augmented=False)
