"""Data parallelism over processes for one training iteration (``accelerate launch``: DDP over GPUs, or gloo on CPU).

Every rank holds the whole model and the same optimizer state; the iteration's ``B`` prompts are sharded into
whole prompt groups, ``B / W`` per rank (``W`` = world size), so each rank's samples are a contiguous block
of the prompt-major global batch. What must agree across ranks does:

- randomness shared by the batch (initial noise, timestep-noise pairs, minibatch order) comes from one
  generator with the same seed on every rank, consumed identically, so rank ``r`` keeps its block of the
  global draw and later draws stay aligned; the pairs are broadcast from rank 0 as the official code does;
- rewards are gathered before the group normalisation, so every rank computes the advantages of the global
  batch (a group never straddles ranks, but ``std_scope: global`` needs every group);
- gradients are averaged over ranks before clipping, once per optimizer step (:meth:`average_gradients`).

That is ``distributed.strategy: ddp`` (:class:`DistributedConfig`). Under ``fsdp`` torch's FSDP2 shards the
transformer instead (:mod:`vgrpo.parallel.fsdp`): its parameters are DTensors, each rank holding a shard, and FSDP
averages
their gradients itself (a reduce-scatter in the backward), so :meth:`average_gradients` and
:meth:`broadcast_parameters` leave sharded parameters (:func:`is_sharded`) alone.

``Distributed()`` is one process: every operation is the identity and no process group is touched, so a
single-process run is bit-identical to code that never heard of ranks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

import torch
from accelerate import PartialState
from pydantic import Field
from torch import Tensor, nn

from vgrpo.config_base import FrozenConfig
from vgrpo.config_batch import check_batch
from vgrpo.seeding import derive_seed

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["Distributed", "DistributedConfig", "is_sharded"]

# Gradients are averaged in flat buckets of this many elements: one collective per bucket instead of one per
# tensor (a LoRA has hundreds of small ones), without a second full copy of a fully fine-tuned model's gradients.
_BUCKET_NUMEL = 2**25


class DistributedConfig(FrozenConfig):
    """``distributed:`` in a stage's params: how the processes ``accelerate launch`` starts share the model."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every rank holds the whole model and gradients are averaged once per optimizer step; "
        "fsdp: torch FSDP2 (fully_shard) shards the transformer's parameters, gradients and optimizer state over "
        "the ranks, for full fine-tuning (lora: null) of a model one GPU cannot hold (vgrpo.parallel.fsdp).",
    )


