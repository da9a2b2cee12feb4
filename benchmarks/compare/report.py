"""Turn the cells of :mod:`benchmarks.compare` into the benchmark report (markdown, PNG plots) and MLflow runs.

    python -m benchmarks.compare.report runs/bench/full docs/benchmarks [--tracking-uri sqlite:////abs/mlflow.db]
    python -m benchmarks.compare.report docs/benchmarks/cells.jsonl docs/benchmarks  # again, from the records
    python -m benchmarks.compare.report docs/benchmarks-v3/grid/cells.jsonl docs/benchmarks-v3/grid --grid v3

Every number in the report is computed from the cell records (:mod:`~benchmarks.compare.analysis` and
:mod:`~benchmarks.compare.bootstrap` for the intervals, :mod:`~benchmarks.compare.claims` for the verdicts); nothing
is typed in by hand. The protocol below is printed at the top of the report with the sizes the cells ran at.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from benchmarks.common import LABELS, METHODS
from benchmarks.compare import plan_v3
from benchmarks.compare.analysis import AXES, N_BOOT, Analysis, load_records, write_records
from benchmarks.compare.claim_rows import claim_rows
from benchmarks.compare.claims import CONVERGED_GAIN, E3_MARGIN, MARGIN, V2, V3
from benchmarks.compare.collapse import COLLAPSE_DROP, SPIKE_FACTOR
from benchmarks.compare.method_tables import PLATEAU, cost_ratios, methods_table, time_to_reward
from benchmarks.compare.mlflow_runs import track
from benchmarks.compare.phase_tables import (
    ablation_table,
    preference_table,
    provenance_table,
    quick_table,
    stability_table,
    sweep_table,
)
from benchmarks.compare.plan import (
    PHASES,
    QUICK,
    SWEEP_BOUNDS,
    SWEEP_LADDER,
    RunSpec,
    Sizes,
    full_plan,
    plan_phase,
    stage_config,
    stage_lr,
)
from benchmarks.compare.plots import plot_curves
from benchmarks.compare.verdicts import NEAR, REFINED, Row, claims_table
from benchmarks.provenance import LOADED_CORES, code_hash
from vgrpo.atomic import write_text_atomic

PROTOCOL = """\
## Protocol

