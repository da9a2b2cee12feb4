"""scripts/slurm/curriculum.sh submits a curriculum's stages as Slurm jobs chained with --dependency=afterok, each the
stage's sbatch file with the stage's arguments (a fake ``sbatch`` records them: tests/cluster/fake_slurm.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.cluster.fake_slurm import install
from tests.cluster.pool import REPO

CURRICULUM = "params/curricula/embedded.yaml"


def _submit(tmp_path: Path, *args: str, **env: str) -> tuple[list[str], list[list[str]]]:
    log = tmp_path / "sbatch.jsonl"
    log.unlink(missing_ok=True)
    path = f"{install(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}"
    run = subprocess.run(
        [str(REPO / "scripts" / "slurm" / "curriculum.sh"), CURRICULUM, "runs/slurm/e", *args],
        env={**os.environ, "PATH": path, "FAKE_SBATCH_LOG": str(log), "VGRPO_VENV": str(REPO / ".venv"), **env},
        capture_output=True,
        text=True,
        cwd=tmp_path,  # the script finds the checkout from its own path
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines(), [json.loads(line) for line in log.read_text().splitlines()]


def test_each_stage_is_a_job_that_waits_for_the_previous_ones_success(tmp_path: Path) -> None:
    printed, calls = _submit(tmp_path, "--nodes=4", "--partition=gpu")
    assert [line.split()[0] for line in printed] == ["1", "2", "3", "4", "5"]
    assert [line.split()[1] for line in printed] == ["1000", "1001", "1002", "1003", "1004"]
    for stage, call in enumerate(calls, start=1):
        after = [a for a in call if a.startswith("--dependency=")]
        assert after == ([] if stage == 1 else [f"--dependency=afterok:{998 + stage}"])
        script = call.index("scripts/slurm/stage.sbatch")
        options = {"--parsable", "--nodes=4", "--partition=gpu", f"--job-name=vgrpo-embedded-{stage}"}
        assert options <= set(call[:script])
        assert call[script + 1 :] == ["--curriculum", CURRICULUM, "--stage", str(stage), "--run-root", "runs/slurm/e"]


def test_a_chain_can_start_later_and_after_another_job(tmp_path: Path) -> None:
    printed, calls = _submit(tmp_path, FROM="4", AFTER="77")
    assert [line.split()[0] for line in printed] == ["4", "5"]
    assert "--dependency=afterok:77" in calls[0] and "--dependency=afterok:1000" in calls[1]
