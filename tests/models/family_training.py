"""The rollout -> score -> update check the model families' tests share: a few iterations on a tiny pipeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vgrpo.models.pipeline import build_adapter
from vgrpo.models.registry import FAMILIES

RewardFn = Callable[[torch.Tensor, Any], dict[str, torch.Tensor]]


def tiny_rollout(shift: float | None, resolution: int = 16) -> dict[str, Any]:
    """The families' tests' rollout: 2 prompts x 3 samples, 3 steps, at ``shift`` (None: the pipeline's dynamic
    shift)."""
    return {
        "prompts_per_iteration": 2,
        "group_size": 3,
        "num_steps": 3,
        "shift": shift,
        "dynamic_shift": shift is None,
        "resolution": resolution,
        "micro_batch_size": 6,
    }


def decoded_brightness(adapter: Any) -> RewardFn:
    """A reward on the decoded images (so the VAE's decode is on the path): their mean brightness."""

    def brightness(samples: torch.Tensor, prompts: Any) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {"bright": adapter.decode(samples).mean(dim=(1, 2, 3))}

    return brightness


def train_two_iterations(
    pipe: Any,
    family: str,
    algorithm_name: str,
    prompts: list[str],
    *,
    shift: float | None = None,
    resolution: int = 16,
    lora: bool = True,
    built: tuple[Any, Any] | None = None,
    encode: Callable[[Any], Any] | None = None,
    reward: Callable[[Any], RewardFn] = decoded_brightness,
) -> tuple[Any, Any, dict[str, torch.Tensor], list[Any]]:
    """Two iterations of ``algorithm_name`` on ``family``'s tiny pipeline (2 prompts x 3 samples, 3 steps): the
    adapter, the policy, its weights before and the iterations' records.

    ``shift``: the static sigma shift, or None for the pipeline's dynamic shift at 3 steps. ``lora``: a rank-4 LoRA
    on the family's targets (seeded), else full fine-tuning. ``built``: the ``(adapter, policy)`` the caller built
    (to hook the policy, or a video resolution), else ``build_adapter``'s. ``encode``: the adapter to the
    conditioning (default: the prompts' text). ``reward``: the adapter to the reward function (default: the decoded
    images' brightness)."""
    from vgrpo.algorithms import build_algorithm
    from vgrpo.config import load_config
    from vgrpo.models import add_lora
    from vgrpo.training.iteration import train_iteration
    from vgrpo.training.optim import build_optimizer

    targets = list(FAMILIES[family].lora_targets)
    algorithm_options: dict[str, Any] = {"name": algorithm_name}
    if algorithm_name == "vgrpo":
        algorithm_options["n_mc"] = 2
    config = load_config(
        overrides={
            "rollout": tiny_rollout(shift, resolution),
            "optim": {"lr": 1e-2, "micro_batch_size": 6},
            "algorithm": algorithm_options,
            "lora": {"rank": 4, "alpha": 8, "target_modules": targets} if lora else None,
        }
    )
    adapter, policy = built if built is not None else build_adapter(pipe, resolution=resolution)
    if lora:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            add_lora(pipe.transformer, rank=4, alpha=8, target_modules=targets)
    else:
        pipe.transformer.requires_grad_(True)
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    if shift is None:  # the dynamic shift resolved once, as the stage does, for a grid the policy can sample
        resolved = adapter.sigma_shift(None, dynamic=True, num_steps=3)
        rollout = config.rollout.model_copy(update={"shift": resolved, "dynamic_shift": False})
        config = config.model_copy(update={"rollout": rollout})
    algorithm = build_algorithm(config, policy=policy, latent_shape=adapter.latent_shape)
    optimizer = build_optimizer(policy, config.optim)
    reward_fn = reward(adapter)
    cond = encode(adapter) if encode is not None else adapter.encode_prompts(prompts)
    records = []
    for it in range(2):
        records.append(
            train_iteration(
                policy=policy,
                algorithm=algorithm,
                optimizer=optimizer,
                prompts=prompts,
                cond=cond,
                config=config,
                reward_fn=reward_fn,
                latent_shape=adapter.latent_shape,
                generator=torch.Generator().manual_seed(it),
                iteration=it,
            )
        )
    return adapter, policy, before, records
