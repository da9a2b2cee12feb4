"""The training curves as DVC plots over the committed per-iteration files: `dvc plots show --json` renders them,
and `dvc plots diff` overlays two revisions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).parents[1]
STAGES = ["s1-preference", "s2-geneval", "s3-preference", "s4-geneval", "s5-ocr"]
ENV = {
    **os.environ,
    "DVC_NO_ANALYTICS": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
}
ENV["GIT_COMMITTER_EMAIL"] = "t@t"


def _dvc(args: list[str], cwd: Path) -> dict[str, Any]:
    done = subprocess.run(
        [shutil.which("dvc") or "dvc", *args, "--json"], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["data"]


def test_the_committed_curves_render_as_dvc_plots() -> None:
    data = _dvc(["plots", "show"], REPO)
    rows = {s: json.loads((REPO / "plots" / "stages" / f"{s}.json").read_text()) for s in STAGES}
    for stage in STAGES:
        (plot,) = data[f"reward-{stage}"]
        values = plot["content"]["data"]["values"]
        assert plot["type"] == "vega" and len(values) == len(rows[stage])
        assert [v["reward/total_mean"] for v in values] == [r["reward/total_mean"] for r in rows[stage]]
    (grad,) = data["grad-norm"]
    assert len(grad["content"]["data"]["values"]) == sum(len(r) for r in rows.values())  # every stage, one series each
    assert {v["filename"] for v in grad["content"]["data"]["values"]} == {f"{s}.json" for s in STAGES}


def test_plots_diff_overlays_two_revisions(tmp_path: Path) -> None:
    """The same plot definitions in a fresh repository: a committed run, and the workspace with other rewards."""
    plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"plots": plots}))
    shutil.copytree(REPO / "plots" / "stages", tmp_path / "plots" / "stages", ignore=shutil.ignore_patterns("*.png"))
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "a"]):
        subprocess.run(command, cwd=tmp_path, env=ENV, check=True, capture_output=True, timeout=120)
    first = tmp_path / "plots" / "stages" / "s1-preference.json"
    rows = json.loads(first.read_text())
    first.write_text(json.dumps([{**r, "reward/total_mean": r["reward/total_mean"] + 1.0} for r in rows]))
    (plot,) = _dvc(["plots", "diff", "HEAD", "--targets", "reward-s1-preference"], tmp_path)["reward-s1-preference"]
    values = plot["content"]["data"]["values"]
    by_rev = {rev: [v["reward/total_mean"] for v in values if v["rev"] == rev] for rev in ("HEAD", "workspace")}
    assert by_rev["HEAD"] == [r["reward/total_mean"] for r in rows]
    assert by_rev["workspace"] == [r["reward/total_mean"] + 1.0 for r in rows]
