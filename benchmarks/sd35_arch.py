"""Per-iteration time and peak memory of V-GRPO, Flow-GRPO and MixGRPO at the SD3.5-Medium transformer
architecture.

    python -m benchmarks.sd35_arch                                   # GPU: the real config, 512 px, group 24
    python -m benchmarks.sd35_arch --device cpu --layers 2 --resolution 128 --group 4 --steps 8 --text-tokens 77
    python -m benchmarks.sd35_arch --device cpu --layers 2 --heads 2 --pos-embed-max-size 16 --resolution 64 ...

Random weights from SD3.5-M's transformer config (no download; ``--layers`` keeps the first N of its 24 blocks,
dual-attention blocks included, ``--heads`` narrows it for a smoke run), LoRA r 32 / alpha 64 on both streams'
attention projections, random text conditioning of SD3's width (333 tokens = 77 CLIP + 256 T5 by default),
and a reward computed on the latents (no VAE, no reward model: this measures the policy's cost). Each method runs in
its own process: V-GRPO with the paper's recipe (40-step ODE rollout, N_MC 4, one gradient step), Flow-GRPO with
its own (SDE rollout, 0.99 of its steps trained), MixGRPO with its own (SDE and training in a 4-step window).
Prints the median seconds per iteration split into rollout / prepare / update, images per second per device, and
peak memory (CUDA allocator peak on GPU, resident set size on CPU); ``--json`` also writes them, with an
``error`` in place of a method that failed or outran ``--timeout``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import torch
from diffusers import SD3Transformer2DModel

from benchmarks.common import ARCH_METHODS, ROOT
from benchmarks.common import METHODS as COMPARED
from benchmarks.flops import ceilings, counted_iteration
from benchmarks.roofline import phase_table, summarize
from vgrpo.algorithms import build_algorithm
from vgrpo.config import TrainConfig, load_config
from vgrpo.models import SD3Velocity, add_lora
from vgrpo.models.precision import apply_precision_config
from vgrpo.policy import Conditioning
from vgrpo.training.iteration import train_iteration
from vgrpo.training.optim import build_optimizer

METHODS = ARCH_METHODS

# SD3.5-Medium's transformer/config.json (diffusers SD3Transformer2DModel).
SD35M = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 384,
    "dual_attention_layers": tuple(range(13)),
    "qk_norm": "rms_norm",
}


def run_one(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """``method``'s iterations at the architecture, in this process: its median seconds per iteration and per phase,
    images per second, NFE per sample, parameters, peak memory and the warm-up's FLOPs per phase."""
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    config = method_config(method, args)
    transformer = build_transformer(args, device)
    iteration_kwargs = iteration_arguments(config, transformer, args)
    rows, flops = timed_iterations(iteration_kwargs, args.iterations, device)
    return summary(rows, flops, transformer, args, device)


def method_config(method: str, args: argparse.Namespace) -> TrainConfig:
    """``method``'s preset on the base config at the command line's rollout, micro-batch and precision, LoRA r 32."""
    return load_config(
        [ROOT / "params" / "base.yaml", ROOT / "params" / "algorithms" / f"{method}.yaml"],
        {
            "rollout": {
                "prompts_per_iteration": args.prompts,
                "group_size": args.group,
                "num_steps": args.steps,
                "micro_batch_size": args.micro_batch,
            },
            "optim": {"micro_batch_size": args.micro_batch},
            "lora": {"rank": 32, "alpha": 64},
            # MixGRPO's SDE window cannot be wider than the rollout
            "algorithm": {"window_size": min(4, args.steps)} if method == "mixgrpo" else {},
            "precision": {
                "autocast": args.precision,
                "gradient_checkpointing": args.gradient_checkpointing,
                "merged_lora": args.merged_lora,
            },
        },
    )


