"""Benchmark v3's tuning sweep: each method's recipe candidates and learning rates at the horizon the grid runs
(80 iterations), scored on the validation prompts, with the stability criterion fixed before the sweep ran.

    python -m benchmarks.compare.tuning --workers 2 --threads 1   # resumable: run it again to continue
    python -m benchmarks.compare.tuning --report-only              # docs/benchmarks-v3/tuning.md from the records

Why a sweep of its own: the v2 sweep chose rates at 30 iterations for runs of 80 (a rate that collapses late was
chosen), and tuned only the rate of recipes compressed for the 10-step world (MixGRPO's window swept all 10 steps
every 21 iterations). Here each baseline's candidates are its v2 recipe and its official code's recipe scaled to
this world (``docs/benchmarks/v3-preregistration.md`` gives the sources and the reasons), each at three rates.

The criterion (:data:`DROP_MARGIN`, :func:`stable`, :func:`choose`), fixed before the first tuning cell:

- a rung (method, recipe, rate) is *stable* when on every seed its final validation score is at most
  ``DROP_MARGIN`` below that seed's best evaluation point, no point lies more than :data:`COLLAPSE_MARGIN`
  below the base, and the cell did not diverge;
- each method's choice is its stable rung with the highest seed-mean final score (ties: the smaller rate);
- while a recipe's best stable rung is at an edge of the rates it tried, the next rate out (a factor 2) is added,
  within :data:`RATE_BOUNDS` (a best rung at the edge says the optimum may lie beyond it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import LABELS, METHODS, ROOT
from benchmarks.compare import cell_runs
from benchmarks.compare.analysis import load_records
from benchmarks.compare.plan import RunSpec, Sizes, eval_prompt_file
from benchmarks.compare.tuning_tables import curve_lines, strength_lines
from vgrpo.atomic import write_text_atomic

# A method's candidate recipes: name -> overrides on the grid's own (benchmarks.compare.plan.METHOD_OVERRIDES).
# ``v2`` is the recipe the v2 grid ran; the others follow each method's official code, scaled to 10 steps and 80
# iterations (the reasons: docs/benchmarks/v3-preregistration.md#baselines-settings).
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "vgrpo": {"v2": {}},
    "naive_elbo": {"v2": {}},
    "flow_grpo": {
        "v2": {},
        # the later release's fixed training steps (every SDE step but the last) and its KL strength (0.04 with
        # the official denominator is kl_coef 0.004 on this 10-step grid)
        "official": {"algorithm": {"kl_coef": 0.004, "timestep_order": "first"}},
        # the same with the clip range widened for a log-prob averaged over 1,024 latent dimensions, not 65,536
        "official-clip8e-4": {"algorithm": {"kl_coef": 0.004, "timestep_order": "first", "clip_range": 8e-4}},
    },
    "mixgrpo": {
        "v2": {},
        # the official run's window: 16% of the steps (4 of 25 -> 2 of 10), advancing over the first 60% of the
        # trajectory once in the run (starts 0..4, every 16 iterations), one initial noise per group
        "official": {
            "algorithm": {"window_size": 2, "shift_interval": 16},
            "rollout": {"group_noise": "shared"},
        },
        "official-own-noise": {"algorithm": {"window_size": 2, "shift_interval": 16}},
    },
    "diffusion_nft": {
        "v2": {},
        # 9 of the 10 grid timesteps per sample (stratified), the batch-wide std, and the old policy's decay rate
        # per gradient step (0.001) counted per iteration (2 gradient steps)
        "official": {
            "algorithm": {"n_mc": 9, "timestep_sampling": "stratified", "ema_decay_rate": 0.002},
            "advantage": {"std_scope": "global"},
        },
    },
}
RATES: dict[str, tuple[float, ...]] = {  # around each method's v2 choice (V-GRPO, naive, MixGRPO 8e-4; others 1.6e-3)
    "vgrpo": (4e-4, 8e-4, 1.6e-3),
    "naive_elbo": (4e-4, 8e-4, 1.6e-3),
    "flow_grpo": (8e-4, 1.6e-3, 3.2e-3),
    "mixgrpo": (4e-4, 8e-4, 1.6e-3),
    "diffusion_nft": (8e-4, 1.6e-3, 3.2e-3),
}
RATE_BOUNDS = (1e-4, 1.28e-2)
TUNING_SEED0 = 1500  # fresh: no v2 cell and no other v3 phase uses 1500-1599
TUNING_SEEDS = 2
DROP_MARGIN = 0.08  # validation strict: a final this far below the seed's own best point is a late collapse
COLLAPSE_MARGIN = 0.10  # validation strict below the base at any point (the grid's collapse margin)
ITERATIONS, EVAL_EVERY = 80, 10


def tuning_spec(method: str, recipe: str, lr: float, seed_index: int) -> RunSpec:
    return RunSpec(
        "tune",
        method,
        lr=lr,
        seed=TUNING_SEED0 + seed_index,
        variant=recipe,
        overrides=RECIPES[method][recipe],
        iterations=ITERATIONS,
        eval_every=EVAL_EVERY,
        split="val",
    )


BASE = RunSpec("base", "base", "geneval", split="val")


@dataclass(frozen=True)
class Rung:
    """One (method, recipe, rate) over the tuning seeds."""

    method: str
    recipe: str
    lr: float
    finals: tuple[float, ...]  # per seed; a diverged cell scores minus infinity
    worst_drop: float  # the largest fall of a final below its seed's best point
    worst_below_base: float  # the lowest point minus the base, over seeds
    diverged: int
    last_quarter: float  # seed mean of the final minus the point at 3/4 of the horizon: near 0 on a plateau

    @property
    def mean(self) -> float:
        return sum(self.finals) / len(self.finals)


def rung_of(method: str, recipe: str, lr: float, cells: list[dict[str, Any]], base: float) -> Rung:
    finals, drops, lows, quarters, diverged = [], [], [], [], 0
    for cell in cells:
        scores = [p["score"] for p in cell["curve"]]
        if cell.get("diverged") or not scores:
            diverged += 1
            finals.append(float("-inf"))
            continue
        finals.append(scores[-1])
        drops.append(max(scores) - scores[-1])
        lows.append(min(scores) - base)
        at = {int(p["iteration"]): p["score"] for p in cell["curve"]}
        if ITERATIONS * 3 // 4 in at:
            quarters.append(scores[-1] - at[ITERATIONS * 3 // 4])
    return Rung(
        method,
        recipe,
        lr,
        tuple(finals),
        max(drops, default=float("inf")),
        min(lows, default=float("-inf")),
        diverged,
        sum(quarters) / len(quarters) if quarters else float("nan"),
    )


def stable(rung: Rung) -> bool:
    return rung.diverged == 0 and rung.worst_drop <= DROP_MARGIN and rung.worst_below_base >= -COLLAPSE_MARGIN


def tuning_cells(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the sweep's cells (phase ``tune``, the tuning seeds)."""
    seeds = range(TUNING_SEED0, TUNING_SEED0 + TUNING_SEEDS)
    return [r for r in records.values() if r["spec"]["phase"] == "tune" and r["spec"]["seed"] in seeds]