- **Model and task.** Every cell trains a LoRA (r 32) on `models/embedded-base`, on the GenEval stage
  (`params/stages/embedded/2-geneval.yaml`: world GenEval, GenEval's strict verdict as the reward) or the
  preference stage (`1-preference.yaml`: world PickScore and CLIPScore), with the same rollout for every method:
  {prompts} prompts x {group} samples per iteration, {steps} sampling steps. Each method adds its own recipe
  (`params/algorithms/<method>.yaml`).
- **Evaluation.** Every evaluation point of every cell scores the same {test_prompts} test prompts (GenEval tags,
  as many of each; the preference stage's {pref_prompts} add OCR prompts) x {eval_group} image, {eval_steps} Euler
  steps, sampling seed 0, so every comparison is paired on prompts and images. The prompts are drawn like the
  world's test split from a seed of the bench's own; the sweep scores a validation draw ({val_prompts} prompts)
  from another seed, never the test prompts. The GenEval score is the mean of the per-tag strict credits.
- **Learning rates.** Each method's rate is a rung of a ladder ({ladder}, a factor 2 apart), {sweep_seeds} seeds x
  {sweep_it} iterations per rung, scored on the validation prompts; the rung with the highest seed mean is chosen,
  and while it is at an edge of the ladder the next rung out is added (within {bounds}).
- **Seeds.** {seeds} training seeds per method ({iterations} iterations, evaluated every {every}); {abl_seeds} per
  ablation, compared with all of V-GRPO's; {pref_seeds} per preference cell ({pref_it} iterations); {stab_seeds}
  fresh seeds per stability cell ({stab_it} iterations, evaluated every {stab_every}) at {mults} each method's own
  rate in both stages.
- **Intervals.** 95% percentile bootstrap ({n_boot} replicates; {refined} for a claim row whose p lies within a
  factor {near:g} of 0.05): prompts resampled within each tag (the same draw for every group of a reward) and each
  group's seeds resampled, so every interval carries the seed spread. A claim row's interval is the hull of that
  and a t interval over seeds (Welch, unbiased variances, the prompts' interaction with the difference added:
  `benchmarks/compare/studentized.py`), since at 3-9 seeds the percentile bootstrap is too narrow.
- **Rules, fixed before the grid ran** (`benchmarks/compare/`: `claims.py`, `analysis.py`). Non-inferiority margin
  {margin_g} GenEval strict ({margin_p} world PickScore); *fails to converge*: a final gain over the base of at most
  {converged}; *adds little*: less than the margin; *collapse*: a divergence, or a drop below the base of more than
  {drop_g} GenEval strict ({drop_p} world PickScore) at any evaluation point; *spike*: an iteration's gradient norm
  or surrogate magnitude above {spike:g}x the median of the cell's first ten; *plateaued*: the last quarter's change
  within +-{plateau}. Efficiency: V-GRPO's score at a fraction r of the other method's budget minus the other's
  score at its full budget, on the paper's axis (iterations for MixGRPO; DiffusionNFT's gradient steps are its
  iterations here, 2 per iteration for every method), wall time as a second row; time to reward is secondary.
- **Verdicts.** Each row's two-sided p-value against its threshold, the larger of the bootstrap's and the t test's
  (so no random stream moves a verdict the t test holds back); the confirmatory rows (the paper's main claims) are
  Holm-corrected together, the exploratory ones are not and say so. The t test, the hull interval, the refined
  replicates, E3's margin (the paper's own 0.03, was 0.02) and the own-rate stability rows were added after the grid
  ran (issue 47): the first three only make a verdict harder to pass; E3's wider margin makes its claim easier
  to reproduce.
- **Machine.** {workers} cell at a time, {threads} torch threads; the runner holds a cell back while other
  processes use more than {loaded} cores, and every cell records the load it ran under (provenance below); the
  clean per-iteration costs against the number of steps are in [speed.md](speed.md).
"""


PROTOCOL_V3 = """\
## Protocol (pre-registered)

The rows, rules, seeds and stopping rule were fixed in
[docs/benchmarks/v3-preregistration.md](../../benchmarks/v3-preregistration.md), committed before the first cell;
any deviation from it is listed there and at the top of this report. The v2 grid
([docs/benchmarks](../../benchmarks/README.md)) is exploratory history.

- **Model, task and evaluation: as v2.** Every cell trains a LoRA (r 32) on `models/embedded-base`, on the GenEval
  stage or the preference stage, {prompts} prompts x {group} samples per iteration, {steps} sampling steps; every
  evaluation point scores the same {test_prompts} test prompts ({pref_prompts} in the preference stage) x
  {eval_group} image, {eval_steps} Euler steps, sampling seed 0, paired across methods; every method is scored by
  its policy alone.
- **Recipes and rates: chosen by the tuning sweep** ([../tuning.md](../tuning.md); its candidates and stability
  criterion committed before its first cell), on the validation prompts at the grid's horizon. Each method's
  recipe and rate are in the table below; the preference stage keeps its own rate ({pref_lr:g}).
- **Seeds, all fresh** (no v2 or tuning seed): {seeds} per method ({iterations} iterations, evaluated every
  {every}); {abl_seeds} per ablation; {pref_seeds} per preference cell ({pref_it} iterations); stress cells at
  {mults} each method's own rate, {stab_seeds} per GenEval cell and {pref_stress} per preference cell, and own-rate
  cells at the same cadence, {own_seeds} per cell ({stab_it} iterations, evaluated every {stab_every}).
- **p-values, intervals and verdicts.** Each row's p is the larger of the two-sided bootstrap p ({n_boot}
  replicates over prompts within tags and each group's seeds; {refined} for a row within a factor {near:g} of 0.05)
  and the t test's (Welch over seeds, unbiased variances, the prompts' interaction added); the interval is the hull
  of the two 95% intervals. The {family} confirmatory rows are Holm-corrected together (a row not run counting as
  p = 1); the estimation rows, which no affordable seed count powers, say so in their note: their interval is the
  result.
