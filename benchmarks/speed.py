"""Seconds per iteration and peak memory of V-GRPO, Flow-GRPO and MixGRPO against the number of sampling steps
T, on the embedded base and at the SD3.5-Medium transformer architecture (CPU scale).

    python -m benchmarks.speed                      # T = 10, 20, 40 -> docs/benchmarks/speed.md
    python -m benchmarks.speed --steps 10 --out /tmp/speed

Each measurement is a separate process, repeated (:mod:`step_time` on ``models/embedded-base`` with the
comparison grid's stage config of each method and the world GenEval reward, 8 prompts x 8 samples, 5 timed
iterations; :mod:`sd35_arch` with SD3.5-M's blocks, LoRA r 32 and a latent reward). Run nothing else alongside:
the numbers are wall-clock. Each measurement starts once the machine is idle and records the load other processes
put on the cores while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import LABELS, ROOT, TIMED_METHODS, flags
from benchmarks.provenance import LOADED_CORES, MachineClock, cpu_model, wait_until_idle
from vgrpo.atomic import write_json_atomic, write_text_atomic

METHODS = TIMED_METHODS
SD35_SCALE = flags(device="cpu", layers=2, resolution=128, group=2, text_tokens=77, precision="fp32")
EMBEDDED_PHASES = ("total", "rollout", "reward", "prepare", "update")


def measure(steps: int, out: Path, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every repeat of both measurements at ``steps`` sampling steps, each a fresh process (cached in ``out``, one
    file per repeat: a killed run resumes and a committed one is not measured again)."""
    result: dict[str, list[dict[str, Any]]] = {"embedded": [], "sd35_arch": []}
    for repeat in range(args.repeats):
        for name, cmd in (
            (
                "embedded",
                [
                    sys.executable,
                    "-m",
                    "benchmarks.step_time",
                    "--pipeline",
                    "models/embedded-base",
                    "--grid",
                    "--prompts",
                    "8",
                    "--group",
                    "8",
                    "--steps",
                    str(steps),
                    "--iterations",
                    str(args.embedded_iterations),
                    "--only",
                    *METHODS,
                ],
            ),
            (
                "sd35_arch",
                [
                    sys.executable,
                    "-m",
                    "benchmarks.sd35_arch",
                    *SD35_SCALE,
                    "--iterations",
                    str(args.sd35_iterations),
                    "--steps",
                    str(steps),
                ],
            ),
        ):
            path = out / f"{name}-T{steps}-r{repeat}.json"
            if not path.is_file():
                wait_until_idle()
                clock = MachineClock(count_children=True)
                partial = path.with_suffix(".partial")
                subprocess.run([*cmd, "--json", str(partial)], cwd=ROOT, check=True)
                machine = clock.finish()
                write_json_atomic(path, json.loads(partial.read_text()) | {"machine": machine})
                partial.unlink()
                print(f"{name} T={steps} repeat {repeat}: {machine['wall_s']:.0f} s", flush=True)
            result[name].append(json.loads(path.read_text()))
    return result


