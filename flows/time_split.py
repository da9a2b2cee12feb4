"""Where the main job's wall time goes: training, evaluation, loading and start-up, orchestration.

Two levels, each from clocks the code already reads:

* the flow (:func:`flow_split`): per stage, what the stage loop timed (:attr:`vgrpo.training.stage.StageResult.timings`:
  the iterations, in-stage evaluations, model loading and checkpoint restore, checkpoint writes, export) and what
  the flow timed around its tasks (prompt preparation, the training task, the final-evaluation task);
* the job (:func:`job_split`): ``./scripts/curriculum.sh``'s marks (set-up, services, the flow run, the
  before/after evaluations) around the flow's split.

The parts are:

* ``training``: the training iterations (rollout, reward, update);
* ``evaluation``: in-stage and final evaluations, with the final evaluations' own model loading, and the job's
  before/after evaluation commands (their Python start included);
* ``loading``: loading and start-up: ``scripts/setup.sh``, Prefect's server and the deployments' registration,
  prompt preparation, loading the stage's models and restoring its checkpoint, writing checkpoints and the export;
* ``orchestration``: the rest of the wall time (so the parts sum to it): Prefect's task and flow machinery, MLflow
  logging and model registration, cache checks, the time between triggering the deployment and the flow starting,
  the tables printed at the end.

    python -m flows.time_split --marks runs/services/marks.txt --flow runs/curriculum/NAME/time_split.json \\
        --out metrics/curriculum_time.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vgrpo.atomic import write_json_atomic

__all__ = ["PARTS", "flow_split", "format_split", "job_split", "read_marks", "stage_times"]

PARTS = ("training", "evaluation", "loading", "orchestration")

JOB_MARKS = ("start", "setup", "services", "flow", "evaluations", "end")
"""The marks ``scripts/curriculum.sh`` writes, in order: each names the end of a span that began at the mark before
(``setup``: scripts/setup.sh; ``services``: the server and the deployments; ``flow``: the deployment's run;
``evaluations``: the before/after evaluations; ``end``: the tables)."""


def stage_times(timings: Mapping[str, float], prompts_s: float, train_s: float, evaluate_s: float) -> dict[str, float]:
    """One stage's seconds by part, from the stage loop's ``timings`` (empty for a stage the cache returned) and the
    flow's clocks around its three tasks; what the training task spent outside the loop's timed parts
    (Prefect's phase tasks, MLflow) is orchestration."""
    training = timings.get("iterations_s", 0.0)
    evaluation = timings.get("evaluation_s", 0.0) + evaluate_s
    loading = prompts_s + sum(timings.get(k, 0.0) for k in ("setup_s", "checkpoint_s", "export_s"))
    timed = sum(timings.get(k, 0.0) for k in ("iterations_s", "evaluation_s", "setup_s", "checkpoint_s", "export_s"))
    return {
        "training": training,
        "evaluation": evaluation,
        "loading": loading,
        "orchestration": max(train_s - timed, 0.0),
    }


def flow_split(stages: Sequence[Mapping[str, float]], total_s: float) -> dict[str, float]:
    """The flow's ``total_s`` by part: the stages' :func:`stage_times` summed, and orchestration the remainder."""
    if total_s < 0:
        raise ValueError(f"total_s: {total_s} is negative")
    split = {part: sum(s.get(part, 0.0) for s in stages) for part in PARTS[:3]}
    split["orchestration"] = total_s - sum(split.values())
    return {**split, "total": total_s}


def read_marks(path: Path) -> dict[str, float]:
    """``NAME EPOCH_SECONDS`` lines (the last of a name wins); a ``ValueError`` naming the file and line."""
    marks: dict[str, float] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            name, stamp = line.split()
            marks[name] = float(stamp)
        except ValueError:
            raise ValueError(f"{path}:{number}: expected 'NAME EPOCH_SECONDS', got {line!r}") from None
    return marks


def job_split(marks: Mapping[str, float], flow: Mapping[str, float] | None) -> dict[str, float]:
    """The job's wall time (mark ``start`` to ``end``) by part. ``flow`` (:func:`flow_split`, ``None`` when the flow
    wrote none) splits the ``services``-to-``flow`` span; what of that span the flow did not see (the trigger, the
    flow's start and end) is orchestration. Marks after ``flow`` may be absent (a run that is not the embedded
    curriculum has no before/after evaluations)."""
    missing = [m for m in ("start", "end") if m not in marks]
    if missing:
        raise ValueError(f"marks: {missing} missing (have {sorted(marks)})")
    present = [m for m in JOB_MARKS if m in marks]
    stamps = [marks[m] for m in present]
    if any(b < a for a, b in itertools.pairwise(stamps)):
        raise ValueError(f"marks: not in order {present}: {stamps}")
    span = {b: marks[b] - marks[a] for a, b in itertools.pairwise(present)}
    total = marks["end"] - marks["start"]
    split = dict.fromkeys(PARTS, 0.0)
    split["loading"] += span.get("setup", 0.0) + span.get("services", 0.0)
    split["evaluation"] += span.get("evaluations", 0.0)
    if flow is not None:
        for part in PARTS[:3]:
            split[part] += flow[part]
    split["orchestration"] = total - split["training"] - split["evaluation"] - split["loading"]
    return {**split, "total": total, "flow_run": span.get("flow", 0.0), "flow_total": (flow or {}).get("total", 0.0)}


def format_split(split: Mapping[str, float]) -> str:
    """A small table: each part's minutes and share of the total."""
    total = split["total"]
    rows = ["| part | minutes | share |", "|---|---:|---:|"]
    for part in PARTS:
        share = split[part] / total if total > 0 else 0.0
        rows.append(f"| {part} | {split[part] / 60:.1f} | {share:.0%} |")
    rows.append(f"| total | {total / 60:.1f} | 100% |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.time_split",
        description="The main job's wall time split into training, evaluation, loading and start-up, orchestration.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--marks", required=True, help="the job's marks file (NAME EPOCH_SECONDS per line)")
    parser.add_argument("--flow", help="the flow's time_split.json (runs/curriculum/NAME/time_split.json)")
    parser.add_argument("--out", help="write the split here as JSON")
    args = parser.parse_args(argv)
    try:
        flow: dict[str, Any] | None = None
        if args.flow and Path(args.flow).is_file():
            flow = json.loads(Path(args.flow).read_text())["split"]
        split = job_split(read_marks(Path(args.marks)), flow)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_split(split))
    if args.out:
        write_json_atomic(args.out, {k: round(v, 2) for k, v in split.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
