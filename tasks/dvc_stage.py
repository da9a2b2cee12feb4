"""One curriculum stage as a DVC stage (``dvc repro stage@3``), the same body as the flow's train-stage task.

    python -m tasks.dvc_stage --curriculum params/curricula/embedded.yaml --stage 3 --run-root runs/dvc \\
        --metrics metrics/stages/3.json --details metrics/stages/3.eval.json --plots plots/stages/3.json

Stage ``N`` starts from stage ``N - 1``'s adapter under the same ``--run-root`` (``--init`` names another one,
``--init none`` the base pipeline), so ``dvc repro stage@3`` reproduces stage 3 from stage 2's checkpoint.
``--params`` adds params files after the stage's own (an ablation), ``--set key.sub=value`` overrides entries.
When ``MLFLOW_TRACKING_URI`` is set, the stage is an MLflow run (tagged with the DVC stage name).

Writes, atomically, ``--metrics`` (a few headline numbers with short names for ``dvc metrics show``: iterations,
wall time, the final evaluation's GenEval strict / partial, OCR, CLIPScore, PickScore), ``--details`` (the whole
final evaluation with its 95% CIs and per-tag scores, the evaluation before the first iteration when the stage made
one, the adapter's hash) and ``--plots`` (one row per iteration with the training rewards; ``tasks.dvc_report plots``
draws them).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tasks.outcome import StageOutcome
from tasks.stage import run_tracked_stage, stage_dirs
from vgrpo.atomic import write_json_atomic
from vgrpo.config import load_curriculum, overrides_from_pairs
from vgrpo.errors import ConfigError, UserError
from vgrpo.evaluation.tables import headline_metrics
from vgrpo.outputs import Output
from vgrpo.rewards.config import RewardConfig
from vgrpo.training.guards import TrainingDiverged
from vgrpo.training.preflight import PreflightError, check_or_raise

__all__ = ["main", "plot_rows", "stage_details", "stage_metrics"]

# Per-iteration diagnostics that go to the plots file (the full set goes to MLflow).
PLOT_PREFIXES = ("reward/", "train/kl", "train/ratio_mean", "train/clip_frac", "train/grad_norm", "surrogate/cv")


def plot_rows(history: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """One row per iteration: the iteration, its rewards and the main step diagnostics."""
    rows = []
    for i, metrics in enumerate(history):
        row = {"iteration": float(metrics.get("iteration", i))}
        row.update({k: v for k, v in metrics.items() if k.startswith(PLOT_PREFIXES) and not k.endswith("_std")})
        rows.append(row)
    return rows


def stage_details(outcome: StageOutcome, stage: int) -> dict[str, Any]:
    """The details file of a finished stage: final evaluation (``eval/...``), the evaluation before the first
    iteration when the stage made one (``start/eval/...``), training length and time, the adapter's hash."""
    start = next((e for e in outcome.evaluations if e["iteration"] == 0), {})
    return {
        "stage": stage,
        "name": outcome.name,
        "iterations": len(outcome.history),
        "resumed_from": outcome.resumed_from,
        "wall_s": round(outcome.wall_s, 1),
        "adapter_hash": outcome.hash,
        **{k: round(v, 5) for k, v in sorted(outcome.final_eval.items())},
        **{f"start/{k}": round(v, 5) for k, v in sorted(start.items()) if k != "iteration"},
        **({"hold": outcome.hold} if outcome.hold is not None else {}),
    }


def stage_metrics(details: Mapping[str, Any], rewards: Sequence[RewardConfig]) -> dict[str, Any]:
    """The metrics file of a finished stage, from its :func:`stage_details`: iterations, wall time and the
    headline numbers of its evaluation ``rewards`` (:func:`vgrpo.evaluation.tables.headline_metrics`)."""
    kept = {"kept_iteration": details["hold"]["kept_iteration"]} if "hold" in details else {}
    return {
        "iterations": details["iterations"],
        "wall_s": details["wall_s"],
        **kept,
        **headline_metrics(details, rewards),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.dvc_stage", description=__doc__.split("\n")[0])
    parser.add_argument("--curriculum", required=True, help="curriculum params file")
    parser.add_argument("--stage", type=int, required=True, help="1-based stage number in the curriculum")
    parser.add_argument("--run-root", required=True, help="adapters: RUN_ROOT/stages, checkpoints: RUN_ROOT/work")
    parser.add_argument(
        "--init",
        default=None,
        help="adapter to start from ('none': the base pipeline); default: the previous stage's under --run-root",
    )
    parser.add_argument("--params", nargs="*", default=[], help="extra params files merged after the stage's")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a params entry")
    parser.add_argument("--metrics", required=True, help="metrics JSON to write (headline numbers)")
    parser.add_argument("--details", default=None, help="JSON to write with the whole final evaluation")
    parser.add_argument("--plots", default=None, help="per-iteration plots JSON to write")
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: the curriculum's name)")
    parser.add_argument("--dvc-stage", default=None, help="the DVC stage's name for MLflow (default: stage@STAGE)")
    args = parser.parse_args(argv)
    try:
        spec, stages = load_curriculum(args.curriculum, overrides_from_pairs(args.set), extra=args.params)
        if not 1 <= args.stage <= len(stages):  # a missing --params file is reported by load_curriculum
            raise ConfigError(f"--stage {args.stage}: {args.curriculum} has stages 1..{len(stages)}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg = stages[args.stage - 1]
    run_root = Path(args.run_root)
    files = {"metrics": args.metrics, "details": args.details, "plots": args.plots}
    if args.init is None:
        init = str(run_root / "stages" / stages[args.stage - 2].name) if args.stage > 1 else None
    else:
        init = None if args.init == "none" else args.init
    if init is not None and not Path(init).is_dir():
        print(
            f"error: stage {args.stage} starts from {init}, which does not exist (run the previous stage)",
            file=sys.stderr,
        )
        return 2
    out_dir, work_dir = stage_dirs(run_root, cfg.name)
    written = [Output("stage output", out_dir), Output("--run-root work folder", work_dir, replaced=False)]
    written += [Output(f"--{k}", Path(v), is_file=True) for k, v in files.items() if v]
    try:  # every input the stage reads and every output it writes, listed in one message before any compute
        read = [args.curriculum, *spec.base, spec.model, *spec.stages, *args.params]
        params = {f"params file {file}": file for file in read}
        check_or_raise([cfg], init_lora=init, checkpoint_dir=run_root / "work", outputs=written, inputs=params)
    except PreflightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tags = {"vgrpo.runner": "dvc", "vgrpo.dvc_stage": args.dvc_stage or f"stage@{args.stage}"}
    if args.params:
        tags["vgrpo.extra_params"] = ",".join(args.params)
    try:
        outcome = run_tracked_stage(
            cfg,
            init,
            str(run_root),
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"),
            experiment=args.experiment or spec.name,
            tags=tags,
        )
    except UserError as exc:  # a reward that failed at run time: the message names it and the intact checkpoint
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingDiverged as exc:  # the message names the intact checkpoint a rerun resumes from
        print(f"error: {exc}", file=sys.stderr)
        return 3
    details = stage_details(outcome, args.stage)
    metrics = stage_metrics(details, cfg.evaluation.rewards)
    write_json_atomic(Path(args.metrics), metrics)
    if args.details:
        write_json_atomic(Path(args.details), details)
    if args.plots:
        write_json_atomic(Path(args.plots), plot_rows(outcome.history))
    print(f"stage {args.stage} ({cfg.name}): {metrics}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