def is_sharded(tensor: Tensor) -> TypeGuard[DTensor]:
    """Whether ``tensor`` is a DTensor (a parameter FSDP shards: each rank holds its own part of it)."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # never imported: no tensor can be one (import costs ~1 s)
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


class Distributed:
    """A view of the process group that training needs.

    Args:
        rank, world_size: this process and the number of processes; ``Distributed()`` is one process.
        device: where collectives run (NCCL needs CUDA tensors; gloo takes CPU ones).
    """

    def __init__(self, rank: int = 0, world_size: int = 1, device: torch.device | str = "cpu"):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size} processes")
        if world_size > 1 and not torch.distributed.is_initialized():
            raise RuntimeError("a world of more than one process needs an initialised torch.distributed group")
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)

    @classmethod
    def from_environment(cls) -> Distributed:
        """The processes ``accelerate launch`` (or torchrun) started; one process (on the GPU if there is one)
        when run plainly.

        Without CUDA the group runs on CPU with gloo (``accelerate launch --multi_gpu`` starts the processes;
        accelerate's own ``--cpu`` mode would need MPI for more than one).
        """
        if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
            return cls(device="cuda" if torch.cuda.is_available() else "cpu")

        state = PartialState(cpu=not torch.cuda.is_available())
        return cls(rank=state.process_index, world_size=state.num_processes, device=state.device)

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs, evaluates and writes checkpoints."""
        return self.rank == 0

    def __repr__(self) -> str:
        return f"Distributed(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    # sharding -------------------------------------------------------------------------------------------------
    def shard(self, num_items: int) -> slice:
        """This rank's contiguous block of an iteration's ``num_items`` prompts.

        Raises:
            ValueError: naming ``rollout.prompts_per_iteration`` when they do not split evenly over the ranks
                (:func:`vgrpo.config_batch.check_batch`).
        """
        size = check_batch(num_items, processes=self.world_size)
        return slice(self.rank * size, (self.rank + 1) * size)

    def local_generator(self, generator: torch.Generator) -> torch.Generator:
        """A generator for randomness that should differ between ranks (SDE noise of the local samples).

        One process: ``generator`` itself (nothing changes). More: a new generator seeded from one draw of
        ``generator`` (the same draw on every rank, so the shared stream stays aligned) and the rank.
        """
        if self.world_size == 1:
            return generator
        draw = int(torch.randint(2**62, (1,), generator=generator).item())
        seed = derive_seed(draw, self.rank)
        return torch.Generator().manual_seed(seed)

    # collectives ----------------------------------------------------------------------------------------------
    def _on_device(self, tensor: Tensor) -> Tensor:
        return tensor.detach().to(self.device).contiguous()

    def gather(self, tensor: Tensor) -> Tensor:
        """Concatenate every rank's ``(n, ...)`` block along dim 0 in rank order (the prompt-major global
        order); the result is on ``tensor``'s device on every rank. All ranks must pass the same shape."""
        if self.world_size == 1:
            return tensor
        local = self._on_device(tensor)
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, local)
        return torch.cat(parts).to(tensor.device)

    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:
        """Rank ``src``'s ``tensor`` on every rank (a new tensor on ``tensor``'s device; same shape everywhere)."""
        if self.world_size == 1:
            return tensor
        buffer = self._on_device(tensor).clone()
        torch.distributed.broadcast(buffer, src=src)
        return buffer.to(tensor.device)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s picklable ``obj`` on every rank (a checkpoint path, a decision)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=src, device=self.device)
        return box[0]

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order (a rank's reward table)."""
        if self.world_size == 1:
            return [obj]
        parts: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(parts, obj)
        return parts

    def broadcast_parameters(self, params: Sequence[nn.Parameter], src: int = 0) -> None:
        """Copy rank ``src``'s values into ``params`` on every rank (what DDP does when it wraps a model); sharded
        parameters are left alone (each rank's shard is its own part, cut from the same weights)."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for p in params:
                if not is_sharded(p):
                    p.copy_(self.broadcast(p.detach(), src))

    def average_gradients(self, params: Sequence[nn.Parameter]) -> None:
        """Replace every ``.grad`` by its mean over ranks, in place.

        Called once per optimizer step, after the algorithm's backward passes (all N_MC pairs and
        micro-batches, or V-GRPO's two passes) and before clipping. DDP's hooks would reduce on every
        backward instead, and skipping all but the last with ``no_sync`` needs the algorithm to know which
        backward is last; one explicit reduction moves the same bytes once, with no wrapper around the policy.

        Each rank's loss is a mean over its own samples and every rank holds the same number, so the mean of
        the ranks' gradients is the gradient of the whole batch's mean loss. A parameter without a gradient
        on every rank keeps ``None`` (the optimizer skips it, as it would in one process); one with a gradient
        on some ranks only counts zeros for the others. Sharded parameters are skipped: FSDP's backward already
        reduce-scattered their gradients (averaged over ranks) into each rank's shard.
        """
        params = [p for p in params if not is_sharded(p)]
        if self.world_size == 1 or not params:
            return
        has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.device)
        torch.distributed.all_reduce(has_grad, op=torch.distributed.ReduceOp.MAX)
        live = [p for p, flag in zip(params, has_grad.tolist(), strict=True) if flag]
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list[Tensor] = []
        numel = 0
        for p in live:
            assert p.grad is not None
            bucket.append(p.grad)
            numel += p.grad.numel()
            if numel >= _BUCKET_NUMEL:
                self._average_bucket(bucket)
                bucket, numel = [], 0
        if bucket:
            self._average_bucket(bucket)

    def _average_bucket(self, grads: list[Tensor]) -> None:
        flat = torch.cat([g.detach().reshape(-1).to(self.device, torch.float32) for g in grads])
        torch.distributed.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a decision every rank must take alike)."""
        if self.world_size == 1:
            return flag
        value = torch.tensor([int(flag)], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())

    def reduce_metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Metrics of the whole batch from each rank's: the mean over ranks (each rank's value is a mean over
        the same number of samples), except keys ending in ``_min`` / ``_max``, reduced by min / max.
        Every rank must pass the same keys."""
        if self.world_size == 1:
            return dict(metrics)
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=self.device)
        ops = {"_min": torch.distributed.ReduceOp.MIN, "_max": torch.distributed.ReduceOp.MAX}
        out: dict[str, float] = {}
        total = values.clone()
        torch.distributed.all_reduce(total)
        for i, key in enumerate(keys):
            out[key] = total[i].item() / self.world_size
        for suffix, op in ops.items():
            chosen = [i for i, k in enumerate(keys) if k.endswith(suffix)]
            if chosen:
                part = values[chosen].clone()
                torch.distributed.all_reduce(part, op=op)
                out.update({keys[i]: part[n].item() for n, i in enumerate(chosen)})
        return {k: out[k] for k in metrics}

    def barrier(self) -> None:
        """Wait until every rank gets here (rank 0 writes a checkpoint, the others wait to read it)."""
        if self.world_size > 1:
            torch.distributed.barrier()
