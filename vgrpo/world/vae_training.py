"""Training of the world pipeline's VAE on fresh renders (the second part of :mod:`vgrpo.world.pretrain`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from vgrpo.images import images_to_tensor
from vgrpo.progress_bar import progress_bar
from vgrpo.training.optim import build_adamw, clip_gradients
from vgrpo.world.config import PretrainConfig
from vgrpo.world.data import world_batch
from vgrpo.world.prompts import allowed_pairs
from vgrpo.world.scene import TEXT_BAND
from vgrpo.world.schedule import one_cycle

__all__ = ["finetune_decoder", "set_latent_normalisation", "text_band_weights", "train_vae", "vae_loss"]


def vae_loss(
    vae: Any, x: Tensor, kl_weight: float, generator: torch.Generator, pixel_weight: Tensor | None = None
) -> Tensor:
    """L1 + L2 reconstruction of a posterior sample (each pixel weighted by ``pixel_weight``, ``(H, W)``, mean 1
    over the image when given) plus ``kl_weight`` x KL to N(0, I)."""
    dist = vae.encode(x).latent_dist
    recon = vae.decode(dist.sample(generator=generator)).sample
    error = (recon - x).abs() + (recon - x).pow(2)
    if pixel_weight is not None:
        error = error * pixel_weight
    return error.mean() + kl_weight * dist.kl().mean() / x[0].numel()


def text_band_weights(resolution: int, weight: float) -> Tensor:
    """Per-pixel loss weights ``(H, W)``: ``weight`` on the text band's rows (:data:`vgrpo.world.scene.TEXT_BAND`),
    1 elsewhere, scaled to mean 1."""
    rows = torch.ones(resolution)
    rows[resolution - round(TEXT_BAND * resolution) :] = weight
    grid = rows[:, None].expand(resolution, resolution)
    return grid / grid.mean()


def _fit(
    vae: Any,
    params: list[Tensor],
    opt: torch.optim.Optimizer,
    steps: int,
    desc: str,
    config: PretrainConfig,
    rng: np.random.Generator,
    generator: torch.Generator,
    *,
    kl_weight: float,
    pixel_weight: Tensor | None = None,
) -> float:
    """``steps`` updates of ``params`` by ``opt`` on :func:`vae_loss` of fresh renders, under a one-cycle schedule;
    returns the final loss."""
    cfg, allowed = config.vae, allowed_pairs(config.held_out_pairs)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: one_cycle(s, steps, warmup))
    loss = torch.tensor(float("nan"))
    with progress_bar(steps, desc) as bar:
        for _ in range(steps):
            _, images = world_batch(rng, cfg.batch_size, config.tags, allowed, config.model.resolution)
            loss = vae_loss(vae, images_to_tensor(images), kl_weight, generator, pixel_weight)
            loss.backward()
            clip_gradients(params, cfg)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            bar.update()
    return float(loss.item())


def train_vae(vae: Any, config: PretrainConfig, rng: np.random.Generator, generator: torch.Generator) -> float:
    """Train ``vae`` in place on fresh renders; returns the final loss."""
    params = list(vae.parameters())
    opt = build_adamw(params, config.vae)
    vae.train()
    loss = _fit(vae, params, opt, config.vae.steps, "vae", config, rng, generator, kl_weight=config.vae.kl_weight)
    vae.eval()
    return loss


def finetune_decoder(vae: Any, config: PretrainConfig, rng: np.random.Generator, generator: torch.Generator) -> float:
    """Train ``vae``'s decoder alone (the encoder, and so the latents, frozen) for ``config.vae.decoder_steps`` on
    fresh renders, the text band's pixels weighted ``text_band_weight``: the glyphs and object edges the rewards
    read are what a decoder trained on the whole image blurs first. Returns the final loss."""
    cfg = config.vae
    # The decoder and the 1x1 convolution before it (None when the VAE is built without quant convs).
    decoder = [p for m in (vae.decoder, vae.post_quant_conv) if m is not None for p in m.parameters()]
    vae.requires_grad_(False)
    for p in decoder:
        p.requires_grad_(True)
    opt = build_adamw([{"params": decoder, "lr": cfg.decoder_lr}], cfg)
    weights = text_band_weights(config.model.resolution, cfg.text_band_weight)
    vae.decoder.train()
    loss = _fit(
        vae, decoder, opt, cfg.decoder_steps, "vae decoder", config, rng, generator, kl_weight=0.0, pixel_weight=weights
    )
    vae.requires_grad_(True).eval()
    return loss


@torch.no_grad()
def set_latent_normalisation(vae: Any, images: Tensor) -> tuple[float, float]:
    """Set the VAE's ``shift_factor`` (latent mean) and ``scaling_factor`` (1 / latent std) from ``images``."""
    z = vae.encode(images).latent_dist.mode()
    shift, scale = float(z.mean()), float(1.0 / z.std())
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    return shift, scale
