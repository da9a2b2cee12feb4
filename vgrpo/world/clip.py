"""Learned reward models of the embedded world: a tiny CLIP (the CLIPScore model) and a PickScore-style
preference model, trained here on freshly rendered world images.

* :func:`train_world_clip` trains a ``transformers.CLIPModel`` with CLIP's symmetric InfoNCE and learnable
  temperature (Radford et al. 2021, Fig. 3), plus attribute-swapped hard-negative captions in the image->text
  softmax (NegCLIP, Yuksekgonul et al. 2023, Sec. 4) so that it reads colours, counts and relations.
* :func:`train_world_preference` starts from that CLIP and fine-tunes it with PickScore's Bradley-Terry loss
  (Kirstain et al. 2023, Eq. 1): a softmax over ``logit_scale * cos(text, image)`` of the two images of a pair
  against the preferred one, here a clean render against a degraded one (:mod:`vgrpo.world.degrade`).

A saved model directory holds ``CLIPModel.save_pretrained`` (safetensors), the ``CLIPTokenizer`` (vocab.json +
merges.txt) and a ``CLIPImageProcessor`` at the world's native size, so that ``from_pretrained`` of the three
reproduces the training-time preprocessing exactly (:func:`pixel_values` equals the processor; tested).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

from vgrpo.atomic import atomic_dir
from vgrpo.models.config import EmbeddedModelConfig
from vgrpo.models.embedded import train_clip_tokenizer
from vgrpo.progress_bar import progress_bar
from vgrpo.training.optim import build_adamw, clip_gradients
from vgrpo.world.config import WorldAugmentConfig, WorldCLIPConfig
from vgrpo.world.degrade import augment, hard_negative
from vgrpo.world.prompts import allowed_pairs, sample_metadata, scene_for
from vgrpo.world.render import render
from vgrpo.world.schedule import one_cycle

__all__ = [
    "TrainedRewardModel",
    "build_processor",
    "build_world_clip",
    "caption_corpus",
    "clip_contrastive_loss",
    "embed_images",
    "embed_texts",
    "final_metrics",
    "fit",
    "pixel_values",
    "render_batch",
    "save_reward_model",
    "tokenize",
    "train_world_clip",
]

MAX_LOGIT_SCALE = math.log(100.0)
"""CLIP clips the learned temperature so that logits are scaled by at most 100 (Radford et al. 2021, Sec. 2.5)."""


def caption_corpus(seed: int, n: int, tags: tuple[str, ...]) -> list[str]:
    """``n`` world captions of ``tags`` (all colour-shape pairs) and a hard negative of each: the tokenizer's
    training text, so that every caption and every negative tokenizes into known words."""
    rng, every = np.random.default_rng(seed), allowed_pairs(())
    captions = [str(sample_metadata(rng, tags[i % len(tags)], every)["prompt"]) for i in range(n)]
    return captions + [hard_negative(c, rng)[1] for c in captions]


def build_processor(image_size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> Any:
    """A ``CLIPImageProcessor`` that leaves ``image_size`` inputs at their size (resize and centre crop to the
    same side are the identity) and normalises ``(x / 255 - mean) / std``."""

    return CLIPImageProcessor(
        do_resize=True,
        size={"shortest_edge": image_size},
        do_center_crop=True,
        crop_size={"height": image_size, "width": image_size},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(mean),
        image_std=list(std),
        do_convert_rgb=True,
    )


def pixel_values(images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """uint8 ``(N, S, S, 3)`` -> float ``(N, 3, S, S)``, identical to :func:`build_processor`'s output at size ``S``."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() * (1 / 255)
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def build_world_clip(config: WorldCLIPConfig, tokenizer: Any) -> nn.Module:
    """A randomly initialised ``CLIPModel`` sized by ``config`` whose special ids match ``tokenizer`` (the text
    embedding is read at the first EOS)."""

    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": config.text_hidden_size,
        "intermediate_size": 4 * config.text_hidden_size,
        "num_hidden_layers": config.text_layers,
        "num_attention_heads": config.text_heads,
        "max_position_embeddings": config.max_text_tokens,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {
        "hidden_size": config.vision_hidden_size,
        "intermediate_size": 4 * config.vision_hidden_size,
        "num_hidden_layers": config.vision_layers,
        "num_attention_heads": config.vision_heads,
        "image_size": config.image_size,
        "patch_size": config.patch_size,
    }
    torch.manual_seed(config.seed)
    clip_config = CLIPConfig(
        text_config=text,
        vision_config=vision,
        projection_dim=config.projection_dim,
        logit_scale_init_value=config.logit_scale_init,
    )
    model: nn.Module = CLIPModel(clip_config)
    return model


