"""Build a tiny SD3 policy, an algorithm and a prepared batch for algorithm tests."""

from __future__ import annotations

from typing import Any

import torch

from vgrpo.algorithms import build_algorithm
from vgrpo.config import TrainConfig, load_config
from vgrpo.demo import tiny_iteration_inputs
from vgrpo.models import SD3Velocity, add_lora
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning, tiny_sd3_transformer

PROMPTS, GROUP = 2, 3


def make_config(algorithm: dict[str, Any], **sections: Any) -> TrainConfig:
    overrides: dict[str, Any] = {
        "rollout": {
            "prompts_per_iteration": PROMPTS,
            "group_size": GROUP,
            "num_steps": 6,
            "micro_batch_size": 4,
        },
        "optim": {"micro_batch_size": 4},
        "algorithm": algorithm,
        "lora": {"rank": 4, "alpha": 8},
    }
    for key, value in sections.items():
        overrides[key] = value if value is None else {**overrides.get(key, {}), **value}
    return load_config(overrides=overrides)


def make_policy(config: TrainConfig, *, perturb_lora: bool = True) -> torch.nn.Module:
    transformer = tiny_sd3_transformer()
    if config.lora is not None:
        add_lora(
            transformer,
            rank=config.lora.rank,
            alpha=config.lora.alpha,
            target_modules=config.lora.target_modules,
        )
        if perturb_lora:  # LoRA B starts at 0, which would zero the gradient of A: move off it
            g = torch.Generator().manual_seed(7)
            with torch.no_grad():
                for name, p in transformer.named_parameters():
                    if "lora_B" in name:
                        p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return SD3Velocity(transformer)


def prepared(config: TrainConfig, policy: torch.nn.Module, advantages: torch.Tensor | None = None):
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
    n = PROMPTS * GROUP
    cond = tiny_conditioning(PROMPTS).repeat_interleave(GROUP)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(n, *TINY_LATENT_SHAPE, generator=g)
    rollout = algorithm.rollout(policy, cond, noise, g, 0)
    if advantages is None:
        advantages = torch.tensor([1.2, -0.4, -0.8, 0.9, 0.1, -1.0])
    batch = algorithm.prepare(policy, rollout, cond, advantages, g)
    return algorithm, batch


def grads(policy: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in policy.parameters() if p.requires_grad and p.grad is not None]


def iteration_kwargs(config: TrainConfig, seed: int = 0) -> dict[str, Any]:
    """The keyword arguments of ``train_iteration``'s first iteration on a fresh tiny policy under ``config``: the
    tiny conditioning of ``PROMPTS`` prompts, the toy reward, a generator seeded ``seed``."""
    prompts = [f"p{i}" for i in range(PROMPTS)]
    return tiny_iteration_inputs(config, prompts, policy=make_policy(config), seed=seed) | {"iteration": 0}