def build_transformer(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    """SD3.5-M's transformer with random weights (seed 0), cut to ``args.layers`` blocks and ``args.heads`` heads."""
    arch = {
        **SD35M,
        "num_layers": args.layers,
        "dual_attention_layers": tuple(range(min(13, args.layers))),
        "num_attention_heads": args.heads,
        "caption_projection_dim": args.heads * SD35M["attention_head_dim"],
        "pos_embed_max_size": args.pos_embed_max_size,
    }
    torch.manual_seed(0)
    with device:  # initialised where it runs: a CPU init of 2.5 B random weights takes longer than an iteration
        transformer = SD3Transformer2DModel(**arch)
    # mypy cannot resolve diffusers' model classes' mixin bases, so it does not see them as the nn.Modules they are
    return cast(torch.nn.Module, transformer)


def iteration_arguments(config: TrainConfig, transformer: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`~vgrpo.training.iteration.train_iteration` but ``iteration``: the LoRA-wrapped
    policy, its algorithm and optimizer, random text conditioning of SD3's width and a reward on the latents."""
    latent = args.resolution // 8
    assert config.lora is not None
    add_lora(transformer, rank=config.lora.rank, alpha=config.lora.alpha, target_modules=config.lora.target_modules)
    policy = apply_precision_config(SD3Velocity(transformer), transformer, config.precision)
    latent_shape = (16, latent, latent)
    algorithm = build_algorithm(config, policy=policy, latent_shape=latent_shape)
    optimizer = build_optimizer(policy, config.optim)
    g = torch.Generator().manual_seed(1)
    cond = Conditioning(
        prompt_embeds=torch.randn(args.prompts, args.text_tokens, 4096, generator=g),
        pooled_prompt_embeds=torch.randn(args.prompts, 2048, generator=g),
    )

    def reward_fn(samples: torch.Tensor, prompts: Any) -> dict[str, torch.Tensor]:
        return {"latent_mean": samples.float().mean(dim=(1, 2, 3)).cpu()}

    return {
        "policy": policy,
        "algorithm": algorithm,
        "optimizer": optimizer,
        "reward_fn": reward_fn,
        "prompts": [f"p{i}" for i in range(args.prompts)],
        "cond": cond,
        "config": config,
        "latent_shape": latent_shape,
        "generator": torch.Generator().manual_seed(0),
    }


def timed_iterations(
    iteration_kwargs: dict[str, Any], iterations: int, device: torch.device
) -> tuple[list[dict[str, float]], dict[str, int]]:
    """A warm-up iteration with its FLOPs counted per phase, then ``iterations`` timed ones: their metrics with
    ``wall_s``, and the warm-up's FLOPs. The CUDA allocator's peak is reset after the warm-up."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    _, flops = counted_iteration(**iteration_kwargs, iteration=0)  # the warm-up, with its FLOPs counted per phase
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rows: list[dict[str, float]] = []
    for it in range(1, iterations + 1):
        sync()
        t0 = time.perf_counter()
        record = train_iteration(**iteration_kwargs, iteration=it)
        sync()
        rows.append({**record.metrics, "wall_s": time.perf_counter() - t0})
    return rows, flops


def summary(
    rows: list[dict[str, float]],
    flops: dict[str, int],
    transformer: torch.nn.Module,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    """The timed iterations' medians per phase (:func:`~benchmarks.roofline.summarize`), the median wall time,
    NFE per sample, images per second, the transformer's parameters (millions) and the peak memory in GB."""
    out: dict[str, Any] = summarize(rows, flops)
    out["wall_s"] = statistics.median(r["wall_s"] for r in rows)
    out["nfe_per_sample"] = rows[0]["nfe/rollout_per_sample"]
    out["images_per_s"] = args.prompts * args.group / out["wall_s"]
    out["params_m"] = sum(p.numel() for p in transformer.parameters()) / 1e6
    if device.type == "cuda":
        out["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
    else:
        out["peak_mem_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=24, help="first N of SD3.5-M's 24 blocks")
    parser.add_argument("--heads", type=int, default=24, help="attention heads of 64 channels (SD3.5-M: 24)")
    parser.add_argument("--pos-embed-max-size", type=int, default=384, help="position-embedding grid (SD3.5-M: 384)")
    parser.add_argument("--resolution", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=1, help="prompts per device per iteration")
    parser.add_argument("--group", type=int, default=24)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--text-tokens", type=int, default=333)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--merged-lora", action="store_true", help="no-grad forwards through merged LoRA (precision.merged_lora)"
    )
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=COMPARED,
        default=list(METHODS),
        help="methods to run (default: 4)",
    )
    parser.add_argument("--timeout", type=float, help="seconds each method's process may run (default: no limit)")
    parser.add_argument("--method", choices=COMPARED, help="run one method in this process (internal)")
    args = parser.parse_args()
    if args.method:
        print(json.dumps(run_one(args.method, args)))
        return
    print(
        f"SD3.5-M architecture, {args.layers}/24 layers, {args.heads}/24 heads, {args.resolution} px, "
        f"{args.prompts} prompt(s) x group {args.group}, {args.steps} steps, {args.text_tokens} text tokens, "
        f"{args.precision}, checkpointing {'on' if args.gradient_checkpointing else 'off'}, "
        f"LoRA {'merged' if args.merged_lora else 'factored'} in no-grad forwards, {args.device}, "
        f"median of {args.iterations} iterations"
    )
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    ceiling = ceilings(args.device)
    peak = ceiling[args.precision]
    print(f"matmul ceiling measured now: fp32 {ceiling['fp32']:.0f} GFLOP/s, bf16 {ceiling['bf16']:.0f} GFLOP/s")
    header = ("wall s", "rollout", "prepare", "update", "img/s", "NFE", "peak GB", "TFLOP", "of peak")
    print(f"{'method':>10} " + " ".join(f"{c:>8}" for c in header))
    results: dict[str, Any] = {}
    skip = ("json", "method", "methods", "timeout")
    passthrough = [  # store_true flags by name when set, the rest as --name=value
        f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}"
        for k, v in vars(args).items()
        if k not in skip and v is not False
    ]
    for method in args.methods:
        cmd = [sys.executable, "-m", "benchmarks.sd35_arch", *passthrough, "--method", method]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            results[method] = {"error": f"timed out after {args.timeout:g} s"}
            print(f"{method:>10} {results[method]['error']}")
            continue
        if proc.returncode:
            last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
            results[method] = {"error": last}
            print(f"{method:>10} failed: {last}")
            continue
        r = json.loads(proc.stdout.splitlines()[-1])
        r["roofline"] = phase_table(r, peak)
        results[method] = r
        whole = r["roofline"]["iteration"]
        print(
            f"{method:>10} {r['wall_s']:8.2f} {r['time/rollout_s']:8.2f} {r['time/prepare_s']:8.2f} "
            f"{r['time/update_s']:8.2f} {r['images_per_s']:8.3f} {r['nfe_per_sample']:8.0f} {r['peak_mem_gb']:8.2f} "
            f"{whole['gflop'] / 1e3:8.2f} {whole['fraction']:8.1%}"
        )
    if args.json:
        record = {"args": vars(args), "ceilings": ceiling, "results": results}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
