"""Where one training iteration's time goes, per phase: the share of matmuls, attention, elementwise work, norms,
copies and dispatch, each category's rate, and the rate the iteration's own matmul shapes reach alone.

    python -m benchmarks.profile                                   # V-GRPO on the embedded base, shipped settings
    python -m benchmarks.profile --method flow_grpo --precision '{"autocast": "bf16", "lora_base_dtype": "bf16"}'
    python -m benchmarks.profile --json /tmp/profile.json --markdown /tmp/profile.md

The iteration is :mod:`benchmarks.step_time`'s on ``--pipeline`` (the comparison grid's stage config, 8 prompts x 8,
T = 10). After ``--warmup`` iterations, ``--iterations`` run under ``torch.profiler``; each operator's self time
is attributed to the phase whose region encloses it (:data:`vgrpo.training.iteration.PHASE_LABEL`) and to a
category (:data:`CATEGORIES`). Dispatch is the phase's wall time that no operator's self time covers (Python,
autograd bookkeeping, the profiler's own cost) plus the view-like operators that move no data. Rates: matmuls and
convolutions in GFLOP/s (the profiler's FLOP counts), attention in GFLOP/s (the flash kernels' FLOPs, as
:mod:`benchmarks.flops` counts them; under ``attention: math`` its forward matmuls count as attention, its backward
ones as matmuls), the rest in GB/s of operands read and written.

The per-shape ceiling: every distinct matmul of the profiled iterations (operator, operand shapes and dtypes) is
timed alone on fresh contiguous operands in this process (the best of ``--shape-repeats``); the ceiling is the rate
at which the iteration's matmul FLOPs would run if each ran at its own shape's rate. Beside it the square
``torch.mm`` ceiling of :mod:`benchmarks.roofline`. The profiler's bookkeeping slows an iteration (a few percent):
the seconds here are for shares, :mod:`benchmarks.roofline` times the iteration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import METHODS as COMPARED
from benchmarks.flops import ceilings
from benchmarks.operator_categories import CATEGORIES, attention_flops, category, operand_bytes
from benchmarks.provenance import cpu_model
from benchmarks.shape_ceiling import per_shape_ceiling
from vgrpo.errors import ConfigError
from vgrpo.training.iteration import PHASE_LABEL, train_iteration

PHASES = tuple(PHASE_LABEL)
PHASE_OF_LABEL = {label: phase for phase, label in PHASE_LABEL.items()}


def _phase_of(event: Any) -> str | None:
    """The phase whose region encloses ``event`` (walking its CPU parents), or None."""
    node = event.cpu_parent
    while node is not None:
        if node.name in PHASE_OF_LABEL:
            return PHASE_OF_LABEL[node.name]
        node = node.cpu_parent
    return None


def attribute(events: Iterable[Any]) -> dict[str, Any]:
    """Per phase: wall microseconds (its regions' durations), and per category self microseconds, calls, FLOPs and
    bytes (FLOPs and bytes where the profiler recorded shapes); ``shapes``: the matmuls by (operator, shapes,
    dtypes) with their calls and FLOPs."""
    wall: dict[str, float] = defaultdict(float)
    table: dict[str, dict[str, dict[str, float]]] = {
        p: {c: {"us": 0.0, "calls": 0, "flops": 0, "bytes": 0} for c in CATEGORIES} for p in PHASES
    }
    shapes: dict[tuple[str, str, str], dict[str, float]] = defaultdict(lambda: {"calls": 0, "flops": 0})
    operators: dict[tuple[str, str], float] = defaultdict(float)
    for event in events:
        if event.name in PHASE_OF_LABEL:
            wall[PHASE_OF_LABEL[event.name]] += event.cpu_time_total
            continue
        phase = _phase_of(event)
        if phase is None:
            continue
        cat = category(event)
        cell = table[phase][cat]
        cell["us"] += event.self_cpu_time_total
        cell["calls"] += 1
        operators[(event.name, cat)] += event.self_cpu_time_total
        if not event.input_shapes:
            continue
        if cat in ("matmul", "convolution", "attention"):
            cell["flops"] += attention_flops(event) if cat == "attention" else int(event.flops or 0)
        elif cat not in ("dispatch", "compiled"):
            cell["bytes"] += operand_bytes(event)
        if cat == "matmul":
            key = (event.name, json.dumps(event.input_shapes), json.dumps(event.input_dtypes))
            shapes[key]["calls"] += 1
            shapes[key]["flops"] += int(event.flops or 0)
    for phase in PHASES:  # what no operator's self time covers is dispatch
        covered = sum(c["us"] for c in table[phase].values())
        table[phase]["dispatch"]["us"] += max(0.0, wall[phase] - covered)
    top = sorted(operators.items(), key=lambda kv: -kv[1])
    return {
        "wall_us": dict(wall),
        "table": table,
        "shapes": dict(shapes),
        "operators": [{"op": name, "category": cat, "us": us} for (name, cat), us in top],
    }


def summarize(
    timed: Mapping[str, Any], counted: Mapping[str, Any], iterations: int, ceiling: Mapping[str, Any]
) -> dict[str, Any]:
    """Per phase and for the iteration (the phases' sum): seconds per iteration under the profiler, and per category
    its share of them and its rate; the iteration's model rate (matmul, attention and convolution FLOPs over its
    seconds) against the per-shape ceiling. ``timed``: :func:`attribute` of ``iterations`` iterations profiled
    without shapes (the seconds); ``counted``: of one iteration profiled with shapes and FLOPs (the work)."""
    out: dict[str, Any] = {}
    for phase in (*PHASES, "iteration"):
        phases = PHASES if phase == "iteration" else (phase,)
        wall = sum(timed["wall_us"].get(p, 0.0) for p in phases) / 1e6 / iterations
        # compiled: most elementwise, norm and copy work runs inside fused kernels, so their bytes (counted eagerly)
        # have no time of their own to divide by
        fused = any(timed["table"][p]["compiled"]["us"] for p in phases)
        cats: dict[str, dict[str, float | None]] = {}
        for cat in CATEGORIES:
            seconds = sum(timed["table"][p][cat]["us"] for p in phases) / 1e6 / iterations
            flops = sum(counted["table"][p][cat]["flops"] for p in phases)
            data = sum(counted["table"][p][cat]["bytes"] for p in phases)
            if cat == "matmul" and not sum(timed["table"][p]["attention"]["us"] for p in phases):
                # compiled: the attention's matmuls run as plain matmuls, its softmax inside fused kernels
                flops += sum(counted["table"][p]["attention"]["flops"] for p in phases)
            rate: float | None = None
            if seconds and cat in ("matmul", "attention", "convolution"):
                rate = flops / seconds / 1e9
            elif seconds and cat in ("elementwise", "norm", "copy") and not fused:
                rate = data / seconds / 1e9
            cats[cat] = {"seconds": seconds, "share": seconds / wall if wall else 0.0, "rate": rate}
        model_flops = sum(
            counted["table"][p][c]["flops"] for p in phases for c in ("matmul", "attention", "convolution")
        )
        gflops = model_flops / wall / 1e9 if wall else 0.0
        out[phase] = {
            "seconds": wall,
            "gflop": model_flops / 1e9,
            "gflops": gflops,
            "of_shape_ceiling": gflops / ceiling["gflops"] if ceiling["gflops"] else 0.0,
            "categories": cats,
        }
    return out


TOP_OPERATORS = 15


def markdown(report: Mapping[str, Any]) -> str:
    """The profile table: a row per phase, a column per category (share of the phase's time, and its rate)."""
    ceiling, squares = report["shape_ceiling"], report["ceilings"]
    skipped = ceiling["skipped_flops_share"]
    lines = [
        f"`{report['command']}` ({report['cpu']}, {report['threads']} threads, {report['iterations']} profiled "
        f"iterations after {report['warmup']}; precision {json.dumps(report['precision'])}).",
        "",
        f"The iteration: {report['unprofiled_seconds']:.2f} s without the profiler, "
        f"{report['phases']['iteration']['seconds']:.2f} s under it (the seconds below).",
        "",
        f"Per-shape matmul ceiling: **{ceiling['gflops']:.0f} GFLOP/s** ({len(ceiling['shapes'])} shapes timed alone"
        + (f"; {skipped:.0%} of the FLOPs in shapes not rebuilt" if skipped else "")
        + f"); square `torch.mm`: fp32 {squares['fp32']:.0f}, bf16 {squares['bf16']:.0f} GFLOP/s.",
        "",
        "Each cell: the category's share of the phase's time, and its rate (GFLOP/s for matmul, attention, "
        "convolution; GB/s of operands for elementwise, norm, copy, none where fused kernels hold that work).",
        "",
        "| phase | s | GFLOP/s (of per-shape ceiling) | " + " | ".join(CATEGORIES) + " |",
        "|---|---:|---:|" + "---:|" * len(CATEGORIES),
    ]
    for phase, row in report["phases"].items():
        cells = []
        for cat in CATEGORIES:
            c = row["categories"][cat]
            rate = "" if c["rate"] is None else f" ({c['rate']:.0f})"
            cells.append(f"{c['share']:.0%}{rate}" if c["seconds"] else "")
        lines.append(
            f"| {phase} | {row['seconds']:.3f} | {row['gflops']:.0f} ({row['of_shape_ceiling']:.0%}) | "
            + " | ".join(cells)
            + " |"
        )
    whole = report["phases"]["iteration"]["seconds"]
    lines += ["", f"The {TOP_OPERATORS} operators with the most self time in the iteration:", ""]
    lines += ["| operator | category | s | share |", "|---|---|---:|---:|"]
    lines += [
        f"| `{row['op']}` | {row['category']} | {row['seconds']:.3f} | {row['seconds'] / whole:.1%} |"
        for row in report["operators"]
    ]
    lines += ["", "The matmul shapes by FLOPs (the first 8): rate alone, GFLOP/s", ""]
    lines += [f"- `{r['op']}` {r['shapes']} {r['dtypes']}: {r['gflops']:.0f}" for r in ceiling["shapes"][:8]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.step_time import pipeline_iteration

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=COMPARED, default="vgrpo")
    parser.add_argument("--pipeline", default="models/embedded-base")
    parser.add_argument("--precision", default="{}", help="JSON for the precision section")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="iterations before the profiled ones")
    parser.add_argument("--iterations", type=int, default=2, help="profiled iterations")
    parser.add_argument("--shape-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    for name in ("warmup", "iterations", "steps", "prompts", "group", "threads", "shape_repeats"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'warmup' else 1}")
    try:
        precision = json.loads(args.precision)
    except json.JSONDecodeError as exc:
        parser.error(f"--precision is not JSON: {exc}")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    setup = argparse.Namespace(
        pipeline=args.pipeline,
        grid=True,
        prompts=args.prompts,
        group=args.group,
        steps=args.steps,
        precision=json.dumps(precision),
    )
    try:  # the params' errors name the key, before the pipeline loads
        iteration = pipeline_iteration(args.method, setup)
    except ConfigError as exc:
        parser.error(f"--precision: {exc}")
    if precision.get("compile"):  # inductor's C++ kernels as profiler events of their own
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    for it in range(args.warmup):
        train_iteration(**iteration, iteration=it)
    plain = range(args.warmup, args.warmup + args.iterations)
    unprofiled = [train_iteration(**iteration, iteration=it).metrics["time/total_s"] for it in plain]
    # Shapes and FLOPs cost the profiler several times the iteration's time: the seconds come from a pass without.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for it in range(plain.stop, plain.stop + args.iterations):
            train_iteration(**iteration, iteration=it)
    timed = attribute(prof.events())
    it = plain.stop + args.iterations
    # Compiled graphs call their matmuls without recording shapes: the work is counted on the same iteration run
    # eagerly (the same operators before fusion).
    stance = torch.compiler.set_stance("force_eager") if precision.get("compile") else contextlib.nullcontext()
    with stance, profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        train_iteration(**iteration, iteration=it)
    counted = attribute(prof.events())
    ceiling = per_shape_ceiling(counted["shapes"], args.shape_repeats)
    report = {
        "command": " ".join(["python -m benchmarks.profile", *(argv if argv is not None else sys.argv[1:])]),
        "cpu": cpu_model(),
        "threads": args.threads,
        "method": args.method,
        "precision": precision,
        "warmup": args.warmup,
        "iterations": args.iterations,
        "ceilings": ceilings("cpu"),
        "shape_ceiling": ceiling,
        "unprofiled_seconds": sorted(unprofiled)[len(unprofiled) // 2],
        "phases": summarize(timed, counted, args.iterations, ceiling),
        "operators": [
            {**row, "seconds": row.pop("us") / 1e6 / args.iterations} for row in timed["operators"][:TOP_OPERATORS]
        ],
    }
    text = markdown(report)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
