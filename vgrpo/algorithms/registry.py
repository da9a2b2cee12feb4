"""Algorithm registry: short name -> dotted class path, imported only when selected."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torch import nn

from vgrpo.algorithms.base import Algorithm
from vgrpo.flow import timestep_grid
from vgrpo.parallel.distributed import Distributed

if TYPE_CHECKING:  # vgrpo.config imports this package's configs: a runtime import would be a circle
    from vgrpo.config import TrainConfig

__all__ = ["ALGORITHMS", "build_algorithm", "get_algorithm_class"]

ALGORITHMS: dict[str, str] = {
    "vgrpo": "vgrpo.algorithms.vgrpo:VGRPO",
    "naive_elbo": "vgrpo.algorithms.vgrpo:VGRPO",
    "flow_grpo": "vgrpo.algorithms.flow_grpo:FlowGRPO",
    "mixgrpo": "vgrpo.algorithms.flow_grpo:MixGRPO",
    "diffusion_nft": "vgrpo.algorithms.diffusion_nft:DiffusionNFT",
}

# Algorithms that keep a copy of the trainable weights (reference or old policy) need the policy.
_NEEDS_POLICY = {"vgrpo", "naive_elbo", "flow_grpo", "mixgrpo", "diffusion_nft"}


def get_algorithm_class(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; valid names: {', '.join(sorted(ALGORITHMS))}")
    module, _, cls = ALGORITHMS[name].partition(":")
    algorithm_class: type[Algorithm] = getattr(importlib.import_module(module), cls)
    return algorithm_class


def build_algorithm(
    config: TrainConfig, *, policy: nn.Module, latent_shape: tuple[int, ...], dist: Distributed | None = None
) -> Algorithm:
    """Instantiate ``config.algorithm`` with the plain values it needs from the rest of the config; ``dist``:
    the processes sharing each batch (default one)."""
    if config.rollout.dynamic_shift:  # it depends on the adapter's token count, which this function cannot see
        raise ValueError(
            "rollout.dynamic_shift must be resolved to a static shift first "
            "(PipelineAdapter.sigma_shift, as vgrpo.training.stage.run_stage does)"
        )
    algo_config = config.algorithm
    kwargs: dict[str, Any] = {
        "sigmas": timestep_grid(config.rollout.num_steps, shift=config.rollout.shift, schedule=config.rollout.schedule),
        "group_size": config.rollout.group_size,
        "latent_shape": latent_shape,
        "rollout_micro_batch": config.rollout.micro_batch_size,
        "train_micro_batch": config.optim.micro_batch_size,
        "dist": dist,
    }
    if algo_config.name in _NEEDS_POLICY:
        kwargs["policy"] = policy
    cls = get_algorithm_class(algo_config.name)
    return cls(algo_config, **kwargs)
