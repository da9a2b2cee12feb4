"""The per-shape matmul ceiling: the rate the iteration's own matmul shapes reach when each runs alone
(:mod:`benchmarks.profile`)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["per_shape_ceiling", "shape_rate"]

TORCH_DTYPES = {"float": torch.float32, "c10::BFloat16": torch.bfloat16, "c10::Half": torch.float16}


def _operands(name: str, shapes: Sequence[Any], dtypes: Sequence[str]) -> list[torch.Tensor] | None:
    """Fresh contiguous operands for one matmul call as the profiler recorded it, or None if it cannot be rebuilt."""
    g = torch.Generator().manual_seed(0)
    tensors = []
    for shape, dtype in zip(shapes, dtypes, strict=False):
        if not (isinstance(shape, list) and shape):
            continue
        tensors.append(torch.randn(*shape, generator=g, dtype=TORCH_DTYPES.get(dtype, torch.float32)))
    expected = {"aten::mm": 2, "aten::bmm": 2, "aten::addmm": 3, "aten::baddbmm": 3, "aten::addbmm": 3}
    return tensors if len(tensors) == expected.get(name, -1) else None


def shape_rate(name: str, shapes: Sequence[Any], dtypes: Sequence[str], repeats: int) -> float | None:
    """GFLOP/s of one matmul shape alone (the best of ``repeats`` after a warm-up), or None if not rebuilt."""
    operands = _operands(name, shapes, dtypes)
    if operands is None:
        return None
    op = getattr(torch, name.removeprefix("aten::"))
    if name in ("aten::mm", "aten::bmm"):
        m, k = operands[0].shape[-2:]
        n = operands[1].shape[-1]
        batch = operands[0].shape[0] if name == "aten::bmm" else 1
    else:
        m, k = operands[1].shape[-2:]
        n = operands[2].shape[-1]
        batch = operands[1].shape[0] if name == "aten::baddbmm" else 1
    flops = 2 * batch * m * k * n
    op(*operands)
    best = math.inf
    calls = max(1, int(2e8 // max(flops, 1)))  # about 0.5 ms of work a timing at least
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            op(*operands)
        best = min(best, (time.perf_counter() - t0) / calls)
    return flops / best / 1e9


def per_shape_ceiling(shapes: Mapping[tuple[str, str, str], Mapping[str, float]], repeats: int) -> dict[str, Any]:
    """The rate (GFLOP/s) the iteration's matmul FLOPs reach if each shape runs at its own rate alone, with each
    shape's rate (the shapes that could not be rebuilt, and their FLOPs' share, are named)."""
    rows, seconds, counted, skipped = [], 0.0, 0, 0
    for (name, shapes_json, dtypes_json), use in sorted(shapes.items(), key=lambda kv: -kv[1]["flops"]):
        rate = shape_rate(name, json.loads(shapes_json), json.loads(dtypes_json), repeats)
        if rate is None or use["flops"] == 0:
            skipped += int(use["flops"])
            continue
        seconds += use["flops"] / (rate * 1e9)
        counted += int(use["flops"])
        rows.append({"op": name, "shapes": shapes_json, "dtypes": dtypes_json, "calls": use["calls"], "gflops": rate})
    total = counted + skipped
    return {
        "gflops": counted / seconds / 1e9 if seconds else 0.0,
        "shapes": rows,
        "skipped_flops_share": skipped / total if total else 0.0,
    }
