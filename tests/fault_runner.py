"""Run a tiny stage in this process and SIGKILL it at an injected fault (used by tests/training/test_faults.py).

    python -m tests.fault_runner WORLD WORK OUT [--fault rollout:2|update:3|checkpoint:5|eval:1] [--history FILE]

``--fault point:n`` kills the process (SIGKILL: no cleanup, no finally) at the n-th call of that point:
``rollout`` (sampling), ``update`` (a gradient step's backward), ``checkpoint`` (a file write inside a
checkpoint directory), ``eval`` (an evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _kill_on_call(owner: Any, name: str, n: int) -> None:
    original: Callable[..., Any] = getattr(owner, name)
    calls = {"n": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("world", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--fault")
    parser.add_argument("--history", type=Path)
    parser.add_argument("--set", default="{}", help="JSON overrides of the tiny stage config")
    args = parser.parse_args()

    import vgrpo.checkpoints.state
    import vgrpo.evaluation.evaluator
    from tests.tiny_world import tiny_stage_config as _config
    from vgrpo.algorithms.vgrpo import VGRPO
    from vgrpo.training.stage import run_stage

    if args.fault:
        point, n = args.fault.split(":")
        owner, name = {
            "rollout": (VGRPO, "rollout"),
            "update": (VGRPO, "accumulate_gradients"),
            "checkpoint": (vgrpo.checkpoints.state, "save_file"),  # the name the checkpoint writer calls
            "eval": (vgrpo.evaluation.evaluator, "evaluate"),
        }[point]
        _kill_on_call(owner, name, int(n))
    config = _config(**json.loads(args.set))
    result = run_stage(config, pipeline_dir=Path("base"), work_dir=args.work, out_dir=args.out, root=args.world)
    if args.history:
        untimed = [{k: v for k, v in h.items() if not k.startswith("time/")} for h in result.history]
        args.history.write_text(
            json.dumps({"history": untimed, "evaluations": result.evaluations, "resumed_from": result.resumed_from})
        )


if __name__ == "__main__":
    main()