def tokenize(tokenizer: Any, captions: list[str]) -> tuple[Tensor, Tensor]:
    """``(input_ids, attention_mask)``, each ``(N, max_text_tokens)``; a caption that would be truncated is an
    error, not a silently shortened prompt."""
    enc = tokenizer(captions, padding="max_length", truncation=False, return_tensors="np")
    ids = np.asarray(enc["input_ids"])
    if ids.shape[1] > tokenizer.model_max_length:
        lengths = np.asarray(enc["attention_mask"]).sum(1)
        worst = captions[int(lengths.argmax())]
        raise ValueError(f"caption {worst!r} needs {lengths.max()} tokens > {tokenizer.model_max_length}")
    return torch.from_numpy(ids), torch.from_numpy(np.asarray(enc["attention_mask"]))


def embed_texts(model: Any, tokenizer: Any, captions: list[str]) -> Tensor:
    """Unit-norm projected text embeddings ``(N, D)``."""
    ids, mask = tokenize(tokenizer, captions)
    out = model.get_text_features(input_ids=ids, attention_mask=mask).pooler_output
    return nn.functional.normalize(out.float(), dim=-1)


def embed_images(model: Any, pixels: Tensor) -> Tensor:
    """Unit-norm projected image embeddings ``(N, D)`` of processed ``pixels`` ``(N, 3, S, S)``."""
    return nn.functional.normalize(model.get_image_features(pixel_values=pixels).pooler_output.float(), dim=-1)