- **Rules** as v2 (`benchmarks/compare/claims.py`): non-inferiority margin {margin_g} GenEval strict ({margin_p}
  world PickScore), E3's {e3_margin:g} (the paper's own gap); collapse: a divergence or a drop below the base of
  more than {drop_g} GenEval strict ({drop_p} world PickScore) at any evaluation point.
- **Stopping rule.** Every planned cell runs once; no interim look at a confirmatory statistic; a cell that
  crashes for a machine reason runs again with the same seed, a divergence is data; cells that ran under load keep
  their scores, and their wall times are left out of E4/E5.
- **Machine** (the invocations grid.json records): {machine}. A record says the load its cell ran under.
"""


QUICK_PROTOCOL = """\
## Protocol (quick)

V-GRPO and naive ELBO-GRPO on the GenEval stage (world GenEval, strict verdict as the reward), {prompts} prompts x
{group} samples per iteration, {iterations} iterations, seed 0, at the stage's learning rate and twice it (no sweep).
Each cell is scored once at the end on the same {test_prompts} test prompts x {eval_group} image as the full grid.
The difference carries a 95% bootstrap interval ({n_boot} replicates) over prompts, resampled within each tag and
paired on prompts and images; it is *resolved* when the interval excludes 0.
"""


def config_mismatches(records: dict[str, dict[str, Any]], sizes: Sizes) -> list[str]:
    """The trained cells whose recorded config differs from the one this checkout's plan gives their spec.

    A record is read through the plan's config model, so a setting added after the cell ran (absent from its
    record) counts as the default it ran with; a setting removed since (unknown to the model) is a difference."""
    out = []
    for name, r in sorted(records.items()):
        if r["spec"]["phase"] == "base" or "config" not in r:
            continue
        spec = RunSpec(**r["spec"])
        planned = stage_config(spec, sizes, Path(r["config"]["eval_prompts"]))
        try:
            recorded = type(planned).model_validate(r["config"]).model_dump(mode="json")
        except ValidationError:
            recorded = r["config"]
        if planned.model_dump(mode="json") != recorded:
            out.append(name)
    return out


def tuned_table(tuned: dict[str, plan_v3.Tuned], lines: list[str]) -> None:
    """Each method's recipe and rate, as the tuning sweep chose them."""
    lines += ["## Recipes and rates (the tuning sweep's choice)", "", "| method | recipe | rate | settings |"]
    lines.append("|---|---|---|---|")
    for m, t in tuned.items():
        settings = json.dumps(t.overrides, sort_keys=True) if t.overrides else "its params/algorithms preset"
        lines.append(f"| {LABELS[m]} | {t.recipe} | {t.lr:g} | `{settings}` |")
    lines.append("")


def invocation_summary(history: list[dict[str, Any]]) -> str:
    """The grid's invocations grouped by how they ran: ``2 of 1 cell x 2 threads (3.1 h); ...``."""
    groups: dict[tuple[int, int], list[float]] = {}
    for h in history:
        groups.setdefault((int(h.get("workers", 1)), int(h.get("threads", 2))), []).append(float(h["elapsed_s"]))
    if not groups:
        return "none recorded yet"
    return "; ".join(
        f"{len(times)} of {w} cell(s) at a time x {t} thread(s) ({sum(times) / 3600:.1f} h)"
        for (w, t), times in sorted(groups.items())
    )


