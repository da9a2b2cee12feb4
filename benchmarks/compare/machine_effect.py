"""Benchmark v4's first step (issue 63, item 4): whether the CPU model or the thread count shifts an outcome.

    # from a worktree at the v3 pre-registration commit, the cells' code (code hash 8a1a0d70a81f4314):
    python -m benchmarks.compare.machine_effect run --threads 2 \\
        --v3-records ../main/docs/benchmarks-v3/grid/cells.jsonl \\
        --docs ../main/docs/benchmarks-v4 --out ../main/runs/bench/machine-effect    # again to resume
    python -m benchmarks.compare.machine_effect report                                  # from any checkout

``run`` trains benchmark v3's methods-phase V-GRPO cells again (10 seeds, 80 iterations, GenEval strict on the
540 test prompts; v3 ran them on an Intel Xeon (6/167) at 2 threads) on this machine at ``--threads``: one *arm*
per CPU model and thread count, its records in ``<docs>/machine-effect/<arm>.jsonl``. It refuses to start unless
the cells' code is v3's (the code hash), so an arm differs from v3's records by the machine alone. ``report``
pairs every arm with v3's records by seed, at E1's read point (iteration 40) and at the end (80), and gives the
mean paired difference with its 95% t interval over seeds beside the seed-to-seed spread: a *shift* when the
interval excludes 0, *within the margin* when it lies inside +-``MARGIN``, otherwise unresolved
(docs/benchmarks-v4/machine-effect-preregistration.md fixes the rule).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scipy import stats

from benchmarks.common import ROOT
from benchmarks.compare import cell_runs
from benchmarks.compare.analysis import load_records
from benchmarks.compare.plan import RunSpec
from benchmarks.compare.plan_v3 import V3
from benchmarks.provenance import code_hash, cpu_model
from vgrpo.atomic import write_text_atomic

V3_CODE_HASH = "8a1a0d70a81f4314"
"""The code hash of every benchmark v3 record: the cells' code at the v3 pre-registration commit (d445760)."""
METHOD, PHASE = "vgrpo", "methods"
READ_POINTS = (40, 80)  # E1's read point (half the horizon) and the end
MARGIN = 0.02
"""Equivalence margin on GenEval strict: half of v3's smallest confirmed difference between methods (+0.039)."""


def reference(v3_records: Path) -> dict[int, dict[str, Any]]:
    """v3's methods-phase V-GRPO records by seed."""
    return {
        r["spec"]["seed"]: r
        for r in load_records(v3_records).values()
        if r["spec"]["phase"] == PHASE and r["spec"]["method"] == METHOD
    }


def arm_name(cpu: str, threads: int) -> str:
    """A file name for a CPU model and thread count: ``amd-epyc-25-17-t2``."""
    return re.sub(r"[^a-z0-9]+", "-", cpu.lower().replace("(r)", "")).strip("-") + f"-t{threads}"


def score_at(record: dict[str, Any], iteration: int) -> float:
    return next(float(p["score"]) for p in record["curve"] if p["iteration"] == iteration)


def paired(arm: dict[int, dict[str, Any]], ref: dict[int, dict[str, Any]], iteration: int) -> dict[str, Any]:
    """The arm minus v3 at ``iteration``, paired by seed: mean, 95% t interval, the per-seed differences, and the
    seed-to-seed SD of each side; the verdict by the pre-registered rule (fewer than 3 seeds: none)."""
    seeds = sorted(set(arm) & set(ref))
    diffs = [score_at(arm[s], iteration) - score_at(ref[s], iteration) for s in seeds]
    out: dict[str, Any] = {"iteration": iteration, "seeds": seeds, "diffs": diffs}
    if len(diffs) < 3:
        return {**out, "verdict": "too few seeds"}
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    half = float(stats.t.ppf(0.975, len(diffs) - 1)) * sd / len(diffs) ** 0.5
    lo, hi = mean - half, mean + half
    verdict = "shift" if lo > 0 or hi < 0 else "within the margin" if lo >= -MARGIN and hi <= MARGIN else "unresolved"
    return {
        **out,
        "mean": mean,
        "lo": lo,
        "hi": hi,
        "sd_diff": sd,
        "sd_arm": statistics.stdev(score_at(arm[s], iteration) for s in seeds),
        "sd_ref": statistics.stdev(score_at(ref[s], iteration) for s in seeds),
        "verdict": verdict,
    }


def trained_config(record: dict[str, Any]) -> dict[str, Any]:
    """A record's config less the path of its evaluation prompts, which names the records folder the cell ran in
    (the file itself is drawn from the world's generator by the cells' code, so one code hash gives one file)."""
    return {k: v for k, v in record.get("config", {}).items() if k != "eval_prompts"}


def config_mismatches(arm: dict[int, dict[str, Any]], ref: dict[int, dict[str, Any]]) -> list[int]:
    """Seeds whose arm record trained another config or code than v3's (none expected: the runner refuses)."""
    return [
        s
        for s in sorted(set(arm) & set(ref))
        if trained_config(arm[s]) != trained_config(ref[s]) or arm[s].get("code_hash") != ref[s].get("code_hash")
    ]


