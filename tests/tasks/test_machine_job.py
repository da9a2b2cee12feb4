"""The job machine r > 0 of a stage across machines runs (tasks.machine_job): paths relative to the project root,
checked once when the job is made (here or from its JSON), and the same job after a trip through JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tasks.machine_job import MachineJob, this_machine
from vgrpo.config import StageConfig
from vgrpo.errors import ConfigError

STAGE = StageConfig.model_validate(
    {
        "name": "tiny",
        "prompts": "train.jsonl",
        "iterations": 1,
        "rewards": [{"name": "geneval"}],
        "rollout": {"prompts_per_iteration": 4, "group_size": 2},
        "launch": {"processes": 4, "machines": 2, "accelerate_config": "multi.yaml"},
    }
)


def test_the_other_machines_job_names_paths_relative_to_the_project_root(tmp_path: Path) -> None:
    run_root, init = tmp_path / "runs" / "c", tmp_path / "runs" / "c" / "stages" / "s0"
    job = MachineJob.from_this_machine(STAGE, str(init), "abc", str(run_root), str(tmp_path), "10.0.0.7", 29123)
    assert (job.run_root, job.init_lora, job.init_hash) == ("runs/c", "runs/c/stages/s0", "abc")
    assert (job.main_ip, job.main_port, job.machine_0) == ("10.0.0.7", 29123, this_machine(str(tmp_path)))
    assert job.stage == STAGE and job.stage.launch.processes_per_machine == 2
    with pytest.raises(ConfigError, match=r"must lie inside the project root"):
        MachineJob.from_this_machine(STAGE, None, None, str(tmp_path.parent / "elsewhere"), str(tmp_path), None, None)


def test_a_job_is_the_same_after_a_trip_through_json() -> None:
    job = MachineJob(STAGE, "runs/c", "runs/c/stages/s0", "abc", None, "10.0.0.7", 29123)
    data = json.loads(json.dumps(job.to_json()))
    assert data["stage"] == STAGE.model_dump(mode="json") and data["run_root"] == "runs/c"
    assert MachineJob.from_json(data) == job
    with pytest.raises(AttributeError):
        job.run_root = "elsewhere"  # type: ignore[misc]


@pytest.mark.parametrize(("key", "value"), [("run_root", "../../home"), ("init_lora", "/etc"), ("run_root", "/")])
def test_a_job_with_a_path_outside_the_checkout_is_refused_made_here_or_read(key: str, value: str) -> None:
    data = {"stage": STAGE.model_dump(mode="json"), "run_root": "runs/c", "init_lora": "runs/c/stages/s1", key: value}
    with pytest.raises(ConfigError, match=f"machine job {key}: "):
        MachineJob.from_json(data)
    with pytest.raises(ConfigError, match=f"machine job {key}: "):
        MachineJob(**{**data, "stage": STAGE})


def test_a_job_file_with_unknown_or_missing_keys_or_bad_params_is_refused() -> None:
    data = MachineJob(STAGE, "runs/c").to_json()
    with pytest.raises(ConfigError, match=r"^machine job: unknown keys \['extra'\]"):
        MachineJob.from_json({**data, "extra": 1})
    with pytest.raises(ConfigError, match=r"^machine job: no \['run_root'\]"):
        MachineJob.from_json({k: v for k, v in data.items() if k != "run_root"})
    with pytest.raises(ValidationError):
        MachineJob.from_json({**data, "stage": {**data["stage"], "launch": {"processes": 3, "machines": 2}}})
