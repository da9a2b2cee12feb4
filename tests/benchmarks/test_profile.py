"""The profile command: operators attributed to phases and categories, its FLOPs against the FLOP counter's, the
per-shape ceiling and the shares that add up."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.flops import count_flops
from benchmarks.operator_categories import CATEGORIES, category
from benchmarks.profile import PHASES, attribute, summarize
from benchmarks.shape_ceiling import per_shape_ceiling
from tests.algorithms.helpers import iteration_kwargs, make_config
from vgrpo.training.iteration import train_iteration


def _event(name: str, parent: Any = None) -> Any:
    return SimpleNamespace(name=name, cpu_parent=parent)


def test_categories_by_operator_and_by_what_encloses_it() -> None:
    assert category(_event("aten::addmm")) == "matmul"
    assert category(_event("aten::_scaled_dot_product_flash_attention_for_cpu_backward")) == "attention"
    # the math kernel's matmuls belong to attention, as its softmax does
    math = _event("aten::_scaled_dot_product_attention_math")
    assert category(_event("aten::bmm", _event("aten::matmul", math))) == "attention"
    assert category(_event("aten::_softmax", math)) == "attention"
    assert category(_event("aten::gelu")) == "elementwise"
    assert category(_event("aten::native_layer_norm_backward")) == "norm"
    assert category(_event("aten::cat")) == "copy"
    assert category(_event("aten::mkldnn_convolution")) == "convolution"
    assert category(_event("aten::view")) == "dispatch"
    assert category(_event("graph_0_cpp_fused_gelu_view_3")) == "compiled"


def _iteration(seed: int) -> dict[str, Any]:
    return iteration_kwargs(make_config({"name": "vgrpo", "n_mc": 2}), seed)


def test_the_profiled_iteration_counts_the_flop_counters_flops_in_its_phases() -> None:
    """Each phase's region has a wall time; the matmul and attention FLOPs the profile attributes are those the
    FLOP counter counts for the same iteration (the convolution's, counted by another formula, aside)."""
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        train_iteration(**_iteration(0))
    attributed = attribute(prof.events())
    for phase in ("rollout", "prepare", "update"):
        assert attributed["wall_us"][phase] > 0
        assert attributed["table"][phase]["matmul"]["flops"] > 0
    torch.manual_seed(0)
    _, counted = count_flops(lambda: train_iteration(**_iteration(0)))
    profiled = sum(attributed["table"][p][c]["flops"] for p in PHASES for c in ("matmul", "attention", "convolution"))
    convolution = sum(attributed["table"][p]["convolution"]["flops"] for p in PHASES)
    assert profiled - convolution == pytest.approx(counted - convolution, rel=0.02)
    assert attributed["shapes"] and all(use["calls"] > 0 for use in attributed["shapes"].values())


def test_per_shape_ceiling_times_each_matmul_and_names_what_it_skips() -> None:
    shapes = {
        ("aten::mm", "[[64, 32], [32, 48]]", '["float", "float"]'): {"calls": 3, "flops": 3 * 2 * 64 * 32 * 48},
        ("aten::addmm", "[[48], [64, 32], [32, 48], [], []]", '["float", "float", "float", "Scalar", "Scalar"]'): {
            "calls": 1,
            "flops": 2 * 64 * 32 * 48,
        },
        ("aten::mm", "[[64, 32]]", '["float"]'): {"calls": 1, "flops": 4 * 2 * 64 * 32 * 48},  # not rebuilt
    }
    ceiling = per_shape_ceiling(shapes, repeats=2)
    assert len(ceiling["shapes"]) == 2 and all(row["gflops"] > 0 for row in ceiling["shapes"])
    assert ceiling["skipped_flops_share"] == pytest.approx(0.5)
    # the FLOP-weighted harmonic mean lies between the slowest and the fastest shape
    rates = [row["gflops"] for row in ceiling["shapes"]]
    assert min(rates) * 0.999 <= ceiling["gflops"] <= max(rates) * 1.001


def test_category_shares_of_each_phase_add_up_to_one() -> None:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_iteration(**_iteration(1))
    timed = attribute(prof.events())
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        train_iteration(**_iteration(1))
    counted = attribute(prof.events())
    report = summarize(timed, counted, iterations=1, ceiling={"gflops": 100.0})
    for phase in ("rollout", "prepare", "update", "iteration"):
        shares = sum(report[phase]["categories"][c]["share"] for c in CATEGORIES)
        assert shares == pytest.approx(1.0, abs=1e-6)
        assert report[phase]["categories"]["matmul"]["rate"] > 0
