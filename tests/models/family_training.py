"""The rollout -> score -> update check the model families' tests share: a few iterations on a tiny pipeline."""

from __future__ import annotations

from typing import Any

import torch

from vgrpo.models.pipeline import build_adapter
from vgrpo.models.registry import FAMILIES


def train_two_iterations(
    pipe: Any, family: str, algorithm_name: str, prompts: list[str]
) -> tuple[Any, Any, dict[str, torch.Tensor], list[Any]]:
    """Two iterations of ``algorithm_name`` on a LoRA of ``family``'s targets over a dynamic-shift pipeline's tiny
    rollout (2 prompts x 3 samples, 3 steps at 16 px), scored by the decoded images' brightness: the adapter, the
    policy, its weights before and the iterations' records."""
    from vgrpo.algorithms import build_algorithm
    from vgrpo.config import load_config
    from vgrpo.models import add_lora
    from vgrpo.training.iteration import build_optimizer, train_iteration

    algorithm_options: dict[str, Any] = {"name": algorithm_name}
    if algorithm_name == "vgrpo":
        algorithm_options["n_mc"] = 2
    config = load_config(
        overrides={
            "rollout": {
                "prompts_per_iteration": 2,
                "group_size": 3,
                "num_steps": 3,
                "shift": None,
                "dynamic_shift": True,
                "resolution": 16,
                "micro_batch_size": 6,
            },
            "optim": {"lr": 1e-2, "micro_batch_size": 6},
            "algorithm": algorithm_options,
            "lora": {"rank": 4, "alpha": 8, "target_modules": list(FAMILIES[family].lora_targets)},
        }
    )
    adapter, policy = build_adapter(pipe, resolution=config.rollout.resolution)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        add_lora(pipe.transformer, rank=4, alpha=8, target_modules=FAMILIES[family].lora_targets)
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    shift = adapter.sigma_shift(config.rollout.shift, dynamic=config.rollout.dynamic_shift, num_steps=3)
    config = config.model_copy(
        update={"rollout": config.rollout.model_copy(update={"shift": shift, "dynamic_shift": False})}
    )
    algorithm = build_algorithm(config, policy=policy, latent_shape=adapter.latent_shape)
    optimizer = build_optimizer(policy, config.optim)

    def brightness(samples: torch.Tensor, prompts: Any) -> dict[str, torch.Tensor]:  # scored on decoded images
        with torch.no_grad():
            return {"bright": adapter.decode(samples).mean(dim=(1, 2, 3))}

    cond, records = adapter.encode_prompts(prompts), []
    for it in range(2):
        records.append(
            train_iteration(
                policy=policy,
                algorithm=algorithm,
                optimizer=optimizer,
                prompts=prompts,
                cond=cond,
                config=config,
                reward_fn=brightness,
                latent_shape=adapter.latent_shape,
                generator=torch.Generator().manual_seed(it),
                iteration=it,
            )
        )
    return adapter, policy, before, records
