"""The one-GPU check of the GPU path (``scripts/gpu_check.sh`` runs it after installing any missing wheels): the
``gpu``-marked tests, ``benchmarks/sd35_arch.py`` at the paper's scale (512 px, group 24, 40 steps, bf16; V-GRPO,
Flow-GRPO, MixGRPO and DiffusionNFT: seconds per iteration, images per second, share of the measured bf16 peak) and
one short embedded stage on the GPU, within a time budget (10 minutes by default).

    python -m benchmarks.gpu_check --out runs/gpu_check            # on a CUDA machine
    python -m benchmarks.gpu_check --dry-run --out /tmp/gpu_check   # the same steps at tiny sizes on the CPU

Each step runs in its own process with what is left of the budget as its time limit, so a hung or slow step is
cut and reported, and the check still writes ``gpu_check.json`` and ``gpu_check.md`` (and the steps' output in
``gpu_check.log``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import ARCH_METHODS, LABELS, ROOT, flags
from benchmarks.timed_steps import Budget, Step, run_step
from vgrpo.world import make_splits, write_jsonl

STEPS = ("gpu_tests", "embedded_stage", "sd35_arch")
PACKAGES = ("torch", "transformers", "accelerate", "peft", "diffusers", "pydantic", "safetensors", "numpy")

# The paper's scale (V-GRPO App. A.2: 512 px, group 24, 40 steps, bf16) and a CPU scale that runs in seconds.
BENCHMARK_ARGS = {
    "gpu": flags(device="cuda", precision="bf16", resolution=512, group=24, steps=40, iterations=1),
    "dry-run": flags(
        device="cpu",
        precision="fp32",
        layers=2,
        heads=2,
        pos_embed_max_size=16,
        resolution=64,
        group=2,
        steps=4,
        text_tokens=16,
        micro_batch=2,
        iterations=1,
        threads=2,
    ),
}
# The embedded curriculum's first stage (params/stages/embedded/1-preference.yaml), cut to a few iterations.
STAGE_PARAMS = ["params/base.yaml", "params/models/embedded.yaml", "params/stages/embedded/1-preference.yaml"]
STAGE_SETTINGS = {
    "gpu": ["iterations=4", "checkpoint_every=4", "eval_every=4", "evaluation.max_prompts=32"],
    "dry-run": [
        "iterations=1",
        "checkpoint_every=1",
        "eval_every=1",
        "evaluation.max_prompts=2",
        "evaluation.group_size=1",
        "evaluation.num_steps=2",
        "rollout.prompts_per_iteration=2",
        "rollout.group_size=2",
        "rollout.num_steps=2",
        "algorithm.n_mc=2",
    ],
}
# The OCR reward needs rapidocr, which the check does not carry: the stage's evaluation scores the rest.
STAGE_EVAL_REWARDS = json.dumps(
    [
        {"name": "geneval"},
        {"name": "pickscore", "key": "world_pickscore", "options": {"path": "models/world-pickscore"}},
    ]
)


def gpu_test_files() -> list[str]:
    """Test files that hold ``gpu``-marked tests."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text())


def pytest_counts(output: str) -> dict[str, int]:
    """``{"passed": n, "failed": n, ...}`` from pytest's closing line."""
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", tail)}


def environment(mode: str) -> dict[str, Any]:
    """Python, package versions, and the GPU the check sees."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "mode": mode,
        "packages": versions,
        "wheels_installed": os.environ.get("VGRPO_WHEELS_INSTALLED", ""),
    }
    env["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {
            "name": props.name,
            "memory_gb": round(props.total_memory / 1e9, 1),
            "torch_cuda": torch.version.cuda,
        }
    return env


def benchmark(
    mode: str,
    budget: Budget,
    log: Path,
    env: dict[str, str],
    work: Path,
    methods: Sequence[str] = ARCH_METHODS,
    merged_lora: bool = False,
) -> Step:
    out = work / "sd35_arch.json"
    step = Step("sd35_arch")
    per_method = max(5.0, budget.left() / len(methods) - 5)
    step.command = [
        sys.executable,
        "-m",
        "benchmarks.sd35_arch",
        *BENCHMARK_ARGS[mode],
        "--methods",
        *methods,
        "--json",
        str(out),
        "--timeout",
        f"{per_method:.0f}",
        *(["--merged-lora"] if merged_lora else []),
    ]
    run_step(step, budget, log, env)
    if out.is_file():
        record = json.loads(out.read_text())
        step.details |= {"args": record["args"], "ceilings": record["ceilings"], "results": record["results"]}
        if step.status == "passed" and any("error" in r for r in record["results"].values()):
            step.status = "failed"
    return step


def embedded_stage(mode: str, budget: Budget, log: Path, env: dict[str, str], work: Path) -> Step:
    train, test = make_splits(0, 200, 40)
    write_jsonl(work / "train.jsonl", [md for md, _ in train])
    write_jsonl(work / "test.jsonl", [md for md, _ in test])
    metrics = work / "stage_metrics.json"
    settings = [
        *STAGE_SETTINGS[mode],
        f"prompts={work / 'train.jsonl'}",
        f"eval_prompts={work / 'test.jsonl'}",
        f"evaluation.rewards={STAGE_EVAL_REWARDS}",
    ]
    step = Step("embedded_stage")
    step.command = [
        sys.executable,
        "-m",
        "vgrpo.cli",
        "train",
        "--params",
        *STAGE_PARAMS,
        "--set",
        *settings,
        "--out",
        str(work / "stage-adapter"),
        "--work-dir",
        str(work / "stage-work"),
        "--metrics",
        str(metrics),
        "--root",
        str(ROOT),
        "--threads",
        "2" if mode == "dry-run" else "8",
    ]
    run_step(step, budget, log, env, cap=150)
    if metrics.is_file():
        record = json.loads(metrics.read_text())
        history = record.get("history", [])
        seconds = [h["time/iteration_s"] for h in history if "time/iteration_s" in h]
        step.details |= {
            "iterations": len(history),
            "seconds_per_iteration": round(sorted(seconds)[len(seconds) // 2], 3) if seconds else None,
            "final_evaluation": _rewards_of(record.get("evaluations", [])),
        }
    return step


def _rewards_of(evaluations: list[dict[str, Any]]) -> dict[str, float]:
    """The last evaluation's mean of each reward."""
    if not evaluations:
        return {}
    rewards = evaluations[-1].get("rewards", {})
    return {k: round(float(v["mean"]), 4) for k, v in rewards.items() if isinstance(v, dict) and "mean" in v}