def protocol_lines(
    sizes: Sizes, quick: bool, tuned: dict[str, plan_v3.Tuned] | None, history: list[dict[str, Any]]
) -> str:
    """The protocol section with the sizes the cells ran at: the quick grid's, v2's, or v3's (``tuned``)."""
    last = history[-1] if history else {}
    if quick:
        return QUICK_PROTOCOL.format(
            prompts=sizes.prompts,
            group=sizes.group,
            iterations=sizes.iterations,
            test_prompts=sizes.test_prompts,
            eval_group=sizes.eval_group,
            n_boot=N_BOOT,
        )
    common = {
        "prompts": sizes.prompts,
        "group": sizes.group,
        "steps": sizes.eval_steps,
        "test_prompts": sizes.test_prompts,
        "pref_prompts": sizes.preference_prompts,
        "eval_group": sizes.eval_group,
        "eval_steps": sizes.eval_steps,
        "seeds": sizes.seeds,
        "iterations": sizes.iterations,
        "every": sizes.eval_every,
        "abl_seeds": sizes.ablation_seeds,
        "pref_seeds": sizes.preference_seeds,
        "pref_it": sizes.preference_iterations,
        "stab_seeds": sizes.stability_seeds,
        "stab_it": sizes.stability_iterations,
        "stab_every": sizes.stability_eval_every,
        "mults": " and ".join(f"{x:g}x" for x in sizes.stability_multipliers),
        "n_boot": N_BOOT,
        "refined": f"{REFINED:,}",
        "near": NEAR,
        "margin_g": MARGIN["geneval"],
        "margin_p": MARGIN["preference"],
        "drop_g": COLLAPSE_DROP["geneval"],
        "drop_p": COLLAPSE_DROP["preference"],
        "workers": last.get("workers", 1),
        "threads": last.get("threads", 2),
    }
    if tuned is not None:
        return PROTOCOL_V3.format(
            **common,
            pref_lr=stage_lr("preference"),
            pref_stress=plan_v3.PREFERENCE_STRESS_SEEDS,
            own_seeds=plan_v3.OWN_RATE_SEEDS,
            family=len(V3.confirmatory),
            e3_margin=E3_MARGIN,
            machine=invocation_summary(history),
        )
    return PROTOCOL.format(
        **common,
        val_prompts=sizes.val_prompts,
        ladder=", ".join(f"{x:g}" for x in SWEEP_LADDER),
        sweep_seeds=sizes.sweep_seeds,
        sweep_it=sizes.sweep_iterations,
        bounds=f"{SWEEP_BOUNDS[0]:g} to {SWEEP_BOUNDS[1]:g}",
        converged=CONVERGED_GAIN,
        spike=SPIKE_FACTOR,
        plateau=PLATEAU,
        loaded=LOADED_CORES,
    )


def _invocations(docs: Path) -> list[dict[str, Any]]:
    """The grid's invocations as ``grid.json`` beside the records lists them (elapsed seconds, workers, threads)."""
    path = docs / "grid.json"
    return list(json.loads(path.read_text())) if path.is_file() else []


