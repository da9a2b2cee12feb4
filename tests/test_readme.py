"""The README's first screen stays one screen, and its CPU snippet runs as written (at a tiny rollout)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from vgrpo.world.cli import main as world_main

REPO = Path(__file__).parents[1]
README = (REPO / "README.md").read_text()
MARKER = "<!-- readme-snippet: cpu-trainer (tests/test_readme.py runs it) -->"


def test_the_first_screen_is_short_and_says_the_verdict_first() -> None:
    first = README[: README.index("## Quick start")]
    assert len(first) <= 3000, len(first)
    box = [line for line in first.splitlines() if line.startswith(">")]
    assert len(box) == 4 and box[0].startswith("> - **Runs end to end on a CPU")
    assert "tiny pipelines only" in box[1]
    assert "No paper result is reproduced yet" in box[2]
    assert "docs/benchmarks-v3/grid/README.md#the-papers-claims" in box[2]
    assert "The curriculum over seeds and thread counts" in box[3] and "docs/embedded.md#" in box[3]
    assert "<!-- curriculum-runs -->\nOver " in first  # the table over runs (tests/benchmarks/test_robustness.py)
    for path in re.findall(r"`((?:vgrpo|tasks|flows|services)/[\w/]+\.py)`", first):  # the tables' files exist
        assert (REPO / path).is_file(), path
    algorithms = re.findall(r"^\| [^|]+ \| `(\w+)` \|", first, flags=re.M)
    assert sorted(algorithms) == sorted(p.stem for p in (REPO / "params" / "algorithms").glob("*.yaml"))


def test_the_readmes_relative_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if target.startswith("http"):
            continue
        assert (REPO / target).exists(), target


def test_the_cpu_snippet_trains_as_written(tmp_path: Path) -> None:
    """The block runs from a project folder holding the repository's params and embedded base and fresh prompt
    files; only the rollout is made tiny (2 prompts x 2 images, 4 steps) so that it takes seconds."""
    code = README[README.index(MARKER) :].split("```python\n", 1)[1].split("```", 1)[0]
    given = '{"iterations": 2, "eval_prompts": None}'
    assert given in code
    rollout = '"rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 4}'
    tiny = given.replace("}", f", {rollout}}}")
    for name in ("params", "models"):
        (tmp_path / name).symlink_to(REPO / name)
    splits = [
        "world-splits",
        "--params",
        str(REPO / "params/embedded/pretrain.yaml"),
        "--out",
        str(tmp_path / "data/world"),
    ]
    assert world_main([*splits, "--set", "train_prompts=40", "test_prompts=14"]) == 0
    (tmp_path / "snippet.py").write_text(code.replace(given, tiny))
    done = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rewards = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\[-?\d\.\d+, -?\d\.\d+\]", rewards), done.stdout
    assert len([line for line in done.stderr.splitlines() if "| iteration " in line]) == 2  # the live line
    assert (tmp_path / "runs/redness/export/pytorch_lora_weights.safetensors").is_file()