def markdown(summary: dict[str, Any]) -> str:
    env, steps = summary["environment"], {s["name"]: s for s in summary["steps"]}
    gpu = env.get("gpu")
    device = f"GPU: {gpu['name']} ({gpu['memory_gb']} GB)." if gpu else "No GPU: a CPU dry run."
    lines = [
        f"# GPU check ({summary['mode']})",
        "",
        f"{device} Python {env['python']}; " + ", ".join(f"{k} {v}" for k, v in env["packages"].items()) + ".",
        f"Wall time {summary['wall_s']:.0f} s of a {summary['budget_s']:.0f} s budget.",
        "",
        "| step | status | seconds | details |",
        "|---|---|---:|---|",
    ]
    for s in summary["steps"]:
        brief = {
            k: v
            for k, v in s["details"].items()
            if k in ("counts", "reason", "returncode", "iterations", "seconds_per_iteration", "final_evaluation")
        }
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {json.dumps(brief)} |")
    bench = steps.get("sd35_arch", {}).get("details", {})
    if bench.get("results"):
        a, c = bench["args"], bench["ceilings"]
        lines += [
            "",
            f"## SD3.5-M architecture ({a['layers']}/24 blocks, {a['resolution']} px, "
            f"{a['prompts']} prompt x group {a['group']}, {a['steps']} steps, {a['precision']}, "
            f"{'LoRA merged for the no-grad forwards, ' if a.get('merged_lora') else ''}{a['device']})",
            "",
            f"Matmul ceiling measured in the same run: bf16 {c['bf16'] / 1e3:.0f} TFLOP/s, fp32 "
            f"{c['fp32'] / 1e3:.1f} TFLOP/s. Model FLOPs counted per phase (benchmarks.flops.FlopSum) on the warm-up "
            "iteration; the share is of the ceiling of the run's precision.",
            "",
            "| method | s/iteration | rollout s | prepare s | update s | images/s | peak memory GB | TFLOP/iteration "
            "| TFLOP/s | of peak | rollout | update |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for method, r in bench["results"].items():
            if "error" in r:
                lines.append(f"| {LABELS[method]} | {r['error']} |" + " |" * 10)
                continue
            roof = r["roofline"]
            lines.append(
                f"| {LABELS[method]} | {r['wall_s']:.2f} | {r['time/rollout_s']:.2f} | "
                f"{r['time/prepare_s']:.2f} | {r['time/update_s']:.2f} | {r['images_per_s']:.2f} | "
                f"{r['peak_mem_gb']:.2f} | {roof['iteration']['gflop'] / 1e3:.1f} | "
                f"{roof['iteration']['gflops'] / 1e3:.1f} | {roof['iteration']['fraction']:.0%} | "
                f"{roof['rollout']['fraction']:.0%} | {roof['update']['fraction']:.0%} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "runs" / "gpu_check"))
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (seconds per step)")
    parser.add_argument("--budget-s", type=float, default=570.0, help="seconds for all steps together")
    parser.add_argument(
        "--steps", nargs="+", choices=STEPS, default=list(STEPS), help="the steps to run, in this order (a rerun)"
    )
    parser.add_argument("--methods", nargs="+", choices=ARCH_METHODS, default=list(ARCH_METHODS))
    parser.add_argument(
        "--merged-lora", action="store_true", help="sd35_arch with the LoRA merged for its no-grad forwards"
    )
    args = parser.parse_args(argv)
    mode = "dry-run" if args.dry_run else "gpu"
    started, budget = time.monotonic(), Budget(args.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "gpu_check.log"
    log.write_text("")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if args.dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the same steps, on the CPU even where a GPU is visible
    summary: dict[str, Any] = {"mode": mode, "environment": environment(mode), "budget_s": args.budget_s}
    if mode == "gpu" and not summary["environment"]["cuda_available"]:
        print("gpu_check: no CUDA device is visible (use --dry-run on a CPU machine)", file=sys.stderr)
        return 2
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        work = Path(tmp)
        for name in args.steps:
            if name == "gpu_tests":
                tests = Step(
                    "gpu_tests",
                    [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *gpu_test_files()],
                )
                tests.details["counts"] = pytest_counts(run_step(tests, budget, log, env, cap=240))
                if mode == "gpu" and tests.details["counts"].get("skipped"):
                    tests.status = "failed"  # on a GPU no gpu-marked test may skip
                steps.append(tests)
            elif name == "embedded_stage":
                steps.append(embedded_stage(mode, budget, log, env, work))
            else:
                steps.append(benchmark(mode, budget, log, env, work, args.methods, args.merged_lora))
    summary["steps"] = [asdict(s) for s in steps]
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["passed"] = all(s.status == "passed" for s in steps)
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "gpu_check.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