def clip_contrastive_loss(
    *, image_embeds: Tensor, text_embeds: Tensor, logit_scale: Tensor, same_text: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """CLIP's symmetric InfoNCE (Radford et al. 2021, Fig. 3) with extra negative texts (NegCLIP, Sec. 4).

    Args:
        image_embeds: ``(B, D)`` unit-norm; image ``b`` is described by text ``b``.
        text_embeds: ``(T, D)`` unit-norm, ``T >= B``: the ``B`` captions, then negatives (image->text only).
        logit_scale: scalar, the log of the temperature's inverse.
        same_text: ``(B, T)`` bool, true where text ``j`` equals caption ``b`` (``j != b`` of those are masked:
            a repeated caption is not a negative).

    Returns:
        The loss and detached diagnostics: both directions' losses, ``i2t_acc``, ``logit_scale`` (exp).
    """
    b = image_embeds.shape[0]
    logits = logit_scale.exp() * image_embeds @ text_embeds.T  # (B, T)
    eye = torch.zeros_like(same_text)
    eye[:, :b] = torch.eye(b, dtype=torch.bool)
    logits = logits.masked_fill(same_text & ~eye, float("-inf"))
    labels = torch.arange(b)
    loss_i2t = nn.functional.cross_entropy(logits, labels)
    loss_t2i = nn.functional.cross_entropy(logits[:, :b].T, labels)
    metrics = {
        "loss_i2t": float(loss_i2t.detach()),
        "loss_t2i": float(loss_t2i.detach()),
        "i2t_acc": float((logits.detach().argmax(1) == labels).float().mean()),
        "logit_scale": float(logit_scale.detach().exp()),
    }
    return (loss_i2t + loss_t2i) / 2, metrics


def render_batch(
    rng: np.random.Generator, n: int, tags: tuple[str, ...], allowed: Any, size: int, aug: WorldAugmentConfig | None
) -> tuple[list[str], np.ndarray]:
    """``n`` fresh captions (tags uniform) and their renders ``(n, size, size, 3)`` uint8, augmented if ``aug``."""

    captions, images = [], []
    for _ in range(n):
        md = sample_metadata(rng, tags[int(rng.integers(len(tags)))], allowed)
        img = render(scene_for(md, rng, allowed), size)
        captions.append(str(md["prompt"]))
        images.append(augment(img, rng, **aug.model_dump()) if aug is not None else img)
    return captions, np.stack(images)


@dataclass
class TrainedRewardModel:
    """A trained world reward model and what its directory needs.

    Attributes:
        model: the ``CLIPModel``, in eval mode.
        tokenizer: its ``CLIPTokenizer``.
        processor: its ``CLIPImageProcessor``.
        history: per-step diagnostics (``step``, ``loss``, ``lr``, ``grad_norm`` and the loss's own).
    """

    model: Any
    tokenizer: Any
    processor: Any
    history: list[dict[str, float]]


def train_world_clip(config: WorldCLIPConfig, *, log: Callable[[str], None] | None = None) -> TrainedRewardModel:
    """Train the world CLIP on fresh augmented renders of ``config.tags`` prompts (held-out pairs excluded)."""

    rng = np.random.default_rng(config.seed)
    tok_config = EmbeddedModelConfig(vocab_size=config.vocab_size, max_text_tokens=config.max_text_tokens)
    tokenizer = train_clip_tokenizer(caption_corpus(config.seed + 1, 4000, config.tags), tok_config)
    processor = build_processor(config.image_size, config.image_mean, config.image_std)
    model = build_world_clip(config, tokenizer)
    torch.manual_seed(config.seed)
    allowed = allowed_pairs(config.held_out_pairs)
    history = fit(
        model,
        config.steps,
        config,
        lambda: _clip_step_loss(model, tokenizer, config, rng, allowed),
        "world-clip",
        log,
    )
    return TrainedRewardModel(model=model.eval(), tokenizer=tokenizer, processor=processor, history=history)


def _clip_step_loss(
    model: Any, tokenizer: Any, config: WorldCLIPConfig, rng: np.random.Generator, allowed: Any
) -> tuple[Tensor, dict[str, float]]:
    captions, images = render_batch(rng, config.batch_size, config.tags, allowed, config.image_size, config.augment)
    negatives = [hard_negative(c, rng)[1] for c in captions for _ in range(config.hard_negatives)]
    texts = captions + negatives
    same = torch.from_numpy(np.asarray(captions)[:, None] == np.asarray(texts)[None, :])
    return clip_contrastive_loss(
        image_embeds=embed_images(model, pixel_values(images, config.image_mean, config.image_std)),
        text_embeds=embed_texts(model, tokenizer, texts),
        logit_scale=model.logit_scale,
        same_text=same,
    )


def fit(
    model: Any,
    steps: int,
    opt_config: Any,
    step_loss: Callable[[], tuple[Tensor, dict[str, float]]],
    desc: str,
    log: Callable[[str], None] | None,
) -> list[dict[str, float]]:
    """AdamW with linear warm-up and cosine decay (no decay on gains, biases, embeddings' scale), gradient
    clipping and CLIP's clip of ``logit_scale``; returns per-step diagnostics (``log`` gets 100-step means)."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    groups: list[dict[str, Any]] = [{"params": decay}, {"params": rest, "weight_decay": 0.0}]
    opt = build_adamw(groups, opt_config)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: one_cycle(s, steps, opt_config.warmup_steps))
    model.train()
    history: list[dict[str, float]] = []
    with progress_bar(steps, desc) as bar:
        for step in range(1, steps + 1):
            loss, metrics = step_loss()
            loss.backward()
            metrics["grad_norm"] = float(clip_gradients(model.parameters(), opt_config))
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0.0, MAX_LOGIT_SCALE)
            history.append(
                {"step": float(step), "loss": float(loss.detach()), "lr": float(sched.get_last_lr()[0]), **metrics}
            )
            bar.set_postfix(loss=f"{np.mean([h['loss'] for h in history[-100:]]):.3f}", refresh=False)
            bar.update()
            if log is not None and (step % 100 == 0 or step == steps):
                window = history[-100:]
                log(f"step={step} " + " ".join(f"{k}={np.mean([h[k] for h in window]):.4g}" for k in metrics))
    model.eval()
    return history


def final_metrics(history: list[dict[str, float]], last: int = 100) -> dict[str, float]:
    """Means of the diagnostics over the ``last`` steps of ``history`` (``step`` is the final step)."""
    window = history[-last:]
    return {k: float(np.mean([h[k] for h in window])) if k != "step" else window[-1][k] for k in window[0]}


def save_reward_model(out_dir: str | Path, trained: TrainedRewardModel, info: dict[str, Any]) -> Path:
    """Write model (safetensors), tokenizer, processor and ``world_reward_model.json`` (``info``) atomically."""

    def write(tmp: Path) -> None:
        trained.model.save_pretrained(tmp)
        trained.tokenizer.save_pretrained(tmp)
        _write_bpe_files(trained.tokenizer, tmp)
        trained.processor.save_pretrained(tmp)
        (tmp / "world_reward_model.json").write_text(json.dumps(info, indent=1, sort_keys=True))

    final = Path(out_dir)
    atomic_dir(final, write)
    return final


def _write_bpe_files(tokenizer: Any, folder: Path) -> None:
    """``vocab.json`` and ``merges.txt`` beside ``tokenizer.json``: transformers 5 saves only the latter, and
    the slow-format pair is what other CLIP loaders read (the two load to the same ids; tested)."""
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]
    (folder / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
