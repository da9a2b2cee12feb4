"""DVC's default remote as this project configures it (`.dvc/config`: a folder under `~`, the same for every clone on
the machine): a stage's output pushed from one clone is pulled, byte for byte, into a fresh `git clone` of it."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("dvc")

REPO = Path(__file__).resolve().parents[2]
STAGE = """stages:
  make:
    cmd: >-
      {python} -c "import os; os.makedirs('model', exist_ok=True);
      open('model/weights.bin', 'wb').write(os.urandom(4096))"
    outs:
      - model
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
    return out.stdout


def _project_remote() -> tuple[str, str]:
    """The default remote's name and url in this project's .dvc/config."""
    config = configparser.ConfigParser()
    config.read(REPO / ".dvc/config")
    name = config["core"]["remote"]
    return name, config[f"'remote \"{name}\"'"]["url"]


def test_the_project_remote_is_one_folder_for_every_clone() -> None:
    name, url = _project_remote()
    assert name and url.startswith("~/"), url  # DVC expands `~`; a relative url would be one folder per clone


def test_push_then_pull_into_a_git_clone_restores_the_bytes(tmp_path: Path) -> None:
    home, project, clone = tmp_path / "home", tmp_path / "project", tmp_path / "clone"
    home.mkdir()
    project.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "DVC_NO_ANALYTICS": "1",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
    }
    dvc = [sys.executable, "-m", "dvc"]
    name, url = _project_remote()
    _run(["git", "init", "-q"], project, env)
    _run([*dvc, "init", "-q"], project, env)
    _run([*dvc, "remote", "add", "-d", name, url], project, env)  # the project's remote, under this test's HOME
    (project / "dvc.yaml").write_text(STAGE.format(python=sys.executable))
    _run([*dvc, "repro"], project, env)
    _run([*dvc, "push"], project, env)
    assert any((home / url.removeprefix("~/")).rglob("*")), "nothing pushed to the remote folder"
    _run(["git", "add", "-A"], project, env)
    _run(["git", "commit", "-qm", "stage"], project, env)

    _run(["git", "clone", "-q", str(project), str(clone)], tmp_path, env)
    assert not (clone / "model").exists()
    _run([*dvc, "pull", "make"], clone, env)
    assert (clone / "model/weights.bin").read_bytes() == (project / "model/weights.bin").read_bytes()
    assert "up to date" in _run([*dvc, "status", "make"], clone, env)
