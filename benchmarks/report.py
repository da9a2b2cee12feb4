"""Turn the cells of :mod:`benchmarks.compare` into the benchmark report (markdown, PNG plots) and MLflow runs.

    python -m benchmarks.report runs/bench/full docs/benchmarks [--tracking-uri sqlite:////abs/mlflow.db]
    python -m benchmarks.report docs/benchmarks/cells.jsonl docs/benchmarks   # again, from the committed records

Every number in the report is computed from the cell records (:mod:`benchmarks.analysis` and
:mod:`benchmarks.bootstrap` for the intervals, :mod:`benchmarks.claims` for the verdicts); nothing is typed in by
hand. The protocol below is printed at the top of the report with the sizes the cells ran at.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.analysis import AXES, COLLAPSE_DROP, N_BOOT, Analysis, load_records
from benchmarks.claims import claim_rows, claims_table
from benchmarks.grid import QUICK, SWEEP_LADDER, Sizes
from benchmarks.mlflow_runs import track
from benchmarks.plots import plot_curves
from benchmarks.tables import methods_table, quick_table, stability_and_ablations, sweep_table

PROTOCOL = """\
## Protocol

- **Model and task.** Every cell trains a LoRA (r 32) on `models/embedded-base` on the GenEval stage
  (`params/stages/embedded/2-geneval.yaml`: world GenEval, GenEval's strict verdict as the reward), with the same
  rollout for every method: {prompts} prompts x {group} samples per iteration, {steps} sampling steps, two
  half-batch gradient steps per iteration. Each method adds its own recipe (`params/algorithms/<method>.yaml`).
- **Learning rates.** Each method runs at its own best learning rate, chosen by a sweep over {lrs} ({sweep_it}
  iterations, seed 0; a best rate at an edge is tried one factor 2 further) scored on a *validation* split
  ({val_prompts} GenEval prompts x {eval_group} images drawn from the world's generator with a seed of its own),
  never on the test split.
- **Seeds.** {seeds} training seeds per method; {stab_seeds} for the stability claim (V-GRPO and naive
  ELBO-GRPO at twice V-GRPO's best learning rate, {stab_it} iterations); one seed per ablation (paired with
  V-GRPO's seed-0 cell, so its interval is over prompts only).
- **Evaluation.** Every {every} iterations, and for the base once, the same {test_prompts} held-out test prompts
  (GenEval tags) x {eval_group} images = {images} images, {eval_steps} Euler steps, sampling seed 0 for every
  method; the score is GenEval's strict credit, the mean of its per-tag means.
- **Intervals.** 95% percentile bootstrap ({n_boot} replicates) over prompts (resampled within each tag, the
  same draw for every method, which pairs the comparison) and over each method's seeds. A difference is
  *resolved* only when its interval excludes 0; a target is *met* when its whole interval satisfies it, *missed*
  when none of it does, *unresolved* otherwise.
- **Time to reward.** Read off the piecewise-linear curve through the evaluation points (the base at 0): where
  V-GRPO's mean curve first reaches the other method's best point, divided by where that method reached it; per
  replicate, so the ratio carries an interval (`inf`: not reached within the budget in that share of replicates).
- **Collapse.** A cell collapsed when it diverged (non-finite iterations stopped it) or its final strict credit
  is more than {drop:.2f} below the base's.
- **Wall time.** Seconds of training per iteration as measured in the cells, which ran {workers} at a time with
  {threads} torch thread(s) each, so every method shared the machine the same way; the clean per-iteration costs
  against the number of steps are in [speed.md](speed.md).
"""


QUICK_PROTOCOL = """\
## Protocol (quick)

V-GRPO and naive ELBO-GRPO on the GenEval stage (world GenEval, strict verdict as the reward), {prompts} prompts x
{group} samples per iteration, {iterations} iterations, seed 0, at the stage's learning rate and twice it (no sweep).
Each cell is scored once at the end on the same {test_prompts} held-out test prompts x {eval_group} images =
{images} images as the full grid. The difference carries a 95% bootstrap interval ({n_boot} replicates) over
prompts, resampled within each tag and paired on prompts and images; it is *resolved* when the interval excludes 0.
"""


def _machine_share(out: Path) -> dict[str, Any]:
    """How the cells shared the machine, as the grid's last recorded invocation ran them (grid.json)."""
    path = (out.parent if out.is_file() else out) / "grid.json"
    last = json.loads(path.read_text())[-1] if path.is_file() else {}
    return {"workers": last.get("workers", "n/a"), "threads": last.get("threads", "n/a")}


def _grid_time(out: Path, records: dict[str, dict[str, Any]]) -> tuple[float, float]:
    """Elapsed seconds of the grid's invocations (grid.json) and the cells' summed wall time."""
    path = (out.parent if out.is_file() else out) / "grid.json"
    elapsed = sum(float(x["elapsed_s"]) for x in json.loads(path.read_text())) if path.is_file() else float("nan")
    return elapsed, sum(float(r.get("wall_s", 0.0)) for r in records.values())


def write_report(
    out: Path,
    docs: Path,
    *,
    command: str,
    planned: Sequence[str],
    quick: bool = False,
    tracking_uri: str | None = None,
    sizes: Sizes | None = None,
) -> None:
    """Write ``docs/README.md`` and the plots from the cell records in ``out`` (and the MLflow runs)."""
    records = load_records(out)
    docs.mkdir(parents=True, exist_ok=True)
    folder = "docs/benchmarks-quick" if quick else "docs/benchmarks"
    an = Analysis(records)
    lines = [
        "# Benchmarks: V-GRPO and the baselines on the embedded default",
        "",
        f"Produced by `{command}`; the report alone, from the committed records: `python -m benchmarks.report "
        f"{folder}/cells.jsonl {folder}{' --quick' if quick else ''}`. "
        "Machine: 2 CPU cores, no GPU.",
        "",
    ]
    if sizes is not None and quick:
        lines.append(
            QUICK_PROTOCOL.format(
                prompts=sizes.prompts,
                group=sizes.group,
                iterations=sizes.iterations,
                test_prompts=sizes.test_prompts,
                eval_group=sizes.eval_group,
                images=sizes.test_prompts * sizes.eval_group,
                n_boot=N_BOOT,
            )
        )
    elif sizes is not None:
        lines.append(
            PROTOCOL.format(
                prompts=sizes.prompts,
                group=sizes.group,
                steps=10,
                lrs=", ".join(f"{x:g}" for x in SWEEP_LADDER),
                sweep_it=sizes.sweep_iterations,
                val_prompts=sizes.val_prompts,
                eval_group=sizes.eval_group,
                seeds=sizes.seeds,
                stab_seeds=sizes.stability_seeds,
                stab_it=sizes.stability_iterations,
                every=sizes.eval_every,
                test_prompts=sizes.test_prompts,
                images=sizes.test_prompts * sizes.eval_group,
                eval_steps=sizes.eval_steps,
                n_boot=N_BOOT,
                drop=COLLAPSE_DROP,
                **_machine_share(out),
            )
        )
    done = [n for n in planned if n in records]
    missing = [n for n in planned if n not in records]
    elapsed, cell_s = _grid_time(out, records)
    lines += [
        f"Cells done: {len(done)} of {len(planned)}; the invocations recorded in grid.json took "
        f"{elapsed / 60:.1f} min; the cells' own wall time (model loading, training, evaluations) sums to "
        f"{cell_s / 60:.1f} min.",
        "",
    ]
    if missing:
        lines += [f"Not run yet ({len(missing)}; the command resumes the grid): {', '.join(missing)}", ""]
    rows: list[dict[str, Any]] = []
    if an.base and an.groups and not quick:
        rows = claim_rows(an, records)
        lines += claims_table(rows)
        methods_table(an, records, lines)
        for axis in AXES:
            plot_curves(
                an, axis, docs / f"geneval-vs-{axis}.png", f"held-out GenEval strict vs {AXES[axis].split(' (')[0]}"
            )
            lines += [f"![GenEval vs {axis}](geneval-vs-{axis}.png)", ""]
        lines += [
            "Bands: each method's own 95% interval over prompts and seeds at each evaluation point; they include "
            "the prompts' shared difficulty, which the paired differences above remove.",
            "",
        ]
        stability_and_ablations(an, records, lines)
    sweep_table(records, lines)
    if quick:
        quick_table(an, records, lines)
    (docs / "README.md").write_text("\n".join(lines) + "\n")
    # The records themselves (the report's only input), so that the numbers can be recomputed from the repository.
    if out.is_dir() and (out / "grid.json").is_file():
        (docs / "grid.json").write_text((out / "grid.json").read_text())
    (docs / "cells.jsonl").write_text("".join(json.dumps(records[k], sort_keys=True) + "\n" for k in sorted(records)))
    if tracking_uri:
        track(records, tracking_uri, grid="quick" if quick else "full", claims=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the cells' folder (runs/bench/full) or a report's cells.jsonl")
    parser.add_argument("docs", type=Path, help="report folder")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    records = load_records(args.out)
    write_report(
        args.out,
        args.docs,
        command="python -m benchmarks.compare" + (" --quick" if args.quick else ""),
        planned=list(records),
        quick=args.quick,
        tracking_uri=args.tracking_uri,
        sizes=QUICK if args.quick else Sizes(),
    )


if __name__ == "__main__":
    main()