def report(docs: Path, v3_records: Path) -> str:
    ref = reference(v3_records)
    ref_machine = {(r["machine"]["cpu"], r["threads"]) for r in ref.values()}
    lines = [
        "# Benchmark v4: does the CPU model or the thread count shift an outcome?",
        "",
        "Produced by `python -m benchmarks.compare.machine_effect report` from the records in"
        " `docs/benchmarks-v4/machine-effect/` (the rule: `docs/benchmarks-v4/machine-effect-preregistration.md`)."
        f" Each arm trains benchmark v3's methods-phase V-GRPO cells again (same specs, configs and code, hash"
        f" {V3_CODE_HASH}) on one CPU model at one thread count; the reference is v3's own records"
        f" ({'; '.join(f'{c} at {t} threads' for c, t in sorted(ref_machine))}). GenEval strict on the 540 test"
        " prompts; arm minus v3, paired by seed, mean [95% t interval over seeds]; margin"
        f" +-{MARGIN}.",
        "",
        "| arm | seeds | iteration | arm - v3 [95% CI] | per seed | SD of the differences | seed SD (arm / v3)"
        " | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted((docs / "machine-effect").glob("*.jsonl")):
        arm = {r["spec"]["seed"]: r for r in load_records(path).values()}
        if bad := config_mismatches(arm, ref):
            lines.append(f"| {path.stem} | | | another config or code than v3's at seeds {bad}: not compared | | | | |")
            continue
        machines = sorted({f"{r['machine']['cpu']} at {r['threads']} threads" for r in arm.values()})
        loaded = sum(1 for r in arm.values() if r["machine"].get("under_load"))
        name = f"{'; '.join(machines)} ({loaded} of {len(arm)} under load)"
        for iteration in READ_POINTS:
            p = paired(arm, ref, iteration)
            per_seed = ", ".join(f"{d:+.3f}" for d in p["diffs"])
            if "mean" not in p:
                lines.append(f"| {name} | {len(p['seeds'])} | {iteration} | | {per_seed} | | | {p['verdict']} |")
                continue
            lines.append(
                f"| {name} | {len(p['seeds'])} | {iteration} | {p['mean']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}] |"
                f" {per_seed} | {p['sd_diff']:.3f} | {p['sd_arm']:.3f} / {p['sd_ref']:.3f} | {p['verdict']} |"
            )
    lines += [
        "",
        "A machine that only re-orders float sums acts on a run like a fresh draw of its randomness: then the SD of"
        " the paired differences is about sqrt(2) times the seed SD and the mean difference holds 0. A *shift* is"
        " a mean difference beyond that noise: rows whose groups ran on different machines would then compare the"
        " machines as well as the methods.",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if (here := code_hash()) != V3_CODE_HASH:
        print(
            f"refusing to start: the cells' code hash is {here}, v3's is {V3_CODE_HASH}; run from a worktree at the"
            " v3 pre-registration commit (git worktree add ../vgrpo-v3 d445760), so that an arm differs from v3's"
            " records by the machine alone",
            file=sys.stderr,
        )
        return 2
    ref = reference(args.v3_records)
    if not ref:
        print(f"--v3-records {args.v3_records}: no methods-phase V-GRPO record", file=sys.stderr)
        return 2
    arm = arm_name(cpu_model(), args.threads)
    out = (args.out / arm).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.records = args.docs / "machine-effect" / f"{arm}.jsonl"
    args.records.parent.mkdir(parents=True, exist_ok=True)
    args.quick, args.rerun_loaded, args.grid = False, False, "v3"
    args.started_at = time.strftime("%Y-%m-%dT%H:%M:%S")
    cell_runs.sync_records(out, args.records, export=False)
    specs = [RunSpec(**ref[s]["spec"]) for s in sorted(ref)]
    cell_runs.run_phase(specs, args, V3, out, time.perf_counter())
    done = {r["spec"]["seed"]: r for r in load_records(out).values()}
    if bad := config_mismatches(done, ref):
        print(f"seeds {bad} trained another config than v3's records", file=sys.stderr)
        return 1
    return 0 if len(done) == len(ref) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare.machine_effect", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    v3_default = ROOT / "docs" / "benchmarks-v3" / "grid" / "cells.jsonl"
    docs_default = ROOT / "docs" / "benchmarks-v4"
    go = sub.add_parser("run", help="train v3's V-GRPO methods cells on this machine (resumable)")
    go.add_argument("--threads", type=int, required=True)
    go.add_argument("--workers", type=int, default=1)
    go.add_argument("--allow-load", action="store_true", help="start cells while other processes load the cores")
    go.add_argument("--v3-records", type=Path, default=v3_default)
    go.add_argument("--docs", type=Path, default=docs_default)
    go.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "machine-effect")
    rep = sub.add_parser("report", help="pair every arm with v3's records: docs/benchmarks-v4/machine-effect.md")
    rep.add_argument("--v3-records", type=Path, default=v3_default)
    rep.add_argument("--docs", type=Path, default=docs_default)
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.threads < 1 or args.workers < 1:
            parser.error(f"--threads {args.threads} and --workers {args.workers}: each at least 1")
        if not args.v3_records.is_file():
            parser.error(f"--v3-records {args.v3_records}: no such file (benchmark v3's cells.jsonl)")
        return run(args)
    write_text_atomic(args.docs / "machine-effect.md", report(args.docs, args.v3_records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