def rungs(records: dict[str, dict[str, Any]]) -> list[Rung]:
    """Every rung whose seeds have all finished."""
    base = records.get(BASE.name)
    if base is None:
        return []
    base_score = base["curve"][0]["score"]
    by_rung: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for record in tuning_cells(records):
        spec = record["spec"]
        by_rung.setdefault((spec["method"], spec["variant"], spec["lr"]), []).append(record)
    return [
        rung_of(m, r, lr, cells, base_score)
        for (m, r, lr), cells in sorted(by_rung.items())
        if len(cells) == TUNING_SEEDS
    ]


def best_stable(candidates: list[Rung]) -> Rung | None:
    eligible = [r for r in candidates if stable(r)]
    return max(eligible, key=lambda r: (r.mean, -r.lr)) if eligible else None


def extensions(done: list[Rung]) -> list[RunSpec]:
    """The next rate out for each recipe whose best stable rung is at an edge of the rates it tried (or, with no
    stable rung, below the smallest it tried)."""
    specs = []
    for method, recipes in RECIPES.items():
        for recipe in recipes:
            tried = [r for r in done if r.method == method and r.recipe == recipe]
            if len(tried) < len(RATES[method]):
                continue  # its first rates are still running
            lrs = sorted(r.lr for r in tried)
            best = best_stable(tried)
            nxt = []
            if best is None:
                nxt = [lrs[0] / 2]
            elif best.lr == lrs[0]:
                nxt = [best.lr / 2]
            elif best.lr == lrs[-1]:
                nxt = [best.lr * 2]
            specs += [
                tuning_spec(method, recipe, lr, s)
                for lr in nxt
                if RATE_BOUNDS[0] <= lr <= RATE_BOUNDS[1]
                for s in range(TUNING_SEEDS)
            ]
    return specs


