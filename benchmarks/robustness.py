"""The curriculum over training seeds x float orders: one record per run, and the table of gains over runs.

    python -m benchmarks.robustness grid --seeds 0 1 2 --threads 1 2        # about 35-40 min a run on 2 cores
    python -m benchmarks.robustness table metrics/curriculum_runs.json      # median, min, max gain over runs
    python -m benchmarks.robustness table --stages A.json B.json            # each run's stages on validation
    python -m benchmarks.robustness compare --setting A.json --reference B.json --stage NAME  # a setting, paired

A run trains every stage of the curriculum (default ``params/curricula/embedded-validation.yaml``: the shipped
stages, each evaluated on the validation split) with training ``seed`` S on T torch threads (1 and 2 threads sum
floats in other orders, as another CPU does) in its own process, under ``runs/robustness/seedS-threadsT``. It then
evaluates the base and the last stage's adapter on the validation split (``params/embedded/evaluate.yaml`` with
``params/embedded/validation.yaml``: 560 prompts x 4, seed 1), pairs them image by image
(:func:`vgrpo.evaluation.tables.compare`: each gain with its paired 95% bootstrap interval), and measures clutter on
validation (:mod:`benchmarks.clutter`), both on the same machine and threads as the training. The records and their
tables are :mod:`benchmarks.curriculum_runs`.

Runs that tune read validation only (:mod:`vgrpo.splits`): a stage that evaluates on the test split, or a
``--validation-prompts`` that is the test split, is refused before any run starts. ``--final-report`` evaluates the
last adapter on the test split instead (``--test-prompts``, seed 0), and only for a curriculum whose ``choices`` are
all tuning records that read validation, none of them ``--out``. Every record says which prompts its gains read
(``split``: role, file and SHA-256).

Each finished run adds its record to ``--out`` (tuning: ``metrics/tuning/curriculum-runs.json``; the final report:
``metrics/curriculum_runs.json``), atomically: ``seed``, ``threads``, ``cpu``, ``commit`` (and ``code_dirty``),
``wall_s``, ``split``, per headline reward (``geneval_strict``,
``geneval_partial``, ``ocr``, ``world_clipscore``, ``world_pickscore``) its ``base``, ``final``, ``gain``, ``lo`` and
``hi``, each stage's validation numbers (``stages``, the base first) and the clutter of the base and after each
stage. Resumable by run: a run whose record is in ``--out`` is skipped (``--redo`` runs it again), and a killed run
restarts where it stopped (finished stages are kept with their evaluations, a stage in progress resumes from its
last checkpoint, the base's evaluation is kept). ``--set KEY=VALUE`` overrides every stage (``--set iterations=2``
for a quick look; such records say so in ``overrides``). ``--reuse OTHER_RUN_ROOT`` copies each stage another grid
trained with the same params from the same start (same seed and threads) instead of training it again, so a variant
of a late stage trains that stage alone; its records name the stages copied (``reused``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from benchmarks.curriculum_runs import (
    STAGE_COLUMNS,
    gains_table,
    give_backs,
    headline_gains,
    merge_record,
    paired_stage_table,
    read_records,
    stages_table,
)
from vgrpo.atomic import write_json_atomic
from vgrpo.splits import split_record

__all__ = ["main", "reusable_stage", "run_one"]

REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _stage_numbers(flat: Mapping[str, float]) -> dict[str, float]:
    return {name: round(float(flat[key]), 5) for name, key in STAGE_COLUMNS.items() if key in flat}


@dataclass(frozen=True)
class RunInputs:
    """What one run of a grid reads besides its seed and threads (the ``one`` and ``grid`` flags of the same names;
    ``overrides`` from ``--set``): every run of a grid shares them."""

    curriculum: Path
    run_root: Path
    root: Path
    evaluate_params: Path
    test_prompts: Path
    validation_prompts: Path
    overrides: Mapping[str, Any]
    reuse: Path | None = None
    validation_params: Path = Path("params/embedded/validation.yaml")
    final_report: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunInputs:
        """The inputs of a parsed ``one`` command line."""
        from vgrpo.params_file import overrides_from_pairs

        named = {f.name: getattr(args, f.name) for f in fields(cls) if f.name != "overrides"}
        return cls(**named, overrides=overrides_from_pairs(args.set))


def run_one(seed: int, threads: int, inputs: RunInputs) -> dict[str, Any]:
    """One run (this process, ``threads`` torch threads): the curriculum's stages (kept when finished, resumed when
    not, or copied from ``inputs.reuse``'s run of the same seed and threads when that one trained the same stage
    from the same start: :func:`reusable_stage`), the headline evaluation paired with the base's on the validation
    split (the test split with ``final_report``), clutter on validation; its record."""
    from benchmarks.clutter import measure
    from benchmarks.provenance import cpu_model
    from tasks.stage import dir_hash, output_is_intact, run_tracked_stage, stage_dirs
    from vgrpo.cli import use_threads
    from vgrpo.config import load_config, load_curriculum
    from vgrpo.evaluation.config import EvaluationConfig
    from vgrpo.evaluation.report import evaluate_to_files

    use_threads(threads, flush_denormal=True)
    root, run_root, final_report = inputs.root, inputs.run_root, inputs.final_report
    started = time.perf_counter()
    commit = _git("rev-parse", "HEAD") or None  # the code this process runs, whatever is committed while it runs
    code_dirty = bool(_git("status", "--porcelain", "--", "vgrpo", "tasks", "benchmarks", "params"))
    _, stages = load_curriculum(root / inputs.curriculum, {**inputs.overrides, "seed": seed}, root=root)
    run_dir = run_root / f"seed{seed}-threads{threads}"
    init: str | None = None
    numbers: list[dict[str, Any]] = []
    reused: list[str] = []
    reuse = inputs.reuse
    source = reuse / run_dir.name if reuse is not None and reuse.resolve() != run_root.resolve() else None
    for cfg in stages:
        out_dir, _ = stage_dirs(str(run_dir), cfg.name)
        init_hash = dir_hash(root / init) if init else None
        kept = run_dir / "stages" / f"{cfg.name}.eval.json"
        done = json.loads(kept.read_text()) if kept.is_file() else None
        intact = output_is_intact(cfg, str(run_dir), init_hash)
        if source is not None and not intact and (copied := reusable_stage(cfg, init_hash, source)) is not None:
            shutil.copytree(copied[0], out_dir, dirs_exist_ok=True)
            done = copied[1] | {"reused_from": str(source)}
            write_json_atomic(kept, done)
            reused.append(cfg.name)
        elif not (done and intact and done["adapter_hash"] == dir_hash(out_dir)):
            outcome = run_tracked_stage(cfg, init, str(run_dir), str(root))
            start = next((e for e in outcome.evaluations if e.get("iteration") == 0), None)
            done = {
                "stage": cfg.name,
                "adapter_hash": outcome.hash,
                "start": _stage_numbers(start) if start else None,
                "final": _stage_numbers(outcome.final_eval),
                "kept_iteration": outcome.hold["kept_iteration"] if outcome.hold else None,
                "hold": outcome.hold or None,  # every check's numbers: what the kept checkpoint was chosen from
            }
            write_json_atomic(kept, done)
        if not numbers and done["start"] is not None:
            numbers.append({"stage": "base", **done["start"]})
        numbers.append(
            {"stage": cfg.name, "kept_iteration": done["kept_iteration"], "hold": done.get("hold"), **done["final"]}
        )
        init = str(out_dir)
    role, prompts = ("test", inputs.test_prompts) if final_report else ("validation", inputs.validation_prompts)
    params = [root / inputs.evaluate_params] + ([] if final_report else [root / inputs.validation_params])
    evaluation = load_config(params, section="evaluation", schema=EvaluationConfig)
    pipeline = root / stages[0].pipeline
    suffix = "" if final_report else ".validation"  # a final report's files keep the names earlier runs wrote
    base_eval = run_dir / f"base_eval{suffix}.json"
    if not base_eval.is_file():  # the base on this machine and threads: its images pair with the run's
        evaluate_to_files(evaluation, pipeline, root / prompts, base_eval)
    final = evaluate_to_files(
        evaluation, pipeline, root / prompts, run_dir / f"eval{suffix}.json", lora=init, baseline=base_eval
    )
    clutter = measure(run_dir, root / inputs.curriculum, root / inputs.validation_prompts, root)
    return {
        "seed": seed,
        "threads": threads,
        "cpu": cpu_model(),
        "commit": commit,
        "code_dirty": code_dirty,
        "curriculum": str(inputs.curriculum),
        "overrides": dict(inputs.overrides),
        "wall_s": round(time.perf_counter() - started, 1),
        "split": split_record(root / prompts, role),
        "rewards": headline_gains(final, json.loads(base_eval.read_text())),
        "stages": numbers,
        "give_backs": give_backs(numbers),
        "reused": {"from": str(source), "stages": reused} if reused else None,
        "clutter": {
            "base": clutter[0]["clutter"],
            "final": clutter[-1]["clutter"],
            "stages": [{k: r[k] for k in ("stage", "clutter", "ci", "images")} for r in clutter],
        },
    }


def reusable_stage(cfg: Any, init_hash: str | None, source: Path) -> tuple[Path, dict[str, Any]] | None:
    """The adapter folder of stage ``cfg`` in another run's folder ``source`` and its kept evaluation, when that run
    trained it with the same training fingerprint from the same starting adapter (``init_hash``) and its bytes are
    the ones its manifest and its kept evaluation name; else None. The code may differ: a record that reuses stages
    says which, and from where (its ``reused``)."""
    from tasks.stage import MANIFEST, dir_hash, stage_dirs
    from vgrpo.checkpoints.resume import training_hash

    out_dir, work_dir = stage_dirs(str(source), cfg.name)
    try:
        manifest = json.loads((work_dir / MANIFEST).read_text())
        kept = json.loads((source / "stages" / f"{cfg.name}.eval.json").read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("fingerprint") != training_hash(cfg) or manifest.get("init_hash") != init_hash:
        return None
    if not out_dir.is_dir() or not dir_hash(out_dir) == manifest.get("hash") == kept.get("adapter_hash"):
        return None
    return out_dir, kept


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--curriculum", type=Path, default=Path("params/curricula/embedded-validation.yaml"))
    parser.add_argument("--run-root", type=Path, default=Path("runs/robustness"))
    parser.add_argument("--root", type=Path, default=Path("."), help="the folder the params' paths are relative to")
    parser.add_argument("--evaluate-params", type=Path, default=Path("params/embedded/evaluate.yaml"))
    parser.add_argument("--test-prompts", type=Path, default=Path("data/world/test.jsonl"))
    parser.add_argument("--validation-prompts", type=Path, default=Path("data/world/validation.jsonl"))
    parser.add_argument(
        "--validation-params",
        type=Path,
        default=Path("params/embedded/validation.yaml"),
        help="merged after --evaluate-params for the validation evaluation (its noise seed)",
    )
    parser.add_argument(
        "--final-report",
        action="store_true",
        help="evaluate the last adapter on the test split (a curriculum whose choices are on record on validation)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="the records file (default: metrics/tuning/curriculum-runs.json; with --final-report "
        "metrics/curriculum_runs.json)",
    )
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of every stage")
    parser.add_argument(
        "--reuse",
        type=Path,
        help="another grid's run root: a stage it trained with the same params from the same start is copied, "
        "not trained again (its code may differ; the record says which stages)",
    )


def _forward(args: argparse.Namespace) -> list[str]:
    """The common arguments again, for a run's process."""
    out = ["--curriculum", str(args.curriculum), "--run-root", str(args.run_root), "--root", str(args.root)]
    out += ["--evaluate-params", str(args.evaluate_params), "--test-prompts", str(args.test_prompts)]
    out += ["--validation-prompts", str(args.validation_prompts), "--out", str(args.out)]
    out += ["--validation-params", str(args.validation_params)] + (["--final-report"] if args.final_report else [])
    out += ["--reuse", str(args.reuse)] if args.reuse else []
    return out + (["--set", *args.set] if args.set else [])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    grid = sub.add_parser("grid", help="every seed x thread count without a record, each in its own process")
    grid.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    grid.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    grid.add_argument("--redo", action="store_true", help="run again the runs that have a record")
    _common(grid)
    one = sub.add_parser("one", help="one run in this process (what grid starts)")
    one.add_argument("--seed", type=int, required=True)
    one.add_argument("--threads", type=int, required=True)
    _common(one)
    table = sub.add_parser("table", help="the gains over runs of a records file, as Markdown")
    table.add_argument("records", type=Path, nargs="+")
    table.add_argument("--stages", action="store_true", help="each run's validation numbers after each stage")
    compare = sub.add_parser("compare", help="a setting's effect on a stage's validation numbers, paired by seed")
    compare.add_argument("--setting", type=Path, nargs="+", required=True, help="records of runs with the setting")
    compare.add_argument("--reference", type=Path, nargs="+", required=True, help="records of the runs without it")
    compare.add_argument("--stage", required=True, help="the stage compared")
    compare.add_argument("--threads", type=int, default=1, help="the thread count paired")
    args = parser.parse_args(argv)
    if args.command in ("grid", "one") and args.out is None:
        args.out = Path("metrics/curriculum_runs.json" if args.final_report else "metrics/tuning/curriculum-runs.json")
    if args.command in ("grid", "one"):
        from vgrpo.cli import configure_logging
        from vgrpo.errors import UserError

        configure_logging(-1)  # as `vgrpo -q`, before diffusers is imported: its notices would bury the message
        from benchmarks.robustness_checks import check_runs

        try:  # every bad argument or stage in one message, before a run's process starts or computes
            check_runs(args)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.command == "compare":
        changed = [record for path in args.setting for record in read_records(path)]
        reference = [record for path in args.reference for record in read_records(path)]
        print(paired_stage_table(changed, reference, args.stage, args.threads))
        return 0

    if args.command == "table":
        records = [r for path in args.records for r in read_records(path)]
        print(stages_table(records) if args.stages else gains_table(records))
        return 0
    if args.command == "one":
        record = run_one(args.seed, args.threads, RunInputs.from_args(args))
        merge_record(args.out, record)
        print(f"seed {args.seed}, {args.threads} threads: {json.dumps(record['rewards'])} -> {args.out}")
        return 0
    done = {(r["seed"], r["threads"]) for r in read_records(args.out)}
    failed = []
    for seed in args.seeds:
        for threads in args.threads:
            if (seed, threads) in done and not args.redo:
                print(f"seed {seed}, {threads} threads: recorded in {args.out}, kept")
                continue
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            cmd = [sys.executable, "-m", "benchmarks.robustness", "one", "--seed", str(seed), "--threads", str(threads)]
            print(f"seed {seed}, {threads} threads: running (under {args.run_root}/seed{seed}-threads{threads})")
            if subprocess.run([*cmd, *_forward(args)], env=env).returncode != 0:
                failed.append(f"seed {seed} x {threads} threads")
    records = read_records(args.out)
    if records:
        print(gains_table(records))
    if failed:
        print(f"failed (rerun the same command to resume them): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
