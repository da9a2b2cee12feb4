"""One training iteration of V-GRPO and of each baseline on a tiny random SD3 transformer.

    python -m vgrpo.demo [--iterations N] [--params FILE ...]

A toy reward (latent brightness and contrast) stands in for a real one; the point is to see the
whole step run and what it reports.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.algorithms import ALGORITHMS, build_algorithm
from vgrpo.config import TrainConfig, load_config
from vgrpo.models import SD3Velocity, add_lora
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning, tiny_sd3_transformer
from vgrpo.training.iteration import train_iteration
from vgrpo.training.optim import build_optimizer

SHOWN = (
    "reward/total_mean",
    "advantage/zero_variance_frac",
    "surrogate/cv",
    "surrogate/cv_within_group",
    "train/ratio_mean",
    "train/clip_frac",
    "train/kl",
    "train/grad_norm",
    "time/rollout_s",
    "time/reward_s",
    "time/update_s",
)


def toy_reward(samples: Tensor, prompts: Sequence[str]) -> dict[str, Tensor]:
    return {"brightness": samples.mean(dim=(1, 2, 3)), "contrast": samples.std(dim=(1, 2, 3))}


def tiny_iteration_inputs(
    config: TrainConfig,
    prompts: Sequence[str],
    *,
    policy: nn.Module | None = None,
    num_layers: int | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """The keyword arguments of :func:`vgrpo.training.iteration.train_iteration` (all but ``iteration``) for
    ``config`` on ``policy`` (default: a tiny random SD3 transformer of ``num_layers`` layers with
    ``config.lora``), the toy reward and ``prompts``' tiny conditioning; the noise generator seeded by ``seed``
    (default ``config.seed``)."""
    if policy is None:
        transformer = tiny_sd3_transformer() if num_layers is None else tiny_sd3_transformer(num_layers=num_layers)
        if config.lora is None:
            raise ValueError("lora: the tiny demo trains a LoRA; set lora.rank and lora.alpha")
        lora = config.lora
        add_lora(transformer, rank=lora.rank, alpha=lora.alpha, target_modules=lora.target_modules)
        policy = SD3Velocity(transformer)
    return {
        "policy": policy,
        "algorithm": build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE),
        "optimizer": build_optimizer(policy, config.optim),
        "reward_fn": toy_reward,
        "prompts": list(prompts),
        "cond": tiny_conditioning(len(prompts)),
        "config": config,
        "latent_shape": TINY_LATENT_SHAPE,
        "generator": torch.Generator().manual_seed(config.seed if seed is None else seed),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--params", nargs="*", default=[], help="params files applied before the algorithm")
    args = parser.parse_args(argv)
    torch.set_flush_denormal(True)
    prompts = ["a red circle", "two blue squares"]
    for name in ALGORITHMS:
        overrides: dict[str, object] = {
            "rollout": {"prompts_per_iteration": len(prompts), "group_size": 4, "num_steps": 8},
            "algorithm": {
                "name": name,
                **({"window_size": 2, "shift_interval": 1} if name == "mixgrpo" else {}),
            },
            "lora": {"rank": 4, "alpha": 8},
        }
        config = load_config(args.params, overrides)
        inputs = tiny_iteration_inputs(config, prompts)
        for it in range(args.iterations):
            record = train_iteration(**inputs, iteration=it)
            shown = ", ".join(f"{k}={record.metrics[k]:.4g}" for k in SHOWN if k in record.metrics)
            print(f"{name:>14} it {it}: {shown}")


if __name__ == "__main__":
    main()
