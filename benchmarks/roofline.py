"""The machine's matrix-product ceiling and the share of it one training iteration reaches, per phase.

    python -m benchmarks.roofline                      # CPU: embedded base and SD3.5-M architecture, 3 methods
    python -m benchmarks.roofline --configs embedded --methods vgrpo --json /tmp/roofline.json

The ceiling is the best rate of a square ``torch.mm`` measured in the same run (fp32 and bf16; on a GPU bf16 at
8192, on the CPU fp32 and bf16 at 2048 and 4096). An iteration's model FLOPs are counted per phase (rollout,
reward, prepare, update) with :class:`benchmarks.flops.FlopSum` (FlopCounterMode's formulas) on its warm-up
iteration; the CPU's fused attention kernel, which the counter does not know, is counted with the same formula as
the GPU's (:func:`benchmarks.flops.register_cpu_attention_flops`). The timed iterations after it give the seconds,
so the rate of a phase is its FLOPs over its median seconds, and its share of the ceiling that rate over the ceiling
of the iteration's matmul precision (bf16 under bf16 autocast, else fp32).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import LABELS, ROOT, TIMED_METHODS
from benchmarks.common import METHODS as COMPARED
from benchmarks.flops import ceilings

PHASES = ("rollout", "reward", "prepare", "update")


def roofline(
    seconds: Mapping[str, float],
    flops: Mapping[str, int],
    ceiling_gflops: float,
    iteration_seconds: float | None = None,
) -> dict[str, dict[str, float]]:
    """Per phase and for the whole iteration: GFLOP, seconds, achieved GFLOP/s and its share of the ceiling. The
    iteration's seconds are ``iteration_seconds`` when given (the whole iteration, with what runs between the
    phases), else the phases' sum."""
    rows: dict[str, dict[str, float]] = {}
    for phase in (*PHASES, "iteration"):
        if phase == "iteration":
            f = sum(flops[p] for p in PHASES)
            s = iteration_seconds if iteration_seconds is not None else sum(seconds[p] for p in PHASES)
        else:
            f, s = flops[phase], seconds[phase]
        rate = f / s / 1e9 if s > 0 else 0.0
        rows[phase] = {"gflop": f / 1e9, "seconds": s, "gflops": rate, "fraction": rate / ceiling_gflops}
    return rows


