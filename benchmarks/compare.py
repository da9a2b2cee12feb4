"""V-GRPO against naive ELBO-GRPO, Flow-GRPO, MixGRPO and DiffusionNFT, and the paper's ablations, side by side
on the embedded base: same model, prompts, rewards, seeds and rollout budget (prompts x group x iterations).

    python benchmarks/compare.py --quick        # under 15 min: GenEval reward, one seed, each method's own lr
    python benchmarks/compare.py                # the full grid (resumable; run it again to continue)
    python benchmarks/compare.py --report-only  # rewrite the report from the runs already done

Each run is one subprocess training one stage (:func:`vgrpo.stage.run_stage`) from ``models/embedded-base`` with
``params/base.yaml`` + ``params/models/embedded.yaml`` + the reward's stage file + the method's
``params/algorithms`` preset + the bench's overrides (below). Every ``--eval-every`` iterations the held-out
reward is measured on the first ``--eval-prompts`` test prompts (fixed seeds, ODE sampling). A run records its
curve against training wall time (evaluation excluded), gradient steps and model evaluations (NFE: every
transformer row in training, counted by a hook), its per-iteration time split, the process's peak memory and
the surrogate CV statistics. Results go to ``--out`` as one JSON per run, written atomically; the report
(``docs/benchmarks.md`` and PNGs) is made by :mod:`benchmarks.report`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("vgrpo", "naive_elbo", "flow_grpo", "mixgrpo", "diffusion_nft")

# The two reward settings: the GenEval stage's world GenEval reward (shaped as the shipped stage trains it) and
# the preference stage's mix of world PickScore and world CLIPScore. The held-out number is the first metric.
REWARDS: dict[str, dict[str, Any]] = {
    "geneval": {
        "stage": "params/stages/embedded/2-geneval.yaml",
        "eval_rewards": [{"name": "geneval"}],
        "held_out": {
            "geneval_partial": ("geneval", "geneval_partial"),
            "geneval_strict": ("geneval", "geneval_strict"),
        },
    },
    "preference": {
        "stage": "params/stages/embedded/1-preference.yaml",
        "eval_rewards": [
            {"name": "pickscore", "key": "world_pickscore", "options": {"path": "models/world-pickscore"}},
            {"name": "clipscore", "key": "world_clipscore", "options": {"path": "models/world-clip"}},
        ],
        "held_out": {"world_pickscore": ("world_pickscore", "mean"), "world_clipscore": ("world_clipscore", "mean")},
    },
}

# Each method's own recipe (its params/algorithms preset) scaled to this model: the same rollout (10 Euler/SDE
# steps), N_MC 4 for the ELBO methods (the paper's default), MixGRPO's window moved every 2 iterations so that it
# sweeps the 10 steps within a short run. The base learning rate is the embedded stage's (3e-4 GenEval, 5e-4
# preference: the paper's LoRA rate, which Flow-GRPO and DiffusionNFT also use with LoRA); the sweep multiplies it.
METHOD_OVERRIDES: dict[str, dict[str, Any]] = {
    "vgrpo": {"algorithm": {"n_mc": 4}},
    "naive_elbo": {"algorithm": {"n_mc": 4}},
    "flow_grpo": {},
    "mixgrpo": {"algorithm": {"shift_interval": 2}},
    "diffusion_nft": {},
}

# The paper's ablation grid on V-GRPO (GenEval reward): each technique off, N_MC, and the step-control regimes.
ABLATIONS: dict[str, dict[str, Any]] = {
    "no_shared_pairs": {"algorithm": {"share": "none"}},
    "no_stratified": {"algorithm": {"timestep_sampling": "uniform"}},
    "v_prediction": {"algorithm": {"prediction": "v"}},
    "eps_prediction": {"algorithm": {"prediction": "eps"}},
    "no_self_normalization": {"algorithm": {"self_normalize": False}},
    "n_mc_2": {"algorithm": {"n_mc": 2}},
    "n_mc_8": {"algorithm": {"n_mc": 8}},
    "one_step_clip": {"algorithm": {"clip_range": 1e-2}, "advantage": {"soft_clip_eta": None}},
    "one_step_kl": {"algorithm": {"kl_coef": 0.3}, "advantage": {"soft_clip_eta": None}},
    "one_step_soft_clip": {},  # the reference: soft-clip eta 3, no ratio clip, no KL
    "multi_step_clip": {
        "algorithm": {"clip_range": 1e-2},
        "advantage": {"soft_clip_eta": None},
        "optim": {"gradient_steps": 2, "minibatches": 2},
    },
    "multi_step_kl": {
        "algorithm": {"kl_coef": 0.3},
        "advantage": {"soft_clip_eta": None},
        "optim": {"gradient_steps": 2, "minibatches": 2},
    },
    "multi_step_soft_clip": {"optim": {"gradient_steps": 2, "minibatches": 2}},
}


@dataclass(frozen=True)
class RunSpec:
    """One training run of the grid."""

    group: str  # methods | lr_sweep | ablation
    method: str
    reward: str
    lr_scale: float = 1.0
    seed: int = 0
    variant: str = "default"
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.reward}-{self.method}-{self.variant}-lr{self.lr_scale:g}-s{self.seed}"


def plan(quick: bool) -> list[RunSpec]:
    """The runs, most informative first, so that a grid stopped early has the head-to-head comparison."""
    if quick:
        return [RunSpec("methods", m, "geneval") for m in METHODS]
    runs = [RunSpec("methods", m, "geneval", seed=s) for s in (0, 1, 2) for m in METHODS]
    runs += [RunSpec("lr_sweep", m, "geneval", lr_scale=k) for k in (0.5, 2.0) for m in METHODS]
    runs += [RunSpec("methods", m, "preference") for m in METHODS]
    runs += [RunSpec("ablation", "vgrpo", "geneval", variant=v, overrides=o) for v, o in ABLATIONS.items()]
    return runs


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def stage_config(spec: RunSpec, args: argparse.Namespace) -> Any:
    from vgrpo.config import StageConfig, load_config

    reward = REWARDS[spec.reward]
    files = [ROOT / "params/base.yaml", ROOT / "params/models/embedded.yaml", ROOT / reward["stage"],
             ROOT / "params/algorithms" / f"{spec.method}.yaml"]  # fmt: skip
    base_lr = load_config(files[:3], schema=StageConfig).optim.lr
    overrides: dict[str, Any] = {
        "name": spec.name, "seed": spec.seed, "iterations": args.iterations, "checkpoint_every": args.iterations,
        "eval_every": args.eval_every, "eval_prompts": "data/world/test.jsonl",
        "rollout": {"prompts_per_iteration": args.prompts, "group_size": args.group, "micro_batch_size": 64},
        "optim": {"lr": base_lr * spec.lr_scale, "micro_batch_size": 64},
        "evaluation": {"group_size": 2, "num_steps": 10, "max_prompts": args.eval_prompts, "seed": 0,
                       "rewards": reward["eval_rewards"]},
    }  # fmt: skip
    overrides = _merge(_merge(overrides, METHOD_OVERRIDES[spec.method]), spec.overrides)
    return load_config(files, overrides, schema=StageConfig)


def run_one(spec: RunSpec, args: argparse.Namespace) -> dict[str, Any]:
    """Train one run in this process and return its record (see the module docstring)."""
    import torch
    from diffusers import SD3Transformer2DModel

    from vgrpo.stage import run_stage

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    config = stage_config(spec, args)
    counted = {"rows": 0}
    forward = SD3Transformer2DModel.forward

    def counting_forward(self: Any, hidden_states: Any, *a: Any, **kw: Any) -> Any:
        counted["rows"] += int(hidden_states.shape[0])
        return forward(self, hidden_states, *a, **kw)

    SD3Transformer2DModel.forward = counting_forward  # type: ignore[method-assign]
    curve: list[dict[str, float]] = []
    clock = {"train_s": 0.0, "eval_rows": 0, "rows_at_log": 0, "steps": 0}
    per_iteration = float(config.optim.gradient_steps)

    def log(metrics: dict[str, float], iteration: int) -> None:
        clock["train_s"] += metrics.get("time/iteration_s", 0.0)
        clock["steps"] += per_iteration if not metrics.get("guard/skipped") else 0
        clock["rows_at_log"] = counted["rows"]

    def on_eval(table: dict[str, Any], images: Any, iteration: int) -> None:
        clock["eval_rows"] += counted["rows"] - clock["rows_at_log"]
        clock["rows_at_log"] = counted["rows"]
        held_out = {name: float(table["rewards"][key][field]) for name, (key, field)
                    in REWARDS[spec.reward]["held_out"].items()}  # fmt: skip
        curve.append({"iteration": float(iteration), "train_s": clock["train_s"], "gradient_steps": clock["steps"],
                      "nfe": float(counted["rows"] - clock["eval_rows"]), **held_out})  # fmt: skip

    work = Path(args.out) / "work" / spec.name
    started = time.perf_counter()
    result = run_stage(config, pipeline_dir=Path(config.pipeline), work_dir=work, out_dir=work / "adapter",
                       root=ROOT, log=log, on_eval=on_eval)  # fmt: skip
    history = [h for h in result.history if not h.get("guard/skipped")]
    mean = lambda key: sum(h[key] for h in history) / len(history) if history and key in history[0] else None  # noqa: E731
    return {
        "spec": asdict(spec), "name": spec.name, "curve": curve, "wall_s": time.perf_counter() - started,
        "iterations": config.iterations, "samples_per_iteration": config.rollout.prompts_per_iteration
        * config.rollout.group_size, "lr": config.optim.lr, "gradient_steps_per_iteration": per_iteration,
        "skipped_iterations": len(result.skipped),
        "time_split_s": {k: mean(f"time/{k}_s") for k in ("rollout", "reward", "prepare", "update", "total")},
        "surrogate_cv": mean("surrogate/cv"), "surrogate_cv_within_group": mean("surrogate/cv_within_group"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "train_reward_first": history[0].get("reward/total_mean") if history else None,
        "train_reward_last": history[-1].get("reward/total_mean") if history else None,
        "config": config.model_dump(mode="json"),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the under-15-minute subset (GenEval, one seed)")
    parser.add_argument("--out", default=None, help="results folder (default runs/bench/quick or runs/bench/full)")
    parser.add_argument("--iterations", type=int, default=None, help="per run (quick 10, full 16)")
    parser.add_argument("--eval-every", type=int, default=None, help="iterations (quick 5, full 4)")
    parser.add_argument("--eval-prompts", type=int, default=24, help="held-out test prompts (x 2 samples)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per iteration")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="run only these run names (or substrings)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--docs", default=None, help="report folder (default docs/benchmarks[-quick])")
    parser.add_argument("--run", help="(internal) run this spec JSON in this process")
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    args.iterations = args.iterations or (10 if args.quick else 16)
    args.out = args.out or str(ROOT / "runs" / "bench" / mode)
    args.eval_every = args.eval_every or (5 if args.quick else 4)
    if args.run:
        from vgrpo.atomic import write_json_atomic

        spec = RunSpec(**json.loads(args.run))
        record = run_one(spec, args)
        write_json_atomic(Path(args.out) / f"{spec.name}.json", record)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(args.quick)
    if args.only:
        runs = [r for r in runs if any(o in r.name for o in args.only)]
    started = time.perf_counter()
    if not args.report_only:
        for i, spec in enumerate(runs, 1):
            if (out / f"{spec.name}.json").is_file():
                continue  # done in an earlier invocation: the grid resumes
            t0 = time.perf_counter()
            cmd = [sys.executable, __file__, "--run", json.dumps(asdict(spec)), "--out", str(out),
                   "--iterations", str(args.iterations), "--eval-every", str(args.eval_every),
                   "--eval-prompts", str(args.eval_prompts), "--prompts", str(args.prompts),
                   "--group", str(args.group), "--threads", str(args.threads)]  # fmt: skip
            proc = subprocess.run(
                cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
            )
            status = "ok" if proc.returncode == 0 else f"FAILED ({proc.stderr.strip().splitlines()[-1:]})"
            print(f"[{i}/{len(runs)}] {spec.name}: {status} in {time.perf_counter() - t0:.0f} s", flush=True)
    from report import write_report  # benchmarks/report.py, beside this script

    docs = Path(args.docs) if args.docs else ROOT / "docs" / ("benchmarks-quick" if args.quick else "benchmarks")
    command = "python benchmarks/compare.py" + (" --quick" if args.quick else "")
    write_report(out, docs, command=command, grid_s=time.perf_counter() - started, planned=[r.name for r in runs])
    print(f"report: {docs / 'README.md'}")


if __name__ == "__main__":
    main()