# The order the first rungs run in: the recipes the v2 grid lacked (the weak baselines' official ones) and V-GRPO's
# rates at the horizon first, the v2 recipes at the horizon last (what an interrupted sweep has settled first).
ORDER = (
    ("mixgrpo", "official"),
    ("flow_grpo", "official"),
    ("vgrpo", "v2"),
    ("diffusion_nft", "official"),
    ("naive_elbo", "v2"),
    ("mixgrpo", "official-own-noise"),
    ("flow_grpo", "official-clip8e-4"),
    ("mixgrpo", "v2"),
    ("flow_grpo", "v2"),
    ("diffusion_nft", "v2"),
)


def plan(records: dict[str, dict[str, Any]]) -> list[RunSpec]:
    """The base's validation evaluation, every recipe at its first rates (in :data:`ORDER`), the extension rungs
    that have run (planned still once a later rung moved the edge past them), and those the rungs call for now."""
    first = [tuning_spec(m, recipe, lr, s) for m, recipe in ORDER for lr in RATES[m] for s in range(TUNING_SEEDS)]
    ran = sorted((RunSpec(**r["spec"]) for r in tuning_cells(records)), key=lambda s: s.name)
    every = [BASE, *first, *ran, *extensions(rungs(records))]
    return list({s.name: s for s in every}.values())  # each cell once, where it first appears


def choose(records: dict[str, dict[str, Any]]) -> dict[str, Rung | None]:
    """Each method's chosen rung (None while it has no stable finished rung)."""
    done = rungs(records)
    return {m: best_stable([r for r in done if r.method == m]) for m in METHODS}


