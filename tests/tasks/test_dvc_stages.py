"""DVC stages for every curriculum: each stage of the SD3.5-M and FLUX.1-dev curricula is a DVC stage running the
same command with its own params and folders, the embedded stages render exactly what dvc.lock recorded, and a
real-model stage without its weights stops at once with the preflight's message."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CURRICULA = {
    "stage": "embedded",
    "stage-sd35": "sd35",
    "stage-flux": "flux",
    "stage-qwen-image": "qwen-image",
    "stage-flux2": "flux2",
    "stage-z-image": "z-image",
    "stage-wan": "wan",
}


def _stages() -> dict[str, dict[str, Any]]:
    """Every stage dvc.yaml declares, foreach groups expanded by DVC itself: name -> its command and outputs."""
    pytest.importorskip("dvc")
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:
        return {s.addressing: {"cmd": s.cmd, "outs": [o.def_path for o in s.outs]} for s in repo.index.stages}


def test_every_curriculum_stage_is_a_dvc_stage_under_its_own_folders() -> None:
    stages = _stages()
    for group, model in CURRICULA.items():
        curriculum = f"params/curricula/{model}.yaml"
        files = yaml.safe_load((REPO / curriculum).read_text())["curriculum"]["stages"]
        for n, _ in enumerate(files, 1):
            stage = stages[f"{group}@{n}"]
            assert f"python -m tasks.dvc_stage --curriculum {curriculum} --stage {n} " in stage["cmd"]
            run_root = "runs/dvc" if model == "embedded" else f"runs/dvc-{model}"
            assert f"--run-root {run_root} " in stage["cmd"]
            assert any(o.startswith(f"{run_root}/stages/") for o in stage["outs"])
        assert f"{group}@{len(files) + 1}" not in stages
    outs = [o for s in stages.values() for o in s["outs"]]
    assert len(outs) == len(set(outs))  # no two stages write the same file


def test_the_embedded_stages_render_what_dvc_lock_recorded() -> None:
    """Adding the real-model groups left the embedded stages' commands and outputs as dvc.lock has them (their
    deps are re-recorded whenever the code they list changes)."""
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    stages = _stages()
    for n in range(1, 6):
        recorded, rendered = lock[f"stage@{n}"], stages[f"stage@{n}"]
        assert rendered["cmd"] == recorded["cmd"]
        assert sorted(rendered["outs"]) == sorted(o["path"] for o in recorded["outs"])


def test_dvc_stage_of_the_sd35_curriculum_stops_at_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasks.dvc_stage import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("VGRPO_MODELS", str(tmp_path / "models"))
    metrics = tmp_path / "m.json"
    args = ["--curriculum", "params/curricula/sd35.yaml", "--run-root", str(tmp_path), "--metrics", str(metrics)]
    assert main([*args, "--stage", "2", "--init", "none"]) == 2
    err = capsys.readouterr().err
    assert "error: preflight found" in err  # after any warning a library printed on import
    assert "stable-diffusion-3.5-medium: pipeline directory not found" in err
    assert "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth: not found" in err
    assert not metrics.exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("model", "pipeline"),
    [
        ("qwen-image", "Qwen-Image"),
        ("flux2", "FLUX.2-dev"),
        ("z-image", "Z-Image-Turbo"),
        ("flux", "FLUX.1-dev"),
        ("wan", "Wan2.1-T2V-14B-Diffusers"),
    ],
)
def test_dvc_stage_of_each_real_family_stops_at_preflight(
    model: str, pipeline: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the weights every family's stage names the missing pipeline and reward weights before any compute."""
    from tasks.dvc_stage import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("VGRPO_MODELS", str(tmp_path / "models"))
    metrics = tmp_path / "m.json"
    args = ["--curriculum", f"params/curricula/{model}.yaml", "--run-root", str(tmp_path), "--metrics", str(metrics)]
    assert main([*args, "--stage", "1"]) == 2
    err = capsys.readouterr().err
    assert "error: preflight found" in err
    assert f"{pipeline}: pipeline directory not found" in err
    assert "PickScore_v1" in err
    assert not metrics.exists() and not (tmp_path / "work").exists()


WORLD_STAGES = ("world_splits", "pretrain_base", "world_clip", "world_pickscore")
"""The stages every curriculum stage depends on, whose outputs are committed (or rebuilt in seconds): a fresh
clone's ``dvc repro stage@N`` must find their code unchanged since dvc.lock, or it retrains the base for an hour."""


def test_the_world_stages_code_deps_are_as_dvc_lock_recorded_them() -> None:
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    declared = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name in WORLD_STAGES:
        recorded = {d["path"]: d["md5"] for d in lock[name]["deps"] if d["path"].endswith(".py")}
        listed = sorted(d for d in declared[name]["deps"] if str(d).endswith(".py"))
        assert sorted(recorded) == listed, f"{name}: dvc.lock records other code deps than dvc.yaml lists"
        changed = [p for p, md5 in recorded.items() if hashlib.md5((REPO / p).read_bytes()).hexdigest() != md5]
        assert not changed, (
            f"{name}: {changed} changed since dvc.lock; check that the stage's outputs are unchanged and "
            f"`dvc commit {name}`, or `dvc repro {name}`"
        )


def test_dvc_stage_refuses_an_output_over_its_params_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--metrics`` naming a params file the stage reads is refused before any compute, and the file is kept."""
    from tasks.dvc_stage import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("VGRPO_MODELS", str(tmp_path / "models"))
    before = (REPO / "params" / "base.yaml").read_bytes()
    args = ["--curriculum", "params/curricula/sd35.yaml", "--run-root", str(tmp_path), "--metrics", "params/base.yaml"]
    assert main([*args, "--stage", "1", "--init", "none"]) == 2
    assert "--metrics params/base.yaml is an input (params file params/base.yaml)" in capsys.readouterr().err
    assert (REPO / "params" / "base.yaml").read_bytes() == before and not (tmp_path / "work").exists()
