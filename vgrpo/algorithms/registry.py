"""Algorithm registry: short name -> dotted class path, imported only when selected."""

from __future__ import annotations

import enum
import importlib
from typing import Any, Final, Literal, Protocol

from torch import nn

from vgrpo.algorithms.base import Algorithm
from vgrpo.algorithms.config import AlgorithmConfig, RolloutConfig
from vgrpo.flow import timestep_grid
from vgrpo.parallel.distributed import Distributed

__all__ = ["ALGORITHMS", "CONFIG_SHIFT", "build_algorithm", "get_algorithm_class"]

ALGORITHMS: dict[str, str] = {
    "vgrpo": "vgrpo.algorithms.vgrpo:VGRPO",
    "naive_elbo": "vgrpo.algorithms.vgrpo:VGRPO",
    "flow_grpo": "vgrpo.algorithms.flow_grpo:FlowGRPO",
    "mixgrpo": "vgrpo.algorithms.flow_grpo:MixGRPO",
    "diffusion_nft": "vgrpo.algorithms.diffusion_nft:DiffusionNFT",
}


class _MicroBatch(Protocol):
    @property
    def micro_batch_size(self) -> int: ...


class RunSettings(Protocol):
    """What :func:`build_algorithm` reads of a run's config (:class:`vgrpo.config.TrainConfig`, which this package
    sits below)."""

    @property
    def rollout(self) -> RolloutConfig: ...

    @property
    def optim(self) -> _MicroBatch: ...

    @property
    def algorithm(self) -> AlgorithmConfig: ...


def get_algorithm_class(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; valid names: {', '.join(sorted(ALGORITHMS))}")
    module, _, cls = ALGORITHMS[name].partition(":")
    algorithm_class: type[Algorithm] = getattr(importlib.import_module(module), cls)
    return algorithm_class


class _Shift(enum.Enum):
    CONFIG = "config"


CONFIG_SHIFT: Final = _Shift.CONFIG
"""``build_algorithm``'s default shift: the params' static ``rollout.shift``."""


def build_algorithm(
    config: RunSettings,
    *,
    policy: nn.Module,
    latent_shape: tuple[int, ...],
    shift: float | Literal[_Shift.CONFIG] | None = CONFIG_SHIFT,
    dist: Distributed | None = None,
) -> Algorithm:
    """Instantiate ``config.algorithm`` with the plain values it needs from the rest of the config.

    Args:
        shift: the resolved static shift of the sigma grid (``PipelineAdapter.sigma_shift``: FLUX's dynamic shift
            depends on the adapter's token count, which this function cannot see; None for no shift); by default
            the params' ``rollout.shift``, which must then be static.
        dist: the processes sharing each batch (default one).
    """
    if shift is CONFIG_SHIFT:
        if config.rollout.dynamic_shift:
            raise ValueError(
                "rollout.dynamic_shift must be resolved to a static shift first and passed as shift= "
                "(PipelineAdapter.sigma_shift, as vgrpo.training.phases.setup_policy does)"
            )
        shift = config.rollout.shift
    algo_config = config.algorithm
    kwargs: dict[str, Any] = {
        "sigmas": timestep_grid(config.rollout.num_steps, shift=shift, schedule=config.rollout.schedule),
        "group_size": config.rollout.group_size,
        "latent_shape": latent_shape,
        "rollout_micro_batch": config.rollout.micro_batch_size,
        "train_micro_batch": config.optim.micro_batch_size,
        "dist": dist,
        "policy": policy,
    }
    cls = get_algorithm_class(algo_config.name)
    return cls(algo_config, **kwargs)
