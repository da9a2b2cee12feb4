"""Training of the world pipeline's SD3 transformer (and CLIP encoders) by flow matching, with an EMA (the third part
of :mod:`vgrpo.world.pretrain`)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vgrpo.flow import interpolate, velocity_target
from vgrpo.images import images_to_tensor
from vgrpo.models.saving import write_pipeline
from vgrpo.models.sd3 import SD3Adapter, SD3Velocity
from vgrpo.policy import Conditioning
from vgrpo.training.optim import build_adamw, clip_gradients
from vgrpo.world.config import PretrainConfig
from vgrpo.world.data import world_batch
from vgrpo.world.prompts import allowed_pairs
from vgrpo.world.schedule import one_cycle

__all__ = [
    "Evaluate",
    "PretrainState",
    "TransformerTraining",
    "checkpoint_identity",
    "flow_matching_loss",
    "logit_normal_timesteps",
]

Evaluate = Callable[[SD3Adapter, nn.Module, int], dict[str, float]]
"""Metrics of the EMA model, from its adapter, its velocity model and the step."""


def logit_normal_timesteps(n: int, mean: float, std: float, generator: torch.Generator) -> Tensor:
    """SD3's training density over ``t`` in (0, 1): ``sigmoid(N(mean, std))``, shape ``(n,)``."""
    return torch.sigmoid(mean + std * torch.randn(n, generator=generator))


def flow_matching_loss(velocity: nn.Module, x0: Tensor, cond: Any, t: Tensor, eps: Tensor) -> Tensor:
    """Rectified-flow matching loss (SD3, Esser et al. 2024; V-GRPO Sec. 3):
    ``mean ||v_theta(x_t, t) - (eps - x0)||^2``."""
    v_hat = velocity(interpolate(x0, eps, t), t, cond)
    return (v_hat.float() - velocity_target(x0, eps)).pow(2).mean()


@dataclass
class PretrainState:
    """What a checkpoint holds besides the pipeline: the step, optimiser, EMA and RNG states."""

    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


def checkpoint_identity(config: PretrainConfig) -> dict[str, Any]:
    """What a checkpoint must share with the run to be resumed: every param but ``release_step``, which only says
    where the run stops."""
    return config.model_dump(mode="json", exclude={"release_step"})


class TransformerTraining:
    """The transformer phase in progress: the pipeline, the modules trained in its slots with their EMA, the
    optimiser and its schedule, the RNGs and the :class:`PretrainState`; restored from ``saved`` (a checkpoint's
    ``state.pt``) when given, the pipeline then being the checkpoint's (which holds the EMA)."""

    def __init__(
        self, config: PretrainConfig, pipe: Any, rng: np.random.Generator, generator: torch.Generator, saved: Any
    ) -> None:
        self.config, self.pipe, self.rng, self.generator = config, pipe, rng, generator
        self.allowed = allowed_pairs(config.held_out_pairs)
        pipe.vae.requires_grad_(False).eval()
        # The transformer, and the two CLIP encoders when they are trained too (random frozen encoders give the
        # transformer a code it must first learn to read).
        self.slots = (
            ("transformer", "text_encoder", "text_encoder_2") if config.train_text_encoders else ("transformer",)
        )
        if not config.train_text_encoders:
            pipe.text_encoder.requires_grad_(False).eval()
            pipe.text_encoder_2.requires_grad_(False).eval()
        self.trained = nn.ModuleList([getattr(pipe, name) for name in self.slots]).train()
        self.ema = copy.deepcopy(self.trained).eval().requires_grad_(False)
        self.opt = build_adamw(self.trained.parameters(), config)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: one_cycle(s, config.steps, config.warmup_steps)
        )
        self.state = PretrainState()
        if saved is not None:
            self.trained.load_state_dict(saved["trained"])
            self.opt.load_state_dict(saved["optimizer"])
            self.sched.load_state_dict(saved["scheduler"])
            rng.bit_generator.state = saved["numpy_rng"]
            generator.set_state(saved["torch_rng"])
            self.state = PretrainState(step=saved["step"], history=saved["history"])
        self.velocity = SD3Velocity(self.trained[0])
        self.images_adapter = SD3Adapter(pipe, max_sequence_length=0)  # VAE encoding (and cached prompts if frozen)

    def use(self, modules: nn.ModuleList) -> None:
        """Put ``modules`` (the trained ones or their EMA) in the pipeline's slots."""
        for name, module in zip(self.slots, modules, strict=True):
            setattr(self.pipe, name, module)

    def condition(self, prompts: list[str]) -> Any:
        """The conditioning on ``prompts``: by the encoders in training, or from the frozen ones' cache."""
        if not self.config.train_text_encoders:
            return self.images_adapter.encode_prompts(prompts)
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False, max_sequence_length=0
        )
        return Conditioning(prompt_embeds=embeds, pooled_prompt_embeds=pooled)

    def step(self) -> tuple[float, float]:
        """One flow-matching update on a fresh batch, then the EMA's; returns the loss and the gradient norm."""
        cfg, generator = self.config, self.generator
        prompts, images = world_batch(self.rng, cfg.batch_size, cfg.tags, self.allowed, cfg.model.resolution)
        with torch.no_grad():
            x0 = self.images_adapter.encode_images(images_to_tensor(images), generator=generator)
        t = logit_normal_timesteps(len(prompts), cfg.logit_normal_mean, cfg.logit_normal_std, generator)
        eps = torch.randn(x0.shape, generator=generator)
        loss = flow_matching_loss(self.velocity, x0, self.condition(prompts), t, eps)
        loss.backward()
        grad_norm = float(clip_gradients(self.trained.parameters(), cfg))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        # EMA warm-up (1 + n) / (10 + n): early weights are forgotten quickly in a run this short.
        _ema_update(self.ema, self.trained, min(cfg.ema_decay, (1 + self.state.step) / (10 + self.state.step)))
        self.state.step += 1
        return float(loss.item()), grad_norm

    def evaluate(self, evaluate: Evaluate) -> dict[str, float]:
        """``evaluate``'s metrics of the EMA model at the current step."""
        self.use(self.ema)
        try:  # a fresh adapter: its prompt cache must come from the EMA encoders
            return evaluate(SD3Adapter(self.pipe, max_sequence_length=0), SD3Velocity(self.ema[0]), self.state.step)
        finally:
            self.use(self.trained)

    def write_checkpoint(self, tmp: Path) -> None:
        """Write the checkpoint of the current step into ``tmp``: the EMA pipeline and ``state.pt``."""
        self.use(self.ema)
        write_pipeline(self.pipe, tmp / "pipeline")
        self.use(self.trained)
        state_dict = {
            "trained": self.trained.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "numpy_rng": self.rng.bit_generator.state,
            "torch_rng": self.generator.get_state(),
            "step": self.state.step,
            "history": self.state.history,
            "config": checkpoint_identity(self.config),
        }
        torch.save(state_dict, tmp / "state.pt")

    def write_final(self, tmp: Path) -> None:
        """Write the EMA pipeline and the evaluation history (``pretrain_history.json``) into ``tmp``."""
        self.use(self.ema)
        write_pipeline(self.pipe, tmp)
        (tmp / "pretrain_history.json").write_text(json.dumps(self.state.history, indent=1))


@torch.no_grad()
def _ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    for e, p in zip(ema.parameters(), model.parameters(), strict=True):
        e.lerp_(p.detach(), 1.0 - decay)
