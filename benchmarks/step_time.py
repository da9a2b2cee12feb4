"""Seconds per training iteration of V-GRPO and each baseline on the tiny random SD3 transformer, or on a
pipeline (the embedded base) with its LoRA and the world GenEval reward.

    python -m benchmarks.step_time [--iterations 5] [--prompts 4] [--group 8] [--steps 10]
    python -m benchmarks.step_time --pipeline models/embedded-base --prompts 8 --group 8 --steps 10 --method vgrpo

Same batch, model and seed for every method; each method uses its params/algorithms preset on top of
params/base.yaml. Prints the median seconds per iteration split into rollout / reward / prepare /
update, and peak resident memory of a separate process per method (the update dominates it).
Run nothing else alongside a timing.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks.common import METHODS as COMPARED
from benchmarks.common import ROOT
from benchmarks.flops import counted_iteration
from benchmarks.roofline import summarize
from vgrpo.algorithms import build_algorithm
from vgrpo.config import TrainConfig, load_config, merge_overrides
from vgrpo.demo import tiny_iteration_inputs
from vgrpo.images import tensor_to_images
from vgrpo.models import add_lora
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.precision import WEIGHT_DTYPES, apply_precision_config, frozen_dtype
from vgrpo.rewards import build_reward
from vgrpo.training.iteration import train_iteration
from vgrpo.training.optim import build_optimizer
from vgrpo.world import GENEVAL_TAGS, read_jsonl

# V-GRPO's update also without its two passes, and with the choice made from the memory it measures (half of what
# the machine has available).
METHODS = (COMPARED[0], "vgrpo_full_graph", "vgrpo_auto", *COMPARED[1:])
UPDATE_PATHS = {"vgrpo_full_graph": False, "vgrpo_auto": "auto"}


def algorithm_of(method: str) -> tuple[str, dict[str, object]]:
    """The params preset a timed method loads and its algorithm section: a V-GRPO update path is V-GRPO's preset
    with the same objective's graphs all alive at once, or kept as measured (``memory_bounded``)."""
    if method in UPDATE_PATHS:
        return "vgrpo", {"name": "vgrpo", "memory_bounded": UPDATE_PATHS[method]}
    return method, {"name": method}


def run_one(method: str, args: argparse.Namespace) -> dict[str, float]:
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    if args.pipeline:
        return run_pipeline(method, args)
    preset, algorithm_overrides = algorithm_of(method)
    if method == "mixgrpo":
        algorithm_overrides["window_size"] = min(4, args.steps)
    config = load_config(
        [ROOT / "params" / "base.yaml", ROOT / "params" / "algorithms" / f"{preset}.yaml"],
        {
            "rollout": {"prompts_per_iteration": args.prompts, "group_size": args.group, "num_steps": args.steps},
            "algorithm": algorithm_overrides,
            "lora": {"rank": 8, "alpha": 16},
        },
    )
    prompts = [f"prompt {i}" for i in range(args.prompts)]
    return _timed(args.iterations, **tiny_iteration_inputs(config, prompts, num_layers=args.layers))


def _timed(iterations: int, warmup: int = 0, **iteration: Any) -> dict[str, float]:
    """Iteration 0 warms up with its FLOPs counted per phase (:func:`benchmarks.flops.counted_iteration`);
    ``iterations`` more are timed. Returns their median seconds per phase, the FLOPs, gradient steps and this
    process's peak RSS."""
    # A FLOP counter (a dispatch mode) active at a compiled model's first call leaves it uncompiled for good (dynamo
    # skips the frame): the counted iteration runs eagerly, the same operators, before anything compiles.
    with torch.compiler.set_stance("force_eager"):
        _, flops = counted_iteration(**iteration, iteration=0)
    for it in range(1, warmup + 1):  # compiled: the graphs of every batch size and grad mode built before timing
        train_iteration(**iteration, iteration=it)
    rows = [train_iteration(**iteration, iteration=it).metrics for it in range(warmup + 1, warmup + iterations + 1)]
    out = summarize(rows, flops)
    out["gradient_steps"] = rows[0]["gradient_steps"]
    # memory_bounded: auto's choice, as the update logged it
    out.update({k.removeprefix("train/"): v for k, v in rows[0].items() if k.startswith("train/update/")})
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run_pipeline(method: str, args: argparse.Namespace) -> dict[str, float]:
    """:func:`pipeline_iteration`, timed."""
    return _timed(args.iterations, args.warmup, **pipeline_iteration(method, args))


