"""Fully sharded data parallelism (torch FSDP2) for full fine-tuning: ``distributed.strategy: fsdp``.

:func:`shard_transformer` wraps each of the transformer's blocks, then the transformer itself, with
``torch.distributed.fsdp.fully_shard`` on a one-dimensional device mesh over the ranks ``accelerate launch``
started. The blocks are the classes the model names in ``_no_split_modules`` (SD3's ``JointTransformerBlock``,
FLUX's double- and single-stream blocks): the classes accelerate's FSDP2 plugin wraps by default. Then:

- every parameter is a DTensor holding this rank's shard (a 1/W slice of dim 0); FSDP all-gathers one block's
  parameters for its forward (and again for its backward) and frees them after;
- the backward reduce-scatters the gradients into the shards, averaged over ranks, so the gradients are sharded
  and no explicit all-reduce runs (:meth:`vgrpo.parallel.distributed.Distributed.average_gradients` skips them);
- the optimizer, built over the sharded parameters, keeps sharded state (AdamW's moments);
- the snapshots (:class:`vgrpo.policy.ParameterSnapshot`: DiffusionNFT's "old" policy, the KL references, the
  policy EMA) hold this rank's shards and exchange values in place;
- checkpoints are written by every rank (:mod:`vgrpo.checkpoints.sharded`), and the export gathers the whole
  transformer on rank 0 (:func:`vgrpo.checkpoints.sharded.export_pipeline`).

The processes themselves come from ``accelerate launch`` (:meth:`Distributed.from_environment`). The model is
wrapped with torch's ``fully_shard`` directly rather than through ``Accelerator.prepare``, which would wrap the
optimizer and take over backward and clipping: one training step (:mod:`vgrpo.training.iteration`) serves every
algorithm
and both strategies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from vgrpo.parallel.distributed import Distributed

__all__ = ["full_state_dict", "shard_transformer", "unsharded_copy"]


def _blocks(transformer: nn.Module) -> list[nn.Module]:
    names = set(getattr(transformer, "_no_split_modules", None) or ())
    blocks = [m for m in transformer.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(transformer).__name__} names no blocks to shard (_no_split_modules)")
    return blocks


def shard_transformer(transformer: nn.Module, dist: Distributed) -> nn.Module:
    """Shard ``transformer`` over ``dist``'s ranks in place (module docstring) and return it; its parameters move
    to ``dist.device`` shard by shard. Every rank must call it, before the optimizer or any snapshot is built.

    Every rank first takes rank 0's weights (as DDP does), since each rank cuts its shard from its own copy.
    Parameters are resharded after every forward pass, the root's included (FSDP's default keeps the root's
    gathered), so between passes each rank holds only its shards and the snapshots swap those.
    """

    dist.broadcast_parameters(list(transformer.parameters()))
    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    for block in _blocks(transformer):
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(transformer, mesh=mesh, reshard_after_forward=True)
    return transformer


def full_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """The sharded ``module``'s whole state dict, gathered on rank 0 in CPU memory (empty on the other ranks).
    A collective: every rank must call it."""

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return cast(dict[str, Tensor], get_model_state_dict(module, options=options))


def unsharded_copy(module: nn.Module, state: Mapping[str, Tensor]) -> nn.Module:
    """A plain (unsharded) instance of the sharded diffusers model ``module``'s class holding ``state`` (the output
    of :func:`full_state_dict`), built without a second random initialisation; buffers the state dict does not
    carry (non-persistent) are copied from ``module``."""

    cls: Any = next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))  # fully_shard subclasses it
    with torch.device("meta"):
        copy = cls.from_config(module.config)
    copy.load_state_dict(state, assign=True)
    for name, buffer in list(copy.named_buffers()):
        if buffer.is_meta:
            owner, _, leaf = name.rpartition(".")
            copy.get_submodule(owner).register_buffer(leaf, module.get_buffer(name).detach().cpu(), persistent=False)
    missing = [name for name, t in copy.state_dict(keep_vars=True).items() if t.is_meta]
    if missing:
        raise ValueError(f"the gathered state of {cls.__name__} lacks {missing[:3]}")
    return copy