def summarize(records: Sequence[Mapping[str, float]], flops: Mapping[str, int]) -> dict[str, Any]:
    """The timed iterations' median seconds per phase with the counted FLOPs (``flops/<phase>``)."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in records) for k in records[0] if k.startswith("time/")}
    out.update({f"flops/{p}": int(flops.get(p, 0)) for p in PHASES})
    return out


def median_repeat(repeats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One measurement from fresh-process repeats: the repeat with the median iteration time, with the range of
    the iteration times over all repeats (``time/total_s_min``, ``time/total_s_max``) and their count."""
    if len(repeats) == 1 or any("error" in r for r in repeats):
        return dict(repeats[0])
    ranked = sorted(repeats, key=lambda r: float(r["time/total_s"]))
    out = dict(ranked[(len(ranked) - 1) // 2])
    out.update(
        {
            "time/total_s_min": float(ranked[0]["time/total_s"]),
            "time/total_s_max": float(ranked[-1]["time/total_s"]),
            "repeats": len(ranked),
        }
    )
    return out


def phase_table(result: Mapping[str, Any], ceiling_gflops: float) -> dict[str, dict[str, float]]:
    """:func:`roofline` of one method's :func:`summarize` output."""
    seconds = {p: float(result[f"time/{p}_s"]) for p in PHASES}
    total = result.get("time/total_s")
    flops = {p: int(result[f"flops/{p}"]) for p in PHASES}
    return roofline(seconds, flops, ceiling_gflops, None if total is None else float(total))


def relative_costs(result: Mapping[str, Any], reference: Mapping[str, Any]) -> tuple[float, float]:
    """A method's iteration against the reference method's: the ratio of their seconds, and the ratio of each
    iteration in units of its own process's rollout (the rollout is the same work in every method, so a machine
    whose speed drifts between the processes cancels out of the second)."""
    raw = result["time/total_s"] / reference["time/total_s"]
    per_rollout = (result["time/total_s"] / result["time/rollout_s"]) / (
        reference["time/total_s"] / reference["time/rollout_s"]
    )
    return raw, per_rollout


def relative_cost_table(report: Mapping[str, Any], methods: list[str]) -> list[str]:
    """Markdown lines: each method's iteration against V-GRPO's per configuration (:func:`relative_costs`), or
    none when V-GRPO or another method was not run."""
    others = [m for m in methods if m != "vgrpo"]
    if "vgrpo" not in methods or not others:
        return []
    lines = [
        "Each method's iteration against V-GRPO's: the ratio of the seconds above, and in brackets the ratio of each "
        "iteration in units of its own rollout (the same work in every method, so drift of the machine between "
        "processes cancels out).",
        "",
        "| configuration | " + " | ".join(f"{LABELS[m]} / V-GRPO" for m in others) + " |",
        "|---|" + "---:|" * len(others),
    ]
    for name, config in report["configs"].items():
        results = config["results"]
        reference = results.get("vgrpo", {"error": "not run"})
        cells = []
        for method in others:
            result = results.get(method, {"error": "not run"})
            if "error" in result or "error" in reference:
                cells.append("failed")
                continue
            raw, per_rollout = relative_costs(result, reference)
            cells.append(f"{raw:.2f}x ({per_rollout:.2f}x)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def markdown(report: Mapping[str, Any]) -> str:
    """The roofline tables: one per configuration, a row per method and phase."""
    c = report["ceilings"]
    lines = [
        f"Ceilings measured in this run ({report['device']}, {report['threads']} threads): "
        f"fp32 {c['fp32']:.0f} GFLOP/s, bf16 {c['bf16']:.0f} GFLOP/s (best square `torch.mm`). "
        f"T = {report.get('steps', 10)} sampling steps; each cell the median of {report.get('repeats', 1)} fresh "
        "process(es) [range], its share of the ceiling of its precision, and its speed-up over the default.",
        "",
    ]
    methods = list(next(iter(report["configs"].values()))["results"]) if report["configs"] else []
    lines += [
        "| configuration | " + " | ".join(f"{LABELS[m]} s/iteration (of ceiling)" for m in methods) + " |",
        "|---|" + "---:|" * len(methods),
    ]
    for name, config in report["configs"].items():
        cells = []
        for method in methods:
            result = config["results"].get(method, {"error": "not run"})
            if "error" in result:
                cells.append("failed")
                continue
            whole = phase_table(result, c[config["precision"]])["iteration"]
            base = report["configs"].get(name.split("+")[0], {})
            base_result = base.get("results", {}).get(method, {})
            speedup = ""
            if "+" in name and base_result and "error" not in base_result:
                base_seconds = phase_table(base_result, c[base["precision"]])["iteration"]["seconds"]
                speedup = f", {base_seconds / whole['seconds']:.2f}x"
            spread = ""
            if "time/total_s_min" in result:
                spread = f" [{result['time/total_s_min']:.2f}-{result['time/total_s_max']:.2f}]"
            cells.append(f"{whole['seconds']:.2f}{spread} ({whole['fraction']:.0%}{speedup})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += relative_cost_table(report, methods)
    for name, config in report["configs"].items():
        lines += [
            f"### {name}: {config['description']}",
            "",
            "| method | phase | GFLOP | s | GFLOP/s | of ceiling |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for method, result in config["results"].items():
            if "error" in result:
                lines.append(f"| {LABELS[method]} | {result['error']} | | | | |")
                continue
            for phase, row in phase_table(result, c[config["precision"]]).items():
                lines.append(
                    f"| {LABELS[method]} | {phase} | {row['gflop']:.1f} | {row['seconds']:.3f} | "
                    f"{row['gflops']:.1f} | {row['fraction']:.0%} |"
                )
        lines.append("")
    return "\n".join(lines)


CONFIGS: dict[str, dict[str, Any]] = {
    "embedded": {
        "description": "embedded base, the grid's stage config, 8 prompts x 8, LoRA r 32, fp32",
        "precision": "fp32",
        "command": [
            "benchmarks.step_time",
            "--pipeline=models/embedded-base",
            "--grid",
            "--prompts=8",
            "--group=8",
        ],
    },
    "sd35_arch": {
        "description": "SD3.5-M architecture, 2 of 24 blocks, 128 px, 1 prompt x 2, 77 text tokens, fp32",
        "precision": "fp32",
        "command": [
            "benchmarks.sd35_arch",
            "--device=cpu",
            "--layers=2",
            "--resolution=128",
            "--group=2",
            "--text-tokens=77",
            "--precision=fp32",
        ],
    },
}


BF16_BASE = {"autocast": "bf16", "lora_base_dtype": "bf16"}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "merged_lora": {"merged_lora": True},
    "compile": {"compile": True},
    "compile_gelu": {"compile": True, "gelu": "sigmoid"},
    "compile_gelu_merged": {"compile": True, "gelu": "sigmoid", "merged_lora": True},
    "bf16": {"autocast": "bf16"},
    "bf16_base": BF16_BASE,
    "bf16_base_math": {**BF16_BASE, "attention": "math"},
    "fast": {**BF16_BASE, "attention": "math", "compile": True, "gelu": "sigmoid"},
}
"""The levers measured side by side on the embedded base (``precision`` settings; ``default`` is the shipped one):
``bf16`` autocasts over float32 weights (a cast of every weight in every call), ``bf16_base`` keeps the frozen base
in bf16 (the LoRA in float32), ``_math`` restricts attention to the unfused kernel (the CPU's bf16 flash backward is
slow), ``compile_gelu`` adds the sigmoid form of GELU to ``torch.compile`` (``_merged``: and the merged LoRA, the
fastest fp32 setting), ``fast`` is all of the bf16 ones."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument(
        "--methods", nargs="+", choices=COMPARED, default=[*TIMED_METHODS, "diffusion_nft"], help="methods measured"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=["default"],
        help="precision settings measured side by side on the embedded base",
    )
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations after the counted warm-up")
    parser.add_argument("--steps", type=int, default=10, help="sampling steps T")
    parser.add_argument(
        "--repeats", type=int, default=1, help="fresh processes per measurement (the median is reported, the range too)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {
        "steps": args.steps,
        "repeats": args.repeats,
        "command": " ".join(["python -m benchmarks.roofline", *(argv if argv is not None else sys.argv[1:])]),
        "device": "cpu",
        "threads": args.threads,
        "ceilings": ceilings("cpu"),
        "configs": {},
    }
    runs = [(name, "default") for name in args.configs if name != "embedded"]
    runs += [("embedded", v) for v in args.variants if "embedded" in args.configs]
    for name, variant in runs:
        spec = CONFIGS[name]
        extra = [f"--precision={json.dumps(VARIANTS[variant])}"] if variant != "default" else []
        results: dict[str, Any] = {}
        for method in args.methods:
            cmd = [sys.executable, "-m", *spec["command"], *extra, f"--iterations={args.iterations}"]
            cmd += [f"--steps={args.steps}", f"--method={method}"]
            if VARIANTS[variant].get("compile"):  # its graphs built (two iterations) before the timed ones
                cmd.append("--warmup=2")
            repeats = []
            for _ in range(args.repeats):
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                if proc.returncode:
                    tail = proc.stderr.strip().splitlines()
                    repeats = [{"error": tail[-1] if tail else f"exit {proc.returncode}"}]
                    break
                repeats.append(json.loads(proc.stdout.splitlines()[-1]))
            results[method] = median_repeat(repeats)
        key = name if variant == "default" else f"{name}+{variant}"
        precision = "bf16" if VARIANTS[variant].get("autocast") == "bf16" else spec["precision"]
        description = spec["description"] + ("" if variant == "default" else f"; precision {VARIANTS[variant]}")
        report["configs"][key] = {"description": description, "precision": precision, "results": results}
    at_end = ceilings("cpu")
    report["ceilings_start_end"] = [dict(report["ceilings"]), at_end]
    report["ceilings"] = {k: max(report["ceilings"][k], at_end[k]) for k in at_end}
    text = markdown(report)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