def spread(values: list[float]) -> str:
    """The median of the repeats and their range."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


EMBEDDED_HEADING = "## Embedded base (8 prompts x 8 samples)"


def written_sections(page: Path) -> list[str]:
    """The sections of ``page`` written by hand between its introduction and its first table (the roofline and
    the levers' outcomes), kept when the tables are regenerated."""
    if not page.exists():
        return []
    lines = page.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    end = lines.index(EMBEDDED_HEADING) if EMBEDDED_HEADING in lines else len(lines)
    return lines[start:end]


def table(results: dict[int, dict[str, list[dict[str, Any]]]], args: argparse.Namespace) -> list[str]:
    lines = [
        "# Speed and memory against the number of sampling steps",
        "",
        f"Produced by `python -m benchmarks.speed` on {os.cpu_count()} CPU cores ({cpu_model()}), one process per "
        f"measurement, nothing else running. Each cell is the median over {args.repeats} repeats (fresh processes) "
        f"of the median of {args.embedded_iterations} timed iterations after a warm-up one, with the repeats' "
        "range in brackets. The embedded rows train each method with the comparison grid's own stage config "
        "(`benchmarks/compare/plan.py`: its recipe, two half-batch gradient steps per iteration, LoRA r 32, the world "
        "GenEval reward), at T sampling steps.",
        "",
        EMBEDDED_HEADING,
        "",
        "| T | method | s/iteration | rollout | reward | prepare | update | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for steps, r in sorted(results.items()):
        for m in METHODS:
            reps = [x["results"][m] for x in r["embedded"]]
            cells = [spread([x[f"time/{k}_s"] for x in reps]) for k in EMBEDDED_PHASES]
            lines.append(
                f"| {steps} | {LABELS[m]} | " + " | ".join(cells) + f" | {max(x['peak_rss_mb'] for x in reps):.0f} |"
            )
    sd35 = next(iter(results.values()))["sd35_arch"][0]["args"]
    lines += [
        "",
        f"## SD3.5-M transformer architecture ({sd35['layers']} of 24 blocks, {sd35['resolution']} px, "
        f"1 prompt x {sd35['group']}, {sd35['text_tokens']} text tokens, fp32, CPU; median of "
        f"{args.sd35_iterations} iterations per repeat)",
        "",
        "| T | method | s/iteration | rollout | prepare | update | peak RSS GB | params (M) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for steps, r in sorted(results.items()):
        for m in METHODS:
            reps = [x["results"].get(m) for x in r["sd35_arch"]]
            if any(x is None or "error" in x for x in reps):
                lines.append(f"| {steps} | {LABELS[m]} | failed | | | | | |")
                continue
            cells = [
                spread([x[k] for x in reps]) for k in ("wall_s", "time/rollout_s", "time/prepare_s", "time/update_s")
            ]
            lines.append(
                f"| {steps} | {LABELS[m]} | " + " | ".join(cells) + f" | {max(x['peak_mem_gb'] for x in reps):.2f} | "
                f"{reps[0]['params_m']:.0f} |"
            )
    lines += ["", "## Update time relative to the smallest T (medians)", ""]
    lo = min(results)
    for where, key in (("embedded", "time/update_s"), ("sd35_arch", "time/update_s")):
        parts = []
        for m in METHODS:

            def med(t: int, m: str = m, where: str = where, key: str = key) -> float | None:
                vals = [x["results"].get(m, {}).get(key) for x in results[t][where]]
                return statistics.median(vals) if vals and all(v is not None for v in vals) else None

            base = med(lo)
            ratios = [med(t) for t in sorted(results)]
            if base and all(ratios):
                parts.append(f"{LABELS[m]} " + " / ".join(f"{v / base:.2f}" for v in ratios if v))
        lines.append(f"- {where}, T = {' / '.join(str(t) for t in sorted(results))}: " + "; ".join(parts))
    return [*lines, "", *load_note(results), ""]


def load_note(results: dict[int, dict[str, list[dict[str, Any]]]]) -> list[str]:
    """What the other processes on the machine did while the measurements ran (recorded since the runner
    counts a measurement's own subprocess CPU time; older files say nothing)."""
    runs = [x for r in results.values() for where in r.values() for x in where]
    recorded = [x["machine"] for x in runs if "machine" in x]
    lines = ["## Machine load while measuring", ""]
    if recorded:
        loads = [m["other_load_cores"] for m in recorded]
        loaded = sum(m["under_load"] for m in recorded)
        lines.append(
            f"- other processes used {statistics.median(loads):.2f} cores in the median measurement, at most "
            f"{max(loads):.2f}; {loaded} of {len(recorded)} ran above {LOADED_CORES} cores"
        )
    if len(recorded) < len(runs):
        lines.append(
            f"- {len(runs) - len(recorded)} of {len(runs)} measurements predate load recording: each started only "
            f"once other processes used at most {LOADED_CORES} cores"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per measurement")
    parser.add_argument("--embedded-iterations", type=int, default=5, help="timed iterations (after a warm-up)")
    parser.add_argument("--sd35-iterations", type=int, default=2, help="timed iterations at the SD3.5-M scale")
    args = parser.parse_args()
    raw = args.out / "speed"
    raw.mkdir(parents=True, exist_ok=True)
    results = {t: measure(t, raw, args) for t in args.steps}
    page = args.out / "speed.md"
    lines = table(results, args)
    kept = written_sections(page)
    at = lines.index(EMBEDDED_HEADING)
    write_text_atomic(page, "\n".join([*lines[:at], *kept, *lines[at:]]))
    print(f"report: {args.out / 'speed.md'}")


if __name__ == "__main__":
    main()