def write_report(
    out: Path,
    docs: Path,
    *,
    command: str,
    planned: Sequence[str],
    quick: bool = False,
    tracking_uri: str | None = None,
    sizes: Sizes | None = None,
    code_now: str | None = None,
    tuned: dict[str, plan_v3.Tuned] | None = None,
) -> list[Row]:
    """Write ``docs/README.md`` and the plots from the cell records in ``out`` (a folder or a ``cells.jsonl``),
    and the MLflow runs; return the claim rows. With ``tuned`` (each method's recipe and rate), the report is
    benchmark v3's: its protocol, its claim set (:data:`benchmarks.compare.claims.V3`) and no sweep."""
    records = load_records(out)
    sizes = sizes or (QUICK if quick else Sizes())
    docs.mkdir(parents=True, exist_ok=True)
    claims = V2 if tuned is None else V3
    an = Analysis(records)
    history = _invocations(docs)
    if tuned is not None:
        title = "# Benchmark v3: the pre-registered replication on the embedded default"
        alone = "python -m benchmarks.compare --grid v3 --report-only"
    else:
        title = "# Benchmarks: V-GRPO and the baselines on the embedded default"
        folder = "docs/benchmarks-quick" if quick else "docs/benchmarks"
        alone = f"python -m benchmarks.compare.report {folder}/cells.jsonl {folder}{' --quick' if quick else ''}"
    lines = [
        title,
        "",
        f"Produced by `{command}`; the report alone, from the committed records: `{alone}`. Machine: 2 CPU cores, "
        "no GPU.",
        "",
        protocol_lines(sizes, quick, tuned, history),
    ]
    if tuned is not None:
        tuned_table(tuned, lines)
    done = [n for n in planned if n in records]
    missing = [n for n in planned if n not in records]
    elapsed = sum(float(x["elapsed_s"]) for x in history) if history else float("nan")
    cell_s = sum(float(r.get("wall_s", 0.0)) for r in records.values())
    lines += [
        f"Cells done: {len(done)} of {len(planned)} planned. Machine time: the {len(history)} invocation(s) recorded "
        f"in grid.json took {elapsed / 3600:.2f} h; the cells' own wall time (loading, training, evaluations) sums "
        f"to {cell_s / 3600:.2f} h.",
        "",
    ]
    if missing:
        lines += [f"Not run yet ({len(missing)}; the command resumes the grid): {', '.join(missing)}", ""]
    later = PHASES[2:]
    if tuned is None and not quick and not any(n.startswith(tuple(f"{p}-" for p in later)) for n in planned):
        every = {m: 1e-4 for m in METHODS}  # the count does not depend on the rates
        count = sum(len(plan_phase(p, sizes, every, False)) for p in later)
        lines += [
            f"The phases after the sweep ({', '.join(later)}: {count} cells at these sizes) are planned when the "
            "sweep has chosen every method's rate.",
            "",
        ]
    rows: list[Row] = []
    if an.base and not quick:
        rows = claim_rows(an, claims=claims)
        lines += claims_table(rows, len(claims.confirmatory))
        if an.groups:
            methods_table(an, lines)
            cost_ratios(an, (out.parent if out.is_file() else docs) / "speed", lines)  # speed.md's repeats
            time_to_reward(an, lines)
            for axis in AXES:
                plot_curves(
                    an, axis, docs / f"geneval-vs-{axis}.png", f"test GenEval strict vs {AXES[axis].split(' (')[0]}"
                )
                lines += [f"![GenEval vs {axis}](geneval-vs-{axis}.png)", ""]
            lines += [
                "Bands: each method's own 95% interval over prompts and seeds at each evaluation point; they include "
                "the prompts' shared difficulty, which the paired differences remove.",
                "",
            ]
        stability_table(an, lines)
        ablation_table(an, lines)
        preference_table(an, lines)
    sweep_table(an, sizes, lines)
    if quick:
        quick_table(an, lines)
    provenance_table(records, code_now, config_mismatches(records, sizes), lines)
    write_text_atomic(docs / "README.md", "\n".join(lines) + "\n")
    if out.is_dir():  # the records themselves (the report's only input), so the numbers can be recomputed
        write_records(docs / "cells.jsonl", records)
    if tracking_uri:
        track(records, tracking_uri, grid="v3" if tuned else "quick" if quick else "full", claims=rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the cells' folder (runs/bench/full) or a report's cells.jsonl")
    parser.add_argument("docs", type=Path, help="report folder")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--grid", choices=("v2", "v3"), default="v2", help="the grid the records are of")
    args = parser.parse_args()
    records = load_records(args.out)
    tuned = None
    if args.grid == "v3":
        try:
            tuned = plan_v3.load_tuned()
        except RuntimeError as exc:
            parser.error(f"--grid v3: {exc}")
        sizes, planned = plan_v3.V3, [s.name for s in plan_v3.full_plan(tuned)]
    else:
        sizes = QUICK if args.quick else Sizes()
        planned = [s.name for s in full_plan(records, sizes, args.quick)]
    write_report(
        args.out,
        args.docs,
        command="python -m benchmarks.compare" + (" --quick" if args.quick else " --grid v3" if tuned else ""),
        planned=planned,
        quick=args.quick,
        tracking_uri=args.tracking_uri,
        sizes=sizes,
        code_now=code_hash(),
        tuned=tuned,
    )


if __name__ == "__main__":
    main()
