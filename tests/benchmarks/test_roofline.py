"""The roofline benchmark's FLOP count against hand counts, and its counted iteration against the plain one."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import ROOT
from benchmarks.flops import count_flops, counted_iteration, matmul_ceiling
from benchmarks.roofline import PHASES, markdown, median_repeat, relative_cost_table, relative_costs, roofline
from tests.algorithms.helpers import GROUP, PROMPTS, iteration_kwargs, make_config
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning, tiny_sd3_transformer
from vgrpo.training.iteration import train_iteration


def test_linear_and_cpu_attention_match_hand_counts() -> None:
    layer = nn.Linear(24, 40)
    x = torch.randn(7, 24)
    assert count_flops(lambda: layer(x))[1] == 2 * 7 * 24 * 40

    b, h, s_q, s_k, d = 2, 3, 10, 12, 8
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for n in (s_q, s_k, s_k))
    forward = 2 * b * h * s_q * s_k * d * 2  # q k^T, then the weights times v
    out, flops = count_flops(lambda: F.scaled_dot_product_attention(q, k, v))
    assert flops == forward  # 0 if the CPU flash kernel were not registered
    _, backward = count_flops(lambda: out.sum().backward())
    assert backward == forward * 5 // 2


def test_sd3_forward_matches_a_hand_count() -> None:
    """Every linear layer's ``2 rows in out`` (rows read off forward hooks), the patch convolution and one joint
    attention per block over image + text tokens: the counter's total, exactly."""
    model = tiny_sd3_transformer(num_layers=2).eval()
    cond = tiny_conditioning(3)
    latents = torch.randn(3, *TINY_LATENT_SHAPE)
    hand = 0

    def on_linear(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        nonlocal hand
        rows = inputs[0].numel() // inputs[0].shape[-1]
        hand += 2 * rows * module.in_features * module.out_features

    hooks = [m.register_forward_hook(on_linear) for m in model.modules() if isinstance(m, nn.Linear)]
    _, counted = count_flops(
        lambda: model(
            hidden_states=latents,
            encoder_hidden_states=cond.prompt_embeds,
            pooled_projections=cond.pooled_prompt_embeds,
            timestep=torch.full((3,), 500.0),
        )
    )
    for hook in hooks:
        hook.remove()
    conv = model.pos_embed.proj
    tokens = (TINY_LATENT_SHAPE[1] // 2) * (TINY_LATENT_SHAPE[2] // 2)
    hand += 2 * 3 * tokens * conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1] * conv.out_channels
    heads, head_dim, text = 2, 8, cond.prompt_embeds.shape[1]
    hand += 2 * 4 * 3 * heads * (tokens + text) ** 2 * head_dim
    assert counted == hand


@pytest.mark.parametrize("algorithm", ["vgrpo", "flow_grpo", "mixgrpo", "diffusion_nft"])
def test_counted_iteration_is_the_plain_iteration(algorithm: str) -> None:
    """Counting changes nothing: the same metrics and weights as train_iteration; the phases, counted with the lean
    FlopSum, add up to the FLOPs of the whole iteration counted at once by FlopCounterMode."""
    config = make_config({"name": algorithm})
    runs = []
    for counted in (False, True):
        kwargs = iteration_kwargs(config)
        policy = kwargs["policy"]
        if counted:
            record, flops = counted_iteration(**kwargs)
        else:
            record, whole = count_flops(lambda kwargs=kwargs: train_iteration(**kwargs))
        weights = [p.detach().clone() for p in policy.parameters()]
        runs.append((record, weights))
    (plain, plain_weights), (record, weights) = runs
    untimed = {k: v for k, v in plain.metrics.items() if not k.startswith("time/")}
    assert untimed == {k: v for k, v in record.metrics.items() if not k.startswith("time/")}
    assert all(torch.equal(a, b) for a, b in zip(plain_weights, weights, strict=True))
    assert sum(flops[p] for p in PHASES) == whole
    assert flops["rollout"] > 0 and flops["update"] > 0
    if algorithm in ("vgrpo", "flow_grpo"):  # V-GRPO's old surrogates; Flow-GRPO's come from the SDE
        assert (flops["prepare"] > 0) == (algorithm == "vgrpo")
    assert record.samples.shape[0] == GROUP * PROMPTS


def test_roofline_rates_and_fractions() -> None:
    table = roofline(
        {"rollout": 2.0, "reward": 0.5, "prepare": 0.5, "update": 1.0},
        {"rollout": 200e9, "reward": 0, "prepare": 50e9, "update": 150e9},
        ceiling_gflops=200.0,
    )
    assert table["rollout"]["gflops"] == pytest.approx(100.0)
    assert table["rollout"]["fraction"] == pytest.approx(0.5)
    assert table["iteration"]["gflop"] == pytest.approx(400.0)
    assert table["iteration"]["gflops"] == pytest.approx(100.0)
    assert table["iteration"]["fraction"] == pytest.approx(0.5)
    # the whole iteration's seconds, with what runs between the phases, when measured
    whole = roofline(
        {"rollout": 2.0, "reward": 0.5, "prepare": 0.5, "update": 1.0},
        {"rollout": 200e9, "reward": 0, "prepare": 50e9, "update": 150e9},
        ceiling_gflops=200.0,
        iteration_seconds=5.0,
    )
    assert whole["iteration"]["seconds"] == 5.0 and whole["iteration"]["gflops"] == pytest.approx(80.0)


def test_matmul_ceiling_is_a_rate() -> None:
    rate = matmul_ceiling("cpu", torch.float32, (128,), repeats=2)
    assert 0.1 < rate < 1e5  # GFLOP/s of a real product: neither zero nor absurd


def test_markdown_reports_fractions_and_speedups() -> None:
    def result(seconds: float) -> dict[str, float]:
        phases = {"rollout": seconds / 2, "reward": 0.0, "prepare": seconds / 4, "update": seconds / 4}
        out = {f"time/{p}_s": s for p, s in phases.items()}
        out["time/total_s"] = seconds
        out.update({"flops/rollout": int(50e9), "flops/reward": 0, "flops/prepare": int(25e9), "flops/update": 25e9})
        return out

    report = {
        "device": "cpu",
        "threads": 2,
        "ceilings": {"fp32": 100.0, "bf16": 400.0},
        "configs": {
            "embedded": {"description": "d", "precision": "fp32", "results": {"vgrpo": result(2.0)}},
            "embedded+bf16": {"description": "d", "precision": "bf16", "results": {"vgrpo": result(1.0)}},
        },
    }
    text = markdown(report)
    assert "| embedded | 2.00 (50%) |" in text  # 100 GFLOP in 2 s = 50 GFLOP/s of 100
    assert "| embedded+bf16 | 1.00 (25%, 2.00x) |" in text  # 100 GFLOP/s of bf16's 400, twice as fast


def test_relative_costs_cancel_a_machine_that_slows_between_processes() -> None:
    """Flow-GRPO's iteration is 3x V-GRPO's work, but its process ran on a machine 1.25x slower: the raw ratio
    reads 3.75x, the ratio in units of each process's own rollout (the same work in both) reads 3x."""
    vgrpo = {"time/rollout_s": 2.0, "time/total_s": 4.0}
    flow = {"time/rollout_s": 2.5, "time/total_s": 15.0}
    assert relative_costs(flow, vgrpo) == pytest.approx((3.75, 3.0))
    config = {"description": "d", "precision": "fp32", "results": {"vgrpo": vgrpo, "flow_grpo": flow}}
    lines = relative_cost_table({"configs": {"embedded": config}}, ["vgrpo", "flow_grpo"])
    assert "| embedded | 3.75x (3.00x) |" in lines
    assert relative_cost_table({"configs": {"embedded": config}}, ["vgrpo"]) == []


def test_median_repeat_keeps_the_median_run_and_the_range() -> None:
    runs = [{"time/total_s": s, "x": s} for s in (3.0, 1.0, 2.0)]
    out = median_repeat(runs)
    assert out["x"] == 2.0 and out["time/total_s_min"] == 1.0 and out["time/total_s_max"] == 3.0
    assert out["repeats"] == 3
    assert median_repeat([{"error": "boom"}]) == {"error": "boom"}


@pytest.mark.parametrize(
    "record",
    ["roofline.json", "roofline-embedded-t10.json", "roofline-embedded-t40.json", "roofline-embedded-levers.json"],
)
def test_the_committed_roofline_report_rebuilds_from_its_records(record: str) -> None:
    """docs/benchmarks/roofline.md's tables are markdown() of each committed record, digit for digit."""
    report = json.loads((ROOT / "docs" / "benchmarks" / record).read_text())
    assert report["repeats"] == 3 and report["threads"] == 2
    assert markdown(report) in (ROOT / "docs" / "benchmarks" / "roofline.md").read_text()