def pipeline_iteration(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`vgrpo.training.iteration.train_iteration` for ``method`` on
    ``args.pipeline`` as the embedded stages train it: params/models/embedded.yaml (LoRA r 32; with ``args.grid``
    the comparison grid's stage config), ``args.precision`` (JSON) on top, the world's GenEval train prompts, and
    the world GenEval reward on decoded samples."""
    preset, algorithm = algorithm_of(method)
    rollout = {"prompts_per_iteration": args.prompts, "group_size": args.group, "num_steps": args.steps}
    precision = json.loads(args.precision) if args.precision else {}
    if args.grid:  # the comparison grid's stage config for the method (benchmarks.compare.plan), at this T and batch
        from benchmarks.compare.plan import RunSpec, Sizes, stage_config

        grid_config = stage_config(RunSpec("methods", preset), Sizes(), ROOT / "data/world/test.jsonl")
        config: TrainConfig = load_config(
            [],
            merge_overrides(
                grid_config.model_dump(mode="json"),
                {"rollout": rollout, "algorithm": algorithm, "precision": precision},
            ),
            schema=type(grid_config),
        )
    else:
        # The model file's training sections (its pipeline and evaluation keys belong to a stage, not a run).
        model = yaml.safe_load((ROOT / "params" / "models" / "embedded.yaml").read_text())
        model = {k: v for k, v in model.items() if k in ("rollout", "optim", "lora", "precision")}
        config = load_config(
            [ROOT / "params" / "base.yaml", ROOT / "params" / "algorithms" / f"{preset}.yaml"],
            merge_overrides(model, {"rollout": rollout, "algorithm": algorithm, "precision": precision}),
        )
    pipe = load_pipeline(
        args.pipeline,
        dtype=WEIGHT_DTYPES[config.precision.lora_base_dtype],
        frozen_dtype=frozen_dtype(config.precision.frozen_dtype, "cpu"),
    )
    assert config.lora is not None
    add_lora(
        pipe.transformer, rank=config.lora.rank, alpha=config.lora.alpha, target_modules=config.lora.target_modules
    )
    adapter, policy = build_adapter(pipe, precision=config.precision)
    policy = apply_precision_config(policy, pipe.transformer, config.precision)
    rows = [r for r in read_jsonl(ROOT / "data/world/train.jsonl") if r["tag"] in GENEVAL_TAGS][: args.prompts]
    prompts = [str(r["prompt"]) for r in rows]
    expanded = [r for r in rows for _ in range(args.group)]
    geneval = build_reward("geneval")

    def reward_fn(samples: torch.Tensor, sample_prompts: list[str]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            images = tensor_to_images(adapter.decode(samples))
        return {"geneval": torch.as_tensor(geneval(images, sample_prompts, expanded).scores).float()}

    built = build_algorithm(config, policy=policy, latent_shape=adapter.latent_shape)
    optimizer = build_optimizer(policy, config.optim)
    generator = torch.Generator().manual_seed(0)
    cond = adapter.encode_prompts(prompts)
    return {
        "policy": policy,
        "algorithm": built,
        "optimizer": optimizer,
        "reward_fn": reward_fn,
        "prompts": prompts,
        "cond": cond,
        "config": config,
        "latent_shape": adapter.latent_shape,
        "generator": generator,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=0, help="untimed iterations after the counted warm-up (compiled models)"
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--pipeline", help="time on this pipeline (LoRA, world GenEval reward) instead of tiny SD3")
    parser.add_argument(
        "--grid", action="store_true", help="with --pipeline: the comparison grid's stage config for each method"
    )
    parser.add_argument(
        "--precision", help="with --pipeline: JSON for the precision section, e.g. '{\"merged_lora\": true}'"
    )
    parser.add_argument("--method", choices=METHODS, help="run one method in this process (internal)")
    parser.add_argument("--only", nargs="+", choices=METHODS, default=list(METHODS), help="methods to time")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.method:
        print(json.dumps(run_one(args.method, args)))
        return
    model = args.pipeline or f"tiny SD3 ({args.layers} layers)"
    print(
        f"batch {args.prompts} prompts x {args.group}, {args.steps} steps, {model}, median of {args.iterations} "
        "iterations"
    )
    columns = ("total s", "rollout", "reward", "prepare", "update")
    print(f"{'method':>16} " + " ".join(f"{c:>8}" for c in columns) + f" {'steps':>5} {'RSS MB':>7}")
    results = {}
    for method in args.only:
        cmd = [sys.executable, "-m", "benchmarks.step_time", "--method", method] + [
            f"--{k}={getattr(args, k)}" for k in ("iterations", "warmup", "prompts", "group", "steps", "layers")
        ]
        if args.pipeline:
            cmd.append(f"--pipeline={args.pipeline}")
        if args.grid:
            cmd.append("--grid")
        if args.precision:
            cmd.append(f"--precision={args.precision}")
        result = json.loads(
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
        )
        times = " ".join(f"{result[f'time/{k}_s']:8.3f}" for k in ("total", "rollout", "reward", "prepare", "update"))
        choice = ""
        if "update/full_graph" in result:
            path = "full graph" if result["update/full_graph"] else "two passes"
            choice = (
                f"  {path}: one graph {result['update/graph_mb']:.0f} MB, all {result['update/full_graph_mb']:.0f} "
                f"MB, budget {result['update/budget_mb']:.0f} MB"
            )
        print(f"{method:>16} {times} {int(result['gradient_steps']):5d} {result['peak_rss_mb']:7.0f}{choice}")
        results[method] = result
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
