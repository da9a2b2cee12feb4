"""What ``python -m benchmarks.robustness grid`` and ``one`` check before a run's process starts or computes, all
reported in one :class:`vgrpo.training.preflight.PreflightError` (the command exits 2): the seeds and thread counts,
``--root``, ``--set``, ``--reuse``, every stage of the curriculum loaded and preflighted as ``vgrpo train`` does
(:func:`vgrpo.training.preflight.preflight`), the headline evaluation's params and inputs
(:func:`vgrpo.training.preflight.preflight_evaluation`), the validation prompts clutter reads, the records file
``--out``, the outputs (``--run-root``, ``--out``) against every input, and the split rule (:mod:`vgrpo.splits`):
no stage and no tuning evaluation reads the test split, and a final report's curriculum has its choices on record
on validation."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from vgrpo.config import CurriculumConfig, StageConfig, load_config, load_curriculum, overrides_from_pairs
from vgrpo.errors import UserError
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.outputs import Output, output_problems
from vgrpo.prompts import load_prompts
from vgrpo.splits import choice_record_problems, tuning_prompt_problems
from vgrpo.training.preflight import PreflightError, Problem, preflight, preflight_evaluation

__all__ = ["check_runs"]


def _argument_problems(seeds: list[int], threads: list[int], grid: bool) -> list[Problem]:
    """Seeds >= 0 (a run's folder and record are named by it), thread counts >= 1, none given twice."""
    out = []
    for flag, values, low in (("--seeds" if grid else "--seed", seeds, 0), ("--threads", threads, 1)):
        if bad := [v for v in values if v < low]:
            out.append(Problem(f"{flag} {' '.join(map(str, bad))}: each must be >= {low}"))
        if twice := sorted({v for v in values if values.count(v) > 1}):
            out.append(Problem(f"{flag} {' '.join(map(str, twice))}: given twice (each run is one seed x threads)"))
    return out


def _records_problem(out: Path) -> str | None:
    """Why the records file ``--out`` cannot take a run's record (it is read, then replaced with the record added)."""
    if not out.is_file():
        return None
    try:
        data = json.loads(out.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"--out {out}: not a JSON records file ({exc})"
    return None if isinstance(data, list) else f"--out {out}: expected a JSON list of run records"


FINAL_REPORT = "python -m benchmarks.robustness grid --final-report"


def _split_problems(args: argparse.Namespace, curriculum: CurriculumConfig, stages: list[StageConfig]) -> list[str]:
    """The split rule: no stage evaluates on the test split (its hold checks and kept checkpoints are choices),
    clutter's and a tuning run's validation prompts are not the test split, and a final report's curriculum cites
    tuning records that read validation, none of them the final report's own ``--out``."""
    root: Path = args.root
    read = {
        f"{args.curriculum}: {cfg.name}: eval_prompts": root / cfg.eval_prompts for cfg in stages if cfg.eval_prompts
    }
    read["--validation-prompts"] = root / args.validation_prompts
    problems = tuning_prompt_problems(read, [root / args.test_prompts], final_report=FINAL_REPORT)
    if args.final_report:
        field = f"curriculum.choices ({args.curriculum})"
        problems += choice_record_problems(curriculum.choices, field=field, root=root)
        problems += [
            f"{field}: {choice}: is --out; the final report's records are not a choice of its recipe"
            for choice in curriculum.choices
            if (root / choice).resolve() == args.out.resolve()
        ]
    return problems


def check_runs(args: argparse.Namespace) -> None:
    """Every problem of a ``grid`` or ``one`` command line (module docstring), raised as one
    :class:`PreflightError`; nothing is written and no process started."""
    grid = args.command == "grid"
    seeds, threads = (args.seeds, args.threads) if grid else ([args.seed], [args.threads])
    problems = _argument_problems(seeds, threads, grid)
    root: Path = args.root
    if not root.is_dir():
        raise PreflightError([*problems, Problem(f"--root {root}: not a folder")])  # every other path is under it
    if args.reuse is not None and not args.reuse.is_dir():
        problems.append(Problem(f"--reuse {args.reuse}: not a folder (another grid's --run-root)"))
    problems += [Problem(p) for p in [_records_problem(args.out)] if p]
    overrides: dict[str, Any] = {}
    try:
        overrides = overrides_from_pairs(args.set)
    except UserError as exc:
        problems.append(Problem(str(exc)))
    except yaml.YAMLError as exc:
        problems.append(Problem(f"--set: a value is not YAML ({exc})"))
    curriculum: CurriculumConfig | None = None
    stages: list[StageConfig] = []
    evaluation: EvaluationConfig | None = None
    try:  # the seed changes no input: one seed's stages stand for every run's
        curriculum, stages = load_curriculum(root / args.curriculum, {**overrides, "seed": seeds[0]}, root=root)
    except UserError as exc:
        problems.append(Problem(str(exc), "--curriculum"))
    headline = root / (args.test_prompts if args.final_report else args.validation_prompts)
    evaluation_files = [root / args.evaluate_params] + ([] if args.final_report else [root / args.validation_params])
    try:
        evaluation = load_config(evaluation_files, section="evaluation", schema=EvaluationConfig)
    except UserError as exc:
        problems.append(Problem(str(exc), "--evaluate-params"))
    prompt_files = [("--validation-prompts", args.validation_prompts)]
    prompt_files += [("--test-prompts", args.test_prompts)] if args.final_report else []
    for flag, prompts in prompt_files:
        try:  # read as the evaluation and clutter read them (the headline file's rewards' checks: below)
            load_prompts(root / prompts)
        except (UserError, ValueError) as exc:
            problems.append(Problem(str(exc), flag))
    outputs = [Output("--run-root", args.run_root, replaced=False), Output("--out", args.out, is_file=True)]
    inputs: dict[str, str | Path] = {
        "--curriculum": root / args.curriculum,
        "--evaluate-params": root / args.evaluate_params,
        "--validation-params": root / args.validation_params,
        "--test-prompts": root / args.test_prompts,
        "--validation-prompts": root / args.validation_prompts,
    }
    if curriculum is not None:
        files = (*curriculum.base, curriculum.model, *curriculum.stages, *curriculum.overlays)
        inputs |= {f"{args.curriculum}: {file}": root / file for file in files}
        problems += preflight(stages, root, checkpoint_dir=args.run_root, outputs=outputs, inputs=inputs)
        problems += [Problem(p, "the split rule") for p in _split_problems(args, curriculum, stages)]
        if evaluation is not None:
            checked = preflight_evaluation(evaluation, root / stages[0].pipeline, headline)
            role = "test" if args.final_report else "validation"
            problems += [Problem(p.message, f"{role} evaluation: {p.used_by}") for p in checked]
    else:
        problems += [Problem(p, "outputs") for p in output_problems(outputs, inputs)]
    unique: dict[str, Problem] = {}  # a pipeline's or prompt file's problem is found by two checks alike
    for problem in problems:
        unique.setdefault(problem.message, problem)
    if unique:
        raise PreflightError(list(unique.values()))