def chosen_as_methods(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The chosen rungs' cells as the grid's ``methods`` cells, and the validation base as the base: records the
    claims read (:func:`benchmarks.compare.claim_rows.claim_rows`) on the validation prompts, at the tuning seeds.
    The power analysis sizes the v3 grid's method rows by them (``python -m benchmarks.compare.power --tuning``)."""
    base = records[BASE.name]
    out = {"base-geneval-test": {**base, "spec": {**base["spec"], "split": "test"}, "name": "base-geneval-test"}}
    for method, rung in choose(records).items():
        if rung is None:
            continue
        for seed_index in range(TUNING_SEEDS):
            record = records[tuning_spec(method, rung.recipe, rung.lr, seed_index).name]
            spec = RunSpec(**{**record["spec"], "phase": "methods", "variant": "default", "split": "test"})
            out[spec.name] = {**record, "spec": {**record["spec"], **asdict(spec)}, "name": spec.name}
    return out


def report(records: dict[str, dict[str, Any]], planned: list[RunSpec], command: str) -> str:
    done = rungs(records)
    chosen = choose(records)
    base = records.get(BASE.name)
    missing = [s.name for s in planned if s.name not in records]
    lines = [
        "# Benchmark v3: the tuning sweep (validation prompts)",
        "",
        f"Produced by `{command}` from the records in `docs/benchmarks-v3/tuning/cells.jsonl`"
        " (`benchmarks/compare/tuning.py` states the recipes, the rates and the criterion).",
        "",
        f"Each rung: one recipe at one rate, {TUNING_SEEDS} seeds ({TUNING_SEED0}-{TUNING_SEED0 + TUNING_SEEDS - 1}),"
        f" {ITERATIONS} iterations (the grid's horizon), validation GenEval strict every {EVAL_EVERY} iterations."
        f" *Stable*: on every seed the final is at most {DROP_MARGIN} below the seed's best point, no point is more"
        f" than {COLLAPSE_MARGIN} below the base, no divergence. The chosen rung (bold) is each method's stable rung"
        " with the highest seed mean. *Last quarter*: the final minus the point at 3/4 of the horizon, seed mean"
        " (near 0 on a plateau).",
        "",
        f"Base: {base['curve'][0]['score']:.3f} on the validation prompts." if base else "Base: not run yet.",
        "",
        f"Cells done: {sum(1 for s in planned if s.name in records)} of {len(planned)} planned"
        + (f"; not run yet: {len(missing)}." if missing else "."),
        "",
        "| method | recipe | lr | final per seed | mean | last quarter | worst drop from own best "
        "| lowest point - base | stable |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in done:
        c = chosen.get(r.method)
        mark = "**" if c is not None and (c.recipe, c.lr) == (r.recipe, r.lr) else ""  # (NaN fields: not ==)
        finals = ", ".join("diverged" if f == float("-inf") else f"{f:.3f}" for f in r.finals)
        lines.append(
            f"| {LABELS[r.method]} | {r.recipe} | {mark}{r.lr:g}{mark} | {finals} | {mark}{r.mean:.3f}{mark} | "
            f"{r.last_quarter:+.3f} | {r.worst_drop:+.3f} | {r.worst_below_base:+.3f} | "
            f"{'yes' if stable(r) else 'no'} |"
        )
    lines.append("")
    if base is not None:
        lines += strength_lines(chosen_as_methods(records), chosen, TUNING_SEEDS)
    lines += ["## Curves (seed mean of validation strict at each evaluation point)", ""]
    lines += curve_lines(records, EVAL_EVERY, ITERATIONS)
    lines += ["", "## Choice", ""]
    for m in METHODS:
        c = chosen[m]
        rungs_planned = {(s.variant, s.lr) for s in planned if s.method == m and s.phase == "tune"}
        rungs_done = {(r.recipe, r.lr) for r in done if r.method == m}
        pending = len(rungs_planned - rungs_done)
        status = f" (provisional: {pending} of its {len(rungs_planned)} rungs not finished)" if pending else ""
        lines.append(
            f"- {LABELS[m]}: "
            + (f"{c.recipe} at lr {c.lr:g} (mean {c.mean:.3f}){status}" if c else f"not chosen yet{status}")
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare.tuning", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "v3-tuning", help="records folder")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks-v3")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--allow-load", action="store_true", help="start cells while other processes load the cores")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    args.quick, args.rerun_loaded, args.grid = False, False, "v2"  # the cells run at the v2 grid's sizes
    args.records = args.docs / "tuning" / "cells.jsonl"
    args.records.parent.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cell_runs.sync_records(out, args.records, export=False)
    started = time.perf_counter()
    args.started_at = time.strftime("%Y-%m-%dT%H:%M:%S")
    sizes = Sizes()
    eval_prompt_file(out, "geneval", "val", sizes)  # written once here, not by two cells at once
    while not args.report_only:
        todo = [s for s in plan(load_records(out)) if not (out / f"{s.name}.json").is_file()]
        if not todo:
            break
        cell_runs.run_phase(todo, args, sizes, out, started)
        if all(not (out / f"{s.name}.json").is_file() for s in todo):
            print("no cell of this round finished; see the logs", file=sys.stderr)
            return 1
    records = load_records(out)
    command = "python -m benchmarks.compare.tuning"
    write_text_atomic(args.docs / "tuning.md", report(records, plan(records), command))
    print(json.dumps({m: (c.recipe, c.lr) if c else None for m, c in choose(records).items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
