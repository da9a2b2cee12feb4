"""Orchestration overhead: one curriculum stage through the curriculum flow (a real Prefect server, MLflow sqlite store,
per-iteration MLflow metrics, evaluation images, checkpoints) against the same stage called as plain functions
(:func:`vgrpo.training.stage.run_stage` with one checkpoint at the end and no tracking).

    python -m benchmarks.orchestration [--stage 1] [--iterations 10] [--checkpoint-every 5]

Each run is a fresh process (imports, model and reward loading count on both sides) in a fresh folder; the
server and the MLflow store are created before the flow's timing starts, as a user has them, and the server runs
only while the flow is timed. ``--repeats`` plain/flow pairs alternate, so a drift in the machine's speed hits both
sides. Prints wall seconds of each run and the overhead in percent of the plain run. Run nothing else alongside.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from benchmarks.common import ROOT

PLAIN = """
import sys
from pathlib import Path
from vgrpo.config import load_curriculum
from vgrpo.training.stage import run_stage
_, stages = load_curriculum("params/curricula/embedded.yaml", {overrides!r})
cfg = stages[{index}]
cfg = cfg.model_copy(update={{"checkpoint_every": cfg.iterations}})
run_stage(cfg, pipeline_dir=Path(cfg.pipeline), work_dir=Path({work!r}), out_dir=Path({work!r}) / "out")
"""

FLOW = """
import yaml
from pathlib import Path
from flows.curriculum import curriculum_flow
spec = yaml.safe_load(Path("params/curricula/embedded.yaml").read_text())["curriculum"]
spec["stages"] = [spec["stages"][{index}]]
Path({work!r}).mkdir(parents=True, exist_ok=True)
Path({work!r}, "one.yaml").write_text(yaml.safe_dump({{"curriculum": spec}}))
curriculum_flow(curriculum=str(Path({work!r}, "one.yaml")), overrides={overrides!r}, run_root={work!r})
"""


def timed(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-4000:])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", type=int, default=1, help="1-based stage of params/curricula/embedded.yaml")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=5, help="the flow run's checkpoint cadence")
    parser.add_argument("--repeats", type=int, default=2, help="plain/flow pairs, alternated")
    parser.add_argument("--out", type=Path, default=None, help="also write the result JSON here")
    args = parser.parse_args()
    # mlflow and Prefect (services.local) are the ``pipeline`` extra's, needed only once the arguments parse.
    from mlflow import MlflowClient

    from services.local import local_services

    base = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    overrides = {"iterations": args.iterations}
    flow_overrides = {**overrides, "checkpoint_every": args.checkpoint_every}
    plain, flow = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):  # the server runs only for the flow's timing, as its cost is the flow's
            work = Path(tmp) / f"r{repeat}"
            plain.append(timed(PLAIN.format(overrides=overrides, index=args.stage - 1, work=str(work / "plain")), base))
            print(f"plain functions: {plain[-1]:.1f} s", flush=True)
            with local_services(work / "services") as services:
                env = {**base, **services.env, "PREFECT_HOME": str(work / "prefect-client")}
                MlflowClient(services.env["MLFLOW_TRACKING_URI"]).search_experiments()  # a user's store exists
                flow.append(
                    timed(FLOW.format(overrides=flow_overrides, index=args.stage - 1, work=str(work / "flow")), env)
                )
            print(f"flow: {flow[-1]:.1f} s", flush=True)
    plain_s, flow_s = sum(plain) / len(plain), sum(flow) / len(flow)
    result = {
        "stage": args.stage,
        "iterations": args.iterations,
        "plain_s": [round(x, 1) for x in plain],
        "flow_s": [round(x, 1) for x in flow],
        "overhead_s": round(flow_s - plain_s, 1),
        "overhead_pct": round(100 * (flow_s - plain_s) / plain_s, 1),
        "overhead_pct_per_pair": [round(100 * (f - p) / p, 1) for p, f in zip(plain, flow, strict=True)],
    }
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
