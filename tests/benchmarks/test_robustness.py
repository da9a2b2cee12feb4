"""benchmarks.robustness: the gains table over runs from a records file, the records' gains from paired evaluations,
and the grid on a tiny two-stage curriculum: one record per run, a recorded run kept, a killed run resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.curriculum_runs import (
    HEADLINE,
    gains_table,
    headline_gains,
    merge_record,
    read_records,
    stages_table,
)

REPO = Path(__file__).resolve().parents[2]


def _record(seed: int, threads: int, strict: tuple[float, float, float], pick: tuple[float, float, float]) -> dict:
    rows = {"geneval_strict": strict, "world_pickscore": pick}
    rewards = {k: {"base": 0.5, "final": 0.5 + g, "gain": g, "lo": lo, "hi": hi} for k, (g, lo, hi) in rows.items()}
    return {"seed": seed, "threads": threads, "cpu": "x", "commit": "c", "rewards": rewards}


def test_the_table_is_rebuilt_from_the_records_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    merge_record(path, _record(1, 1, (0.10, 0.07, 0.13), (-6.88, -7.49, -6.29)))
    merge_record(path, _record(0, 2, (0.08, 0.05, 0.11), (1.93, 1.52, 2.30)))
    merge_record(path, _record(0, 1, (0.05, -0.01, 0.09), (2.32, 1.98, 2.66)))
    merge_record(path, _record(0, 1, (0.106, 0.081, 0.130), (2.32, 1.98, 2.66)))  # replaces seed 0 x 1 thread
    records = read_records(path)
    assert [(r["seed"], r["threads"]) for r in records] == [(0, 1), (0, 2), (1, 1)]
    assert gains_table(records).splitlines() == [
        "Over 3 runs (seed 0 x 1 threads, seed 0 x 2 threads, seed 1 x 1 threads):",
        "",
        "| | runs | median gain | min | max | CI above 0 | worst run [95% CI] |",
        "|---|---|---|---|---|---|---|",
        "| geneval_strict | 3 | +0.100 | +0.080 | +0.106 | 3 of 3 | +0.080 [+0.050, +0.110] |",
        "| world_pickscore | 3 | +1.93 | -6.88 | +2.32 | 2 of 3 | -6.88 [-7.49, -6.29] |",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.robustness", "table", str(path)], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == gains_table(records)


def test_the_readme_headline_is_the_table_over_the_committed_runs() -> None:
    """The README's headline table is metrics/curriculum_runs.json's (rebuilt here to the digit); every record is
    one whole run of one recipe, over several seeds and thread counts, with its provenance and paired intervals."""
    records = read_records(REPO / "metrics/curriculum_runs.json")
    runs = [(r["seed"], r["threads"]) for r in records]
    assert len(set(runs)) == len(runs) >= 4
    assert len({seed for seed, _ in runs}) >= 3 and {threads for _, threads in runs} == {1, 2}
    assert len({r["curriculum"] for r in records}) == 1 and not any(r["overrides"] for r in records)
    for record in records:
        assert record["cpu"] and record["commit"] and record["code_dirty"] is False
        assert set(record["rewards"]) == set(HEADLINE)
        for row in record["rewards"].values():
            assert row["lo"] <= row["gain"] <= row["hi"]
            assert row["gain"] == pytest.approx(row["final"] - row["base"])
        assert record["stages"][0]["stage"] == "base" and len(record["stages"]) == 6
    readme = (REPO / "README.md").read_text()
    assert gains_table(records) in readme


def test_headline_gains_read_the_paired_evaluation() -> None:
    """The committed headline evaluation (DVC's, paired with metrics/base_eval.json): the README's numbers, and
    exactly the record of the robustness grid's run with the same seed and threads (the same adapters)."""
    final = json.loads((REPO / "metrics/curriculum_eval.json").read_text())
    base = json.loads((REPO / "metrics/base_eval.json").read_text())
    gains = headline_gains(final, base)
    assert list(gains) == ["geneval_strict", "geneval_partial", "ocr", "world_clipscore", "world_pickscore"]
    rounded = {k: {f: round(v, 3) for f, v in row.items()} for k, row in gains.items()}
    assert rounded["geneval_strict"] == {"base": 0.479, "final": 0.584, "gain": 0.105, "lo": 0.083, "hi": 0.126}
    assert rounded["geneval_partial"] == {"base": 0.612, "final": 0.694, "gain": 0.082, "lo": 0.062, "hi": 0.101}
    assert rounded["ocr"] == {"base": 0.639, "final": 0.66, "gain": 0.021, "lo": 0.005, "hi": 0.037}
    assert rounded["world_pickscore"]["gain"] == 2.625 and rounded["world_pickscore"]["lo"] == 2.278
    (same_run,) = [
        r for r in read_records(REPO / "metrics/curriculum_runs.json") if (r["seed"], r["threads"]) == (0, 2)
    ]
    assert same_run["rewards"] == gains


def test_the_grid_on_a_tiny_curriculum_records_each_run_and_resumes(tmp_path: Path) -> None:
    from tests.benchmarks.robustness_world import CURRICULUM, write_robustness_world

    root = write_robustness_world(tmp_path / "world")
    out, runs = tmp_path / "runs.json", tmp_path / "runs"
    args = ["--root", str(root), "--curriculum", "curriculum.yaml", "--evaluate-params", "evaluate.yaml"]
    args += ["--validation-params", "validation-eval.yaml"]
    args += ["--test-prompts", "test.jsonl", "--validation-prompts", "validation.jsonl"]
    args += ["--run-root", str(runs), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def grid(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "benchmarks.robustness", "grid", "--seeds", "0", "--threads", "1", *extra, *args]
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)

    first = grid()
    assert first.returncode == 0, first.stderr[-3000:]
    (record,) = read_records(out)
    assert (record["seed"], record["threads"], record["overrides"]) == (0, 1, {})
    assert record["cpu"] and record["commit"]
    assert record["split"]["role"] == "validation" and record["split"]["prompt_file"] == str(root / "validation.jsonl")
    assert set(record["rewards"]) == {"geneval_strict", "geneval_partial", "world_pickscore"}
    pick_row = record["rewards"]["world_pickscore"]
    assert pick_row["lo"] <= pick_row["gain"] <= pick_row["hi"]
    assert pick_row["gain"] == pytest.approx(pick_row["final"] - pick_row["base"])
    assert [s["stage"] for s in record["stages"]] == ["base", "s1", "s2"]
    assert [s["stage"] for s in record["clutter"]["stages"]] == ["base", "s1", "s2"]
    assert "| world_pickscore | 1 |" in first.stdout

    again = grid()  # recorded: kept, nothing runs
    assert again.returncode == 0 and "seed 0, 1 threads: recorded" in again.stdout and read_records(out) == [record]

    # A run killed after its stages, before its record: it restarts with its stages kept (not retrained).
    out.unlink()
    adapter = runs / "seed0-threads1" / "stages" / "s2" / "pytorch_lora_weights.safetensors"
    trained_at = adapter.stat().st_mtime_ns
    resumed = grid()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (again_record,) = read_records(out)
    assert adapter.stat().st_mtime_ns == trained_at
    assert {k: v for k, v in again_record.items() if k != "wall_s"} == {
        k: v for k, v in record.items() if k != "wall_s"
    }
    assert record["reused"] is None

    # Another recipe with the same first stage, reusing this grid: s1 is copied (not trained), s2 is trained.
    s2 = yaml.safe_load((root / "s2.yaml").read_text())
    (root / "s2-other.yaml").write_text(yaml.safe_dump(s2 | {"name": "s2-other", "iterations": 1, "eval_every": 1}))
    other_spec = CURRICULUM | {"stages": ["s1.yaml", "s2-other.yaml"]}
    (root / "other.yaml").write_text(yaml.safe_dump({"curriculum": other_spec}))
    other_out = tmp_path / "other.json"
    paths = {"--curriculum": "other.yaml", "--run-root": str(tmp_path / "other"), "--out": str(other_out)}
    cmd = [sys.executable, "-m", "benchmarks.robustness", "grid", "--seeds", "0", "--threads", "1", *args]
    cmd += [*(a for k, v in paths.items() for a in (k, v)), "--reuse", str(runs)]  # the last value given wins
    reusing = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert reusing.returncode == 0, reusing.stderr[-3000:]
    (other,) = read_records(other_out)
    assert other["reused"] == {"from": str(runs / "seed0-threads1"), "stages": ["s1"]}
    copied = tmp_path / "other" / "seed0-threads1" / "stages" / "s1" / "pytorch_lora_weights.safetensors"
    assert copied.read_bytes() == (runs / "seed0-threads1" / "stages" / "s1" / adapter.name).read_bytes()
    assert other["stages"][:2] == record["stages"][:2] and other["stages"][2]["stage"] == "s2-other"
    assert not (tmp_path / "other" / "seed0-threads1" / "work" / "s1").exists()  # copied, not trained


def test_give_backs_are_drops_below_an_earlier_stages_best_beyond_the_tolerance() -> None:
    from benchmarks.curriculum_runs import give_backs

    # The EPYC run of issue 42 (world PickScore on the 120 test prompts): stage 2 and stage 5 gave back.
    pick = [10.15, 10.70, 3.42, 12.91, 12.99, 2.27]
    stages = [
        {"stage": s, "world_pickscore": p} for s, p in zip(["base", "s1", "s2", "s3", "s4", "s5"], pick, strict=True)
    ]
    found = give_backs(stages)
    assert [(g["stage"], g["best_stage"], g["best"]) for g in found] == [("s2", "s1", 10.70), ("s5", "s4", 12.99)]
    # Within the tolerance (0.5), or under a best that never rose above the base: no give-back.
    assert (
        give_backs(
            [
                {"stage": "base", "world_pickscore": 10.0},
                {"stage": "a", "world_pickscore": 10.4},
                {"stage": "b", "world_pickscore": 9.95},
            ]
        )
        == []
    )
    assert give_backs([{"stage": "base", "ocr": 0.6}, {"stage": "a", "ocr": 0.5}, {"stage": "b", "ocr": 0.3}]) == []


def test_the_table_counts_runs_that_held_and_did_not_clutter() -> None:
    held = {
        **_record(0, 1, (0.1, 0.05, 0.15), (1.0, 0.5, 1.5)),
        "give_backs": [],
        "clutter": {"base": 0.2, "final": 0.1},
    }
    broke = {**_record(0, 2, (0.1, 0.05, 0.15), (1.0, 0.5, 1.5)), "give_backs": [{"stage": "s2"}]}
    broke["clutter"] = {"base": 0.2, "final": 0.35}
    assert gains_table([held, broke]).splitlines()[-2:] == [
        "Runs in which no stage gave back more than its tolerance on validation: 1 of 2",
        "Runs whose final clutter is at most the base's: 1 of 2",
    ]


def test_the_stages_table_puts_each_runs_validation_numbers_side_by_side(tmp_path: Path) -> None:
    def run(curriculum: str, seed: int, stages: list[tuple[str, float, float, int | None]]) -> dict:
        rows = [
            {"stage": name, "geneval_strict": strict, "world_pickscore": pick, "kept_iteration": kept}
            for name, strict, pick, kept in stages
        ]
        return {"seed": seed, "threads": 1, "curriculum": curriculum, "stages": rows, "give_backs": [{}] * seed}

    shipped = run("params/curricula/a.yaml", 0, [("base", 0.5, 10.0, None), ("s2-geneval", 0.625, 7.96, None)])
    shipped["clutter"] = {"stages": [{"clutter": 0.127}, {"clutter": 0.408}]}
    held = run("params/curricula/b.yaml", 2, [("base", 0.5, 10.0, None), ("s2-geneval-retain", 0.6, 11.6, 10)])
    assert stages_table([shipped, held]).splitlines() == [
        "| after | a, seed 0 x 1 | b, seed 2 x 1 |",
        "|---|---|---|",
        "| base | 0.500 / 10.00 | 0.500 / 10.00 |",
        "| s2-geneval / s2-geneval-retain | 0.625 / 7.96 | 0.600 / 11.60 (kept 10) |",
        "| give-backs beyond the tolerances | 0 | 2 |",
        "| clutter, base -> each stage | 0.127 -> 0.408 |  |",
    ]
    path_a, path_b = tmp_path / "a.json", tmp_path / "b.json"
    path_a.write_text(json.dumps([shipped]))
    path_b.write_text(json.dumps([held]))
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.robustness", "table", "--stages", str(path_a), str(path_b)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == stages_table([shipped, held])


def test_the_tuning_table_refuses_the_test_split_and_records_commit_and_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import paired_gain

    scores = json.loads((REPO / "metrics/base_eval.scores.json").read_text())
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"per_prompt": scores}))
    with pytest.raises(SystemExit, match="the test split; recipe selection reads the validation split"):
        paired_gain.main([str(run), "--base", str(REPO / "metrics/base_eval.scores.json")])
    # The same scores as a validation evaluation: accepted, and recorded with the split's file and hash.
    split = tmp_path / "validation.jsonl"
    split.write_text('{"prompt": "a photo of a square"}\n')
    (tmp_path / "base_validation.scores.json").write_text(json.dumps(scores))
    (tmp_path / "base_validation.json").write_text(json.dumps({"prompt_file": str(split)}))
    out = tmp_path / "record.json"
    paired_gain.main([str(run), "--base", str(tmp_path / "base_validation.scores.json"), "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["split"]["prompt_file"] == str(split) and len(record["split"]["sha256"]) == 64
    assert len(record["commit"]) == 40 and record["runs"][str(run)]["gain"] == 0.0
    assert "| run | iteration |" in capsys.readouterr().out
