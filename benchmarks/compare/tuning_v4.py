"""Benchmark v4's tuning sweep, as pre-registered in docs/benchmarks-v4/tuning-preregistration.md.

V-GRPO's recipe candidates and the baselines' at benchmark v4's horizon (160 iterations), scored on the validation
prompts (the pre-registration gives the candidates' sources and reasons; the rule is v3's,
:mod:`benchmarks.compare.rungs`).

    python -m benchmarks.compare.tuning_v4 --workers 1 --threads 2   # resumable: run it again to continue
    python -m benchmarks.compare.tuning_v4 --report-only             # docs/benchmarks-v4/tuning.md from the records

Every cell of a method runs on the CPU model and thread count of that method's first record (the deviations of
2026-12-07; the pre-registration pinned the whole sweep to its first record's; a record moved to
``tuning/superseded.jsonl`` no longer counts): the runner runs the cells this
machine may run and refuses to start (exit 2) when it may run none, so no method's choice compares cells of two
machine types. The report gives each rung's cost beside its score (transformer evaluations and seconds per
iteration), since N_MC, the gradient steps and the group change it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import LABELS, ROOT
from benchmarks.compare import tuning_runs
from benchmarks.compare.analysis import load_records
from benchmarks.compare.plan import RunSpec
from benchmarks.compare.rungs import Rung, Sweep
from benchmarks.compare.tuning_report import Column, ReportText
from benchmarks.compare.tuning_report import report as sweep_report
from benchmarks.provenance import cpu_model

_MIX_OFFICIAL = {"window_size": 2, "shift_interval": 32}  # starts 0..4 over 160 iterations: v3's 16 over 80
_FLOW_OFFICIAL = {"kl_coef": 0.004, "timestep_order": "first"}  # v3's `official` (its KL scaled to 10 steps)

# name -> overrides on the grid's own (benchmarks.compare.plan.METHOD_OVERRIDES: MixGRPO's window every 3
# iterations, which each MixGRPO recipe replaces); the pre-registration's tables give each one's source.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "vgrpo": {
        "v3": {},
        "nmc10": {"algorithm": {"n_mc": 10}},
        "one-step": {"optim": {"gradient_steps": 1, "minibatches": 1}},
        "four-step-clip": {
            "optim": {"gradient_steps": 4, "minibatches": 4},
            "algorithm": {"clip_range": 0.01},
            "advantage": {"soft_clip_eta": 2},
        },
        "kl-behaviour": {"algorithm": {"kl_coef": 0.3}},
        "eta1": {"advantage": {"soft_clip_eta": 1}},
        "group16": {"rollout": {"group_size": 16, "prompts_per_iteration": 4}},
    },
    "naive_elbo": {"v2": {}},
    "flow_grpo": {
        "official-clip8e-4": {"algorithm": {**_FLOW_OFFICIAL, "clip_range": 8e-4}},
        "official-nocfg": {
            "algorithm": {"kl_coef": 0, "noise_level": 0.8, "clip_range": 8e-5, "timestep_fraction": 0.3},
            "advantage": {"std_scope": "global"},
        },
    },
    "mixgrpo": {
        "official": {"algorithm": {**_MIX_OFFICIAL}, "rollout": {"group_noise": "shared"}},
        "official-clip8e-4": {"algorithm": {**_MIX_OFFICIAL, "clip_range": 8e-4}, "rollout": {"group_noise": "shared"}},
        # starts 0..1 over 160 iterations: steps 0-2, sigma 1 to 0.7, the high-noise part the official run trains
        "official-window": {
            "algorithm": {"window_size": 2, "shift_interval": 80},
            "rollout": {"group_noise": "shared"},
        },
    },
    "diffusion_nft": {
        "official": {
            "algorithm": {"n_mc": 9, "timestep_sampling": "stratified", "ema_decay_rate": 0.002},
            "advantage": {"std_scope": "global"},
        },
    },
}
RATES: dict[str, tuple[float, ...]] = {  # a factor 2 apart around each method's v3 choice
    "vgrpo": (2e-4, 4e-4, 8e-4),
    "naive_elbo": (1e-4, 2e-4, 4e-4),
    "flow_grpo": (8e-4, 1.6e-3, 3.2e-3),
    "mixgrpo": (4e-4, 8e-4, 1.6e-3),
    "diffusion_nft": (4e-4, 8e-4, 1.6e-3),
}
# V-GRPO's recipes first (the question), then the baselines' new candidates, then the v3 choices at the horizon.
ORDER = (
    *(("vgrpo", r) for r in RECIPES["vgrpo"]),
    ("flow_grpo", "official-nocfg"),
    ("mixgrpo", "official-clip8e-4"),
    ("mixgrpo", "official-window"),
    ("naive_elbo", "v2"),
    ("flow_grpo", "official-clip8e-4"),
    ("mixgrpo", "official"),
    ("diffusion_nft", "official"),
)
V4 = Sweep(
    recipes=RECIPES,
    rates=RATES,
    order=ORDER,
    rate_bounds=(1e-4, 1.28e-2),
    seed0=1600,  # fresh: no v2 or v3 cell used 1600-1699
    seeds=2,
    iterations=160,
    eval_every=20,
    drop_margin=0.08,  # v3's margins, so the choices compare
    collapse_margin=0.10,
)
DEVIATIONS: tuple[str, ...] = (
    "from 2026-12-07 each method's cells run on the CPU model and thread count of that method's first record, not"
    " the whole sweep's on its first record's (V-GRPO's first cell ran on an Intel Xeon (6/167) and later sessions"
    " were lent AMD EPYC (25/17) machines, on which the pinned sweep could not run): each method's choice still"
    " compares cells of one machine type, and the report names each method's machine; the base's validation"
    " evaluation, which every method's collapse check reads, is its record's (Intel Xeon (6/167), 2 threads);"
    " the records' library code is the pre-registration's (the worktree stays at its commit, with this runner)",
    "from 2026-12-07 15:20 UTC V-GRPO's cells run on an AMD EPYC (25/17) at 2 threads, as the baselines' have: its"
    " one cell on the Intel Xeon (6/167) is moved to tuning/superseded.jsonl (kept, read by no choice) and runs"
    " again; four sessions in a row were lent the AMD EPYC, and the machine-effect study found no shift between the"
    " two models beyond +-0.02 (docs/benchmarks-v4/machine-effect.md); the base's record stays the Intel one",
    "from 2026-12-07 about 19:55 UTC the runner plans again after each cell and runs a recipe's edge extensions"
    " next to its own rungs, in the sweep's order of recipes, not after every recipe's first rungs (so V-GRPO's"
    " choice no longer waits for the baselines' 40 first cells); the cells, seeds, rates and rule are unchanged",
)
"""Departures from the pre-registration, each a sentence: listed at the top of the report."""
COMMAND = "python -m benchmarks.compare.tuning_v4"


def costs(records: dict[str, dict[str, Any]]) -> dict[tuple[str, str, float], tuple[float | None, list[float], int]]:
    """Each rung's seed-mean transformer evaluations per training iteration (the curve's last point: evaluations
    are not counted), its cells' training seconds per iteration that ran without other load, and its cells."""
    out: dict[tuple[str, str, float], tuple[float | None, list[float], int]] = {}
    for key, cells in V4.cells_by_rung(records).items():
        last = [c["curve"][-1] for c in cells if c["curve"] and c["curve"][-1]["iteration"] > 0]
        nfe = statistics.mean(p["nfe"] / p["iteration"] for p in last) if last else None
        seconds = [
            c["time_split_s"]["iteration"]
            for c in cells
            if not c.get("machine", {}).get("under_load") and (c.get("time_split_s") or {}).get("iteration")
        ]
        out[key] = (nfe, seconds, len(cells))
    return out


