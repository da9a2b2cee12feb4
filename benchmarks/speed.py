"""Seconds per iteration and peak memory of V-GRPO, Flow-GRPO and MixGRPO against the number of sampling steps
T, on the embedded base and at the SD3.5-Medium transformer architecture (CPU scale).

    python -m benchmarks.speed                      # T = 10, 20, 40 -> docs/benchmarks/speed.md and speed.json
    python -m benchmarks.speed --steps 10 --out /tmp/speed

Each measurement is a separate process (:mod:`step_time` on ``models/embedded-base`` with the world GenEval
reward, 8 prompts x 8 samples; :mod:`sd35_arch` with SD3.5-M's blocks, LoRA r 32 and a latent reward), each
method with its own recipe (params/algorithms). Run nothing else alongside: the numbers are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import LABELS, ROOT, TIMED_METHODS, flags

METHODS = TIMED_METHODS
SD35_SCALE = flags(device="cpu", layers=2, resolution=128, group=2, text_tokens=77, precision="fp32", iterations=1)


def measure(steps: int, out: Path, embedded_iterations: int) -> dict[str, Any]:
    """Both measurements at ``steps`` sampling steps (cached in ``out``: a killed run resumes)."""
    result: dict[str, Any] = {}
    for name, cmd in (
        (
            "embedded",
            [
                sys.executable,
                "-m",
                "benchmarks.step_time",
                "--pipeline",
                "models/embedded-base",
                "--prompts",
                "8",
                "--group",
                "8",
                "--steps",
                str(steps),
                "--iterations",
                str(embedded_iterations),
                "--only",
                *METHODS,
            ],
        ),
        ("sd35_arch", [sys.executable, "-m", "benchmarks.sd35_arch", *SD35_SCALE, "--steps", str(steps)]),
    ):
        path = out / f"{name}-T{steps}.json"
        if not path.is_file():
            t0 = time.perf_counter()
            subprocess.run([*cmd, "--json", str(path)], cwd=ROOT, check=True)
            print(f"{name} T={steps}: {time.perf_counter() - t0:.0f} s", flush=True)
        result[name] = json.loads(path.read_text())
    return result


def table(results: dict[int, dict[str, Any]]) -> list[str]:
    lines = [
        "# Speed and memory against the number of sampling steps",
        "",
        "Produced by `python -m benchmarks.speed` on 2 CPU cores, one process per cell, nothing else running. "
        "Each method with its own recipe: V-GRPO one gradient step on N_MC 4 timestep-noise pairs after an "
        "ODE rollout; Flow-GRPO an SDE rollout and two gradient steps over 0.99 of the steps; MixGRPO SDE "
        "and training in a 4-step window.",
        "",
        "## Embedded base (8 prompts x 8 samples, LoRA r 32, world GenEval reward)",
        "",
        "| T | method | s/iteration | rollout | reward | prepare | update | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for steps, r in sorted(results.items()):
        for m in METHODS:
            x = r["embedded"]["results"][m]
            lines.append(
                f"| {steps} | {LABELS[m]} | {x['time/total_s']:.2f} | {x['time/rollout_s']:.2f} | "
                f"{x['time/reward_s']:.2f} | {x['time/prepare_s']:.2f} | {x['time/update_s']:.2f} | "
                f"{x['peak_rss_mb']:.0f} |"
            )
    args = next(iter(results.values()))["sd35_arch"]["args"]
    lines += [
        "",
        f"## SD3.5-M transformer architecture ({args['layers']} of 24 blocks, {args['resolution']} px, "
        f"1 prompt x {args['group']}, {args['text_tokens']} text tokens, fp32, CPU)",
        "",
        "| T | method | s/iteration | rollout | prepare | update | peak RSS GB | params (M) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for steps, r in sorted(results.items()):
        for m in METHODS:
            x = r["sd35_arch"]["results"].get(m)
            if x is None or "error" in x:
                lines.append(f"| {steps} | {LABELS[m]} | failed | | | | | |")
                continue
            lines.append(
                f"| {steps} | {LABELS[m]} | {x['wall_s']:.2f} | {x['time/rollout_s']:.2f} | "
                f"{x['time/prepare_s']:.2f} | {x['time/update_s']:.2f} | {x['peak_mem_gb']:.2f} | "
                f"{x['params_m']:.0f} |"
            )
    lines += ["", "## Update time relative to the smallest T", ""]
    lo = min(results)
    for where, key in (("embedded", "time/update_s"), ("sd35_arch", "time/update_s")):
        parts = []
        for m in METHODS:
            base = results[lo][where]["results"].get(m, {}).get(key)
            ratios = [results[t][where]["results"].get(m, {}).get(key) for t in sorted(results)]
            if base and all(ratios):
                parts.append(f"{LABELS[m]} " + " / ".join(f"{v / base:.2f}" for v in ratios))
        lines.append(f"- {where}, T = {' / '.join(str(t) for t in sorted(results))}: " + "; ".join(parts))
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--embedded-iterations", type=int, default=2, help="timed iterations (after a warm-up)")
    args = parser.parse_args()
    raw = args.out / "speed"
    raw.mkdir(parents=True, exist_ok=True)
    results = {t: measure(t, raw, args.embedded_iterations) for t in args.steps}
    (args.out / "speed.md").write_text("\n".join(table(results)))
    print(f"report: {args.out / 'speed.md'}")


if __name__ == "__main__":
    main()
