"""What the V-GRPO update's graphs hold in memory, for ``algorithm.memory_bounded: auto``.

The full-graph update keeps every (pair, micro-batch) graph alive until its one backward; the two-pass update keeps
one at a time and pays a no-grad forward of every pair instead. Their gradients are equal (up to float order), so the
choice is a memory budget's: measure one graph, multiply by the graphs the full update keeps, compare.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

__all__ = ["MB", "UpdateMemoryChoice", "available_memory_bytes", "choose_update", "saved_tensor_bytes"]

T = TypeVar("T")

MB = 2**20


def saved_tensor_bytes(forward: Callable[[], T], *, exclude: Iterable[Tensor] = ()) -> tuple[T, int]:
    """Run ``forward`` (autograd on) and return its output and the bytes of the distinct storages its graph saves
    for the backward, without those of ``exclude`` (the weights, which are in memory either way)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    saved: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    return out, sum(saved.values())


def available_memory_bytes(device: torch.device) -> int:
    """What ``device`` can still allocate: a CUDA device's free memory, else the host's ``MemAvailable``."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


@dataclass(frozen=True)
class UpdateMemoryChoice:
    """The update path and what it was chosen from (all in MB).

    Attributes:
        full_graph: True = every graph of a gradient step alive at once (one backward); False = two passes.
        graph_mb: one (pair, micro-batch) graph's saved tensors; the two-pass update's peak above the weights.
        full_graph_mb: ``graph_mb`` times the graphs the full update keeps.
        budget_mb: what the graphs may hold.
    """

    full_graph: bool
    graph_mb: float
    full_graph_mb: float
    budget_mb: float

    def metrics(self) -> dict[str, float]:
        return {
            "update/full_graph": float(self.full_graph),
            "update/graph_mb": self.graph_mb,
            "update/full_graph_mb": self.full_graph_mb,
            "update/budget_mb": self.budget_mb,
        }


def choose_update(
    *, graph_bytes: int, n_mc: int, num_samples: int, micro_batch: int, budget_mb: float
) -> UpdateMemoryChoice:
    """The full graph when ``n_mc`` pairs times the micro-batches of ``num_samples`` graphs fit ``budget_mb``."""
    graphs = n_mc * math.ceil(num_samples / micro_batch)
    graph_mb = graph_bytes / MB
    full_graph_mb = graphs * graph_mb
    return UpdateMemoryChoice(
        full_graph=full_graph_mb <= budget_mb, graph_mb=graph_mb, full_graph_mb=full_graph_mb, budget_mb=budget_mb
    )