def cost_columns(records: dict[str, dict[str, Any]]) -> tuple[Column, Column]:
    table = costs(records)

    def nfe(r: Rung) -> str:
        value = table[(r.method, r.recipe, r.lr)][0]
        return "" if value is None else f"{value:.0f}"

    def seconds(r: Rung) -> str:
        _, values, n = table[(r.method, r.recipe, r.lr)]
        if not values:
            return "n/a"
        return f"{statistics.mean(values):.2f}" + (f" ({len(values)} of {n} seeds)" if len(values) < n else "")

    return Column("NFE / iteration", nfe), Column("s / iteration", seconds)


def method_machines(records: dict[str, dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """Each method's machine: the CPU model and thread count of its first record (by start time), the base's
    validation evaluation under ``base``."""
    first: dict[str, tuple[str, str, int]] = {}
    for record in records.values():
        machine = record.get("machine", {})
        if "cpu" not in machine:
            continue
        method, started = record["spec"]["method"], str(machine.get("started_at", ""))
        if method not in first or started < first[method][0]:
            first[method] = (started, str(machine["cpu"]), int(record.get("threads") or 0))
    return {method: (cpu, threads) for method, (_, cpu, threads) in first.items()}


def machine_line(records: dict[str, dict[str, Any]]) -> str:
    """Each method's CPU model and thread count, and how many tuning cells ran under load."""
    machines = method_machines(records)
    names = {"base": "the base", **LABELS}
    where = "; ".join(f"{names.get(m, m)}: {cpu} at {threads} threads" for m, (cpu, threads) in machines.items())
    cells = V4.tuning_cells(records)
    loaded = sum(1 for r in cells if r.get("machine", {}).get("under_load"))
    return (
        f"Machines: {where or 'none yet'}."
        " *NFE / iteration*: transformer evaluations (batch rows) per training iteration, evaluations not counted,"
        " seed mean. *s / iteration*: training seconds per iteration (rollout, reward, update; evaluations not"
        f" counted), the mean over the seeds that ran without other load ({loaded} of the {len(cells)} cells ran"
        " under load: their scores count, their seconds are left out)."
    )


def report(records: dict[str, dict[str, Any]], planned: list[RunSpec], command: str) -> str:
    deviations = "; ".join(DEVIATIONS) or "none"
    text = ReportText(
        "v4",
        "`docs/benchmarks-v4/tuning-preregistration.md` states the recipes, the rates and the rule; "
        "`benchmarks/compare/tuning_v4.py` runs them",
        "benchmark v4's horizon",
        (f"Deviations from the pre-registration: {deviations}.", machine_line(records)),
    )
    return sweep_report(V4, text, records, planned, command, cost_columns(records))


def runnable_here(records: dict[str, dict[str, Any]], threads: int) -> Callable[[RunSpec], bool]:
    """Whether this machine at ``threads`` may run a cell: its method has no record yet, or its first record ran
    on this CPU model at this thread count."""
    machines, here = method_machines(records), (cpu_model(), threads)
    return lambda spec: machines.get(spec.method, here) == here


def other_machine(args: argparse.Namespace) -> str | None:
    """Why this machine may not run the sweep (None when it may): every cell left to run belongs to a method whose
    first record ran on another CPU model or at another thread count (the records folder and the committed ones)."""
    records = {**load_records(tuning_runs.committed_records(args)), **load_records(args.out)}
    left = [s for s in V4.plan(records) if s.name not in records]
    runnable = runnable_here(records, args.threads)
    if not left or any(runnable(s) for s in left):
        return None
    machines = method_machines(records)
    theirs = "; ".join(
        f"{method}: {cpu} at {threads} threads"
        for method, (cpu, threads) in machines.items()
        if any(s.method == method for s in left)
    )
    return (
        f"refusing to start: the cells left belong to methods whose records ran elsewhere ({theirs}), this machine is"
        f" {cpu_model()} at --threads {args.threads}; each method's cells run on the CPU model and thread count of"
        " its first record (docs/benchmarks-v4/tuning-preregistration.md, and the deviation in tuning.md): run it"
        " on one of those machines with that --threads"
    )


def retire_superseded(args: argparse.Namespace) -> list[str]:
    """Move the records folder's copies of the superseded records (``<docs>/tuning/superseded.jsonl``, the same
    run: same name and start time) to its ``stale/``, so that those cells run again and no choice reads them; the
    names moved."""
    superseded = Path(args.docs) / "tuning" / "superseded.jsonl"
    if not superseded.is_file():
        return []
    moved = []
    for name, record in load_records(superseded).items():
        path = Path(args.out) / f"{name}.json"
        if not path.is_file():
            continue
        started = json.loads(path.read_text()).get("machine", {}).get("started_at")
        if started == record.get("machine", {}).get("started_at"):
            stale = Path(args.out) / "stale" / f"{name}.superseded.json"
            stale.parent.mkdir(parents=True, exist_ok=True)
            path.rename(stale)
            moved.append(name)
    return moved


def main(argv: list[str] | None = None) -> int:
    docs, out = ROOT / "docs" / "benchmarks-v4", ROOT / "runs" / "bench" / "v4-tuning"
    args = tuning_runs.parser(COMMAND, __doc__.splitlines()[0], out, docs).parse_args(argv)
    for name in retire_superseded(args):  # before the report too: it reads no superseded record
        print(f"{name}: superseded (docs/benchmarks-v4/tuning/superseded.jsonl); moved to stale/", flush=True)
    if not args.report_only and (why := other_machine(args)):
        print(why, file=sys.stderr)
        return 2
    return tuning_runs.run(
        V4,
        args,
        lambda records, planned: report(records, planned, COMMAND),
        runnable=lambda records: runnable_here(records, args.threads),
    )


if __name__ == "__main__":
    raise SystemExit(main())
