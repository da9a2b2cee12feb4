"""FLOPs: what one training iteration computes, counted per phase (rollout, reward, prepare, update) with
:class:`torch.utils.flop_counter.FlopCounterMode`, and what the machine can, its square ``torch.mm`` ceiling. The
CPU's fused attention kernel, which the counter does not know, is counted with the same formula as the GPU's
(:func:`register_cpu_attention_flops`). :mod:`benchmarks.roofline` puts the two together."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from vgrpo.training.iteration import IterationRecord, PhaseRegion, profiler_region, train_iteration

CPU_SIZES = (2048, 4096)
GPU_SIZES = (8192,)

_registered = False


def register_cpu_attention_flops() -> None:
    """Count ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward) as the counter counts the CUDA
    flash kernel: ``4 b h s_q s_k d`` forward, 2.5 times that backward. Idempotent."""
    global _registered
    if _registered:
        return
    aten = torch.ops.aten

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
    def _cpu_flash(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
        return int(sdpa_flop_count(query_shape, key_shape, value_shape))

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
    def _cpu_flash_backward(
        grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any
    ) -> int:
        return int(sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape))

    _registered = True


class FlopSum(TorchDispatchMode):
    """The total FLOPs of the operators run inside it, by :class:`FlopCounterMode`'s formulas, without its module
    tracking: FlopCounterMode hooks every module's forward and, for the backward, registers a gradient hook on every
    module's inputs and outputs, and keeps the parents set per operator. At the SD3.5-M architecture on the GPU, where
    the kernels are short, that Python work per module and per operator starved the GPU: V-GRPO's counted warm-up
    took about four times its timed iteration, and Flow-GRPO's (about 2 x 39 x 24 forwards and 39 x 24 backwards)
    outran the check's 340 s (docs/gpu/README.md). The total is the same (tests/benchmarks/test_flops.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # No decomposition of the operators without a formula (FlopCounterMode tries one for each, inside the mode
        # again: the larger part of its cost per operator); the totals agree on every method's iteration.
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


def count_flops(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()``'s result and the FLOPs of the tensor operations it ran (matmuls, convolutions, attention)."""
    register_cpu_attention_flops()
    with FlopCounterMode(display=False) as counter:
        result = fn()
    return result, int(counter.get_total_flops())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(device: str | torch.device, dtype: torch.dtype, sizes: Sequence[int], repeats: int = 3) -> float:
    """The best rate in GFLOP/s of ``torch.mm`` on square ``n x n`` random matrices over ``sizes`` (each timed
    ``repeats`` times after a warm-up; the best time per size), in the current thread setting."""
    device = torch.device(device)
    best = 0.0
    g = torch.Generator(device=device).manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        torch.mm(a, b)
        _sync(device)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            _sync(device)
            times.append(time.perf_counter() - t0)
        best = max(best, 2 * n**3 / min(times) / 1e9)
        del a, b
    return best


def ceilings(device: str | torch.device) -> dict[str, float]:
    """fp32 and bf16 matmul ceilings (GFLOP/s) of ``device``; on CUDA fp32 without TF32 (what fp32 runs get)."""
    device = torch.device(device)
    sizes = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    repeats = 10 if device.type == "cuda" else 5
    return {
        "fp32": matmul_ceiling(device, torch.float32, sizes, repeats),
        "bf16": matmul_ceiling(device, torch.bfloat16, sizes, repeats),
    }


def counting_region(into: dict[str, int]) -> PhaseRegion:
    """A :data:`vgrpo.training.iteration.PhaseRegion` that adds each phase's FLOPs to ``into[phase]`` (keeping the
    phase's profiler label)."""
    register_cpu_attention_flops()

    @contextmanager
    def region(phase: str) -> Iterator[None]:
        with profiler_region(phase), FlopSum() as counter:
            yield
        into[phase] = into.get(phase, 0) + counter.total

    return region


def counted_iteration(
    *,
    policy: torch.nn.Module,
    algorithm: Any,
    optimizer: torch.optim.Optimizer,
    reward_fn: Callable[[torch.Tensor, Sequence[str]], Mapping[str, torch.Tensor]],
    prompts: Sequence[str],
    cond: Any,
    config: Any,
    latent_shape: tuple[int, ...],
    generator: torch.Generator,
    iteration: int,
) -> tuple[IterationRecord, dict[str, int]]:
    """:func:`vgrpo.training.iteration.train_iteration` itself, with the FLOPs of each of its four phases counted
    (:func:`counting_region`)."""
    flops: dict[str, int] = {}
    record = train_iteration(
        policy=policy,
        algorithm=algorithm,
        optimizer=optimizer,
        reward_fn=reward_fn,
        prompts=prompts,
        cond=cond,
        config=config,
        latent_shape=latent_shape,
        generator=generator,
        iteration=iteration,
        region=counting_region(flops),
    )
    return record, flops
