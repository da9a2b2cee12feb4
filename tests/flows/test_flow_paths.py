"""A flow run's parameters that become paths, and a machine job's, are checked before anything runs: without '..'
(a machine job's also relative: inside the checkout), so whatever a run replaces or deletes lies under its own run
folder; stage and curriculum names are never '.', '..' or hidden."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.curriculum import curriculum_flow
from flows.machine import stage_machine_flow
from flows.sweep import ablation_sweep
from vgrpo.config import CurriculumConfig, StageConfig
from vgrpo.errors import ConfigError


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"run_root": "../elsewhere"}, "run_root"),
        ({"run_root": "runs/../../x"}, "run_root"),
        ({"curriculum": "params/../../c.yaml"}, "curriculum"),
        ({"ablation": "../other/params.yaml"}, "ablations"),
        ({"root": "/no/such/folder"}, "root"),
    ],
)
def test_a_curriculum_flow_run_with_a_path_outside_the_project_is_refused(
    tmp_path: Path, params: dict[str, str], named: str
) -> None:
    args = {"curriculum": "c.yaml", "run_root": "runs", "root": str(tmp_path), **params}
    with pytest.raises(ConfigError, match=rf"^{named}: "):
        curriculum_flow.fn(**args)
    assert list(tmp_path.iterdir()) == []  # refused before anything was read or written


def test_a_sweep_flow_run_with_a_path_outside_the_project_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^run_root: '\.\./x' must be a path without '\.\.'"):
        ablation_sweep.fn(curriculum="c.yaml", ablations=["a.yaml"], run_root="../x", root=str(tmp_path))
    with pytest.raises(ConfigError, match=r"^ablations: 'a/\.\./\.\./b\.yaml'"):
        ablation_sweep.fn(curriculum="c.yaml", ablations=["a/../../b.yaml"], root=str(tmp_path))
    with pytest.raises(ConfigError, match=r"^devices: 0: at least 1"):
        ablation_sweep.fn(curriculum="c.yaml", ablations=["a.yaml"], root=str(tmp_path), devices=0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("key", "value"), [("run_root", "../../home"), ("init_lora", "/etc"), ("run_root", "/")])
def test_a_machine_job_with_a_path_outside_the_checkout_is_refused(tmp_path: Path, key: str, value: str) -> None:
    launch = {"processes": 2, "machines": 2, "accelerate_config": "a.yaml"}
    rollout = {"prompts_per_iteration": 4, "group_size": 2}
    stage = {"name": "s1", "prompts": "p.jsonl", "iterations": 1, "rewards": [{"name": "geneval"}], "rollout": rollout}
    stage["launch"] = launch
    job = {"run_root": "runs/c", "init_lora": "runs/c/stages/s1", "stage": stage, key: value}
    with pytest.raises(ConfigError, match=f"machine job {key}: "):
        stage_machine_flow.fn(job, 1, str(tmp_path))  # what a pool's worker runs, before it holds any device
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", [".", "..", ".hidden"])
def test_stage_and_curriculum_names_that_are_not_plain_folders_are_refused(name: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as stage:
        StageConfig.model_validate({"name": name, "prompts": "p.jsonl"})
    assert ("name",) in [e["loc"] for e in stage.value.errors()]
    with pytest.raises(ValidationError, match=r"name\n  String should match pattern"):
        CurriculumConfig.model_validate({"name": name, "model": "m.yaml", "stages": ["s.yaml"]})
    assert CurriculumConfig.model_validate({"name": "c.v2", "model": "m.yaml", "stages": ["s.yaml"]}).name == "c.v2"
