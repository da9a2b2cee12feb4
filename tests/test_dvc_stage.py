"""tasks.dvc_stage, the command of DVC's `stage@N` and `ablation@...` stages: its inputs are checked before any
compute, and its metrics and plots files carry what `dvc metrics show` / `dvc plots show` read.
(`tests/test_pipeline_e2e.py` runs it under `dvc repro`.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.dvc_stage import main, plot_rows, stage_metrics

REPO = Path(__file__).resolve().parents[1]
CURRICULUM = str(REPO / "params/curricula/embedded.yaml")


def test_bad_stage_number_missing_files_and_missing_predecessor_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the curriculum's paths are relative to the project root
    common = ["--curriculum", CURRICULUM, "--run-root", str(tmp_path), "--metrics", str(tmp_path / "m.json")]
    assert main([*common, "--stage", "6"]) == 2
    assert "--stage 6" in capsys.readouterr().err
    assert main([*common, "--stage", "1", "--params", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main([*common, "--stage", "3"]) == 2  # stage 2's adapter is not under this run root
    assert "s2-geneval" in capsys.readouterr().err
    assert main([*common, "--stage", "2", "--set", "optim.lr=-1"]) == 2
    assert "lr" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_metrics_and_plot_rows() -> None:
    history = [{"iteration": float(i), "reward/total_mean": 0.1 * i, "reward/total_std": 1.0, "time/rollout_s": 2.0,
                "train/kl": 0.0, "surrogate/cv": 0.2} for i in range(3)]  # fmt: skip
    rows = plot_rows(history)
    assert rows[2] == {"iteration": 2.0, "reward/total_mean": pytest.approx(0.2), "train/kl": 0.0, "surrogate/cv": 0.2}
    evaluations = [{"iteration": 0, "eval/geneval": 0.1}, {"iteration": 3, "eval/geneval": 0.12}]
    result = {"name": "s1", "history": history, "resumed_from": 1, "wall_s": 12.34, "hash": "abc",
              "final_eval": {"eval/geneval": 0.123456789}, "evaluations": evaluations}  # fmt: skip
    metrics = stage_metrics(result, 1)
    assert metrics["iterations"] == 3 and metrics["wall_s"] == 12.3 and metrics["eval/geneval"] == 0.12346
    assert metrics["start/eval/geneval"] == 0.1 and metrics["resumed_from"] == 1


def test_the_flow_prints_one_row_per_stage() -> None:
    from flows.curriculum import summary_table
    from vgrpo.config import load_curriculum

    _, stages = load_curriculum(CURRICULUM, root=REPO)
    results = [{"name": c.name, "final_eval": {"eval/geneval_geneval_strict": 0.1 * i, "eval/ocr": 0.5,
                                               "eval/ocr_ci_low": 0.4, "eval/ocr_ci_high": 0.6}}
               for i, c in enumerate(stages[:2])]  # fmt: skip
    table = summary_table(stages[:2], results).splitlines()
    header = ["geneval_geneval_strict", "geneval_geneval_partial", "ocr", "world_clipscore", "world_pickscore"]
    assert table[0].split() == ["stage", *(w for h in header for w in (h, "[95%", "CI]"))]
    assert table[2].split() == ["s2-geneval", "0.100", "-", "0.500", "[0.400,", "0.600]", "-", "-"]
