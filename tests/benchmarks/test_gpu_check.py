"""scripts/gpu_check.sh (python -m benchmarks.gpu_check): its CPU dry run takes every step of the GPU check at tiny
sizes and writes the JSON and markdown summaries; a step that outruns the budget is reported, not waited for; without
diffusers and without wheels the script stops at once, naming what to do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_check
from benchmarks.common import ROOT


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(ROOT / "scripts/gpu_check.sh"), "--dry-run", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_the_dry_run_takes_every_step_and_summarises_it(dry_run: tuple[dict[str, Any], str]) -> None:
    summary, md = dry_run
    assert summary["mode"] == "dry-run" and summary["passed"] is True and summary["wall_s"] <= summary["budget_s"]
    env = summary["environment"]
    assert env["cuda_available"] is False and env["packages"]["torch"] and env["packages"]["diffusers"]
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == ["gpu_tests", "embedded_stage", "sd35_arch"]
    assert all(s["status"] == "passed" and s["seconds"] > 0 for s in steps.values())
    # The gpu-marked tests were collected and, without CUDA, skipped (on a GPU a skip fails the step).
    assert steps["gpu_tests"]["details"]["counts"].get("skipped", 0) >= 2
    assert any("tests/models/test_memory.py" in c for c in steps["gpu_tests"]["command"])
    stage = steps["embedded_stage"]["details"]
    assert stage["iterations"] == 1 and stage["seconds_per_iteration"] > 0
    assert set(stage["final_evaluation"]) == {"geneval", "world_pickscore"}
    bench = steps["sd35_arch"]["details"]
    assert set(bench["results"]) == {"vgrpo", "flow_grpo", "mixgrpo", "diffusion_nft"}
    for r in bench["results"].values():
        assert r["wall_s"] > 0 and r["images_per_s"] > 0 and r["peak_mem_gb"] > 0
        assert r["time/rollout_s"] > 0 and r["time/update_s"] > 0
    assert "# GPU check (dry-run)" in md and "| V-GRPO |" in md and "| Flow-GRPO |" in md and "| MixGRPO |" in md
    assert "| DiffusionNFT |" in md
    assert "| gpu_tests | passed |" in md and "| sd35_arch | passed |" in md


def test_the_gpu_mode_asks_for_the_papers_scale_on_the_whole_architecture() -> None:
    args = gpu_check.BENCHMARK_ARGS["gpu"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags == {
        "--device": "cuda",
        "--precision": "bf16",
        "--resolution": "512",
        "--group": "24",
        "--steps": "40",
        "--iterations": "1",
    }
    # no --layers, --heads or --pos-embed-max-size: sd35_arch.py's defaults are SD3.5-M's 24 blocks of 24 heads


def test_steps_beyond_the_budget_are_reported_and_the_summary_still_written(tmp_path: Path) -> None:
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "1"]) == 1
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [(s["name"], s["status"], s["details"].get("reason")) for s in summary["steps"]] == [
        ("gpu_tests", "skipped", "out of time"),
        ("embedded_stage", "skipped", "out of time"),
        ("sd35_arch", "skipped", "out of time"),
    ]
    assert summary["passed"] is False and "| sd35_arch | skipped |" in (tmp_path / "gpu_check.md").read_text()
    assert gpu_check.pytest_counts("== 3 passed, 1 failed, 2 skipped, 40 deselected in 9.1s ==") == {
        "passed": 3,
        "failed": 1,
        "skipped": 2,
    }


def test_without_diffusers_or_wheels_the_script_stops_naming_the_wheels_script(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts/gpu_check.sh", tmp_path / "scripts/gpu_check.sh")
    python = tmp_path / "python-without-diffusers"
    python.write_text("#!/bin/sh\nexit 1\n")  # every import fails
    python.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(tmp_path / "scripts/gpu_check.sh")],
        env={**os.environ, "PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "run scripts/gpu_wheels.sh" in proc.stderr
