"""One process of a launched stage (:mod:`tasks.launch`): ``accelerate launch ... -m tasks.launched_stage SPEC.json``.

Every process trains its share of each batch with :func:`tasks.stage.train_and_track`. Rank 0 alone opens (or
continues, from the run id its checkpoint names) the stage's MLflow run, reports, exports, and writes its
:class:`tasks.outcome.StageOutcome` atomically to the spec's ``result`` file; its output is what the launcher
streams. The other ranks open no run and write their output to ``rank-<r>.log`` beside the spec. Any rank that meets
an error a user can fix (bad input, a diverged stage) writes it to the ``result`` file instead, so the caller raises
it again. No process talks to Prefect: the launcher's task run is the stage's one task run.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _output_to(path: Path) -> None:
    """Send this process's stdout and stderr (its own and its libraries') to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (1, 2):
        os.dup2(fd, stream)
    os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m tasks.launched_stage SPEC.json (written by tasks.launch)", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    rank = int(os.environ.get("RANK", "0"))  # set by the launcher before any process group exists
    if rank != 0:
        _output_to(Path(spec["logs"]) / f"rank-{rank}.log")
    # Imported only now: what the libraries print as they load belongs in this rank's log.
    from tasks.launch import ERRORS
    from tasks.stage import train_and_track
    from tasks.tracking import Tracking
    from vgrpo.atomic import write_json_atomic
    from vgrpo.config import StageConfig
    from vgrpo.parallel.distributed import Distributed

    dist = Distributed.from_environment()
    tracking = Tracking(**spec["tracking"]) if spec["tracking"] is not None else None
    try:
        cfg = StageConfig.model_validate(spec["stage"])  # validated by the launcher: the same values come back
        outcome = train_and_track(cfg, spec["init_lora"], spec["run_root"], spec["root"], tracking, dist=dist)
    except tuple(ERRORS.values()) as exc:  # bad input or a diverged stage: the caller raises it again
        kind = next(cls.__name__ for cls in type(exc).__mro__ if cls.__name__ in ERRORS)
        write_json_atomic(Path(spec["result"]), {"error": {"kind": kind, "message": str(exc)}})  # any rank's
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 3 if kind == "TrainingDiverged" else 2
    if outcome is not None:
        write_json_atomic(Path(spec["result"]), outcome.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
