"""tasks.dvc_stage, the command of DVC's `stage@N` stages: its inputs are checked before any compute, and its
metrics, details and plots files carry what `dvc metrics show` / `dvc plots show` read
(`tests/flows/test_pipeline_e2e.py`
runs it under `dvc repro`); tasks.dvc_report's headline files and PNG plots; the project's dvc.yaml declares only
metrics files that exist and are short, and only image plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.dvc_report import flat_eval, moving_average, summaries
from tasks.dvc_report import main as report_main
from tasks.dvc_stage import main, plot_rows, stage_details, stage_metrics
from tasks.outcome import StageOutcome
from vgrpo.config import load_config
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.evaluation.tables import headline_metrics

REPO = Path(__file__).resolve().parents[2]
CURRICULUM = str(REPO / "params/curricula/embedded.yaml")
EVALUATION_PARAMS = REPO / "params/embedded/evaluate.yaml"
EVALUATION = load_config([EVALUATION_PARAMS], section="evaluation", schema=EvaluationConfig)


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


def test_metrics_details_and_plot_rows() -> None:
    history = [
        {
            "iteration": float(i),
            "reward/total_mean": 0.1 * i,
            "reward/total_std": 1.0,
            "time/rollout_s": 2.0,
            "train/kl": 0.0,
            "surrogate/cv": 0.2,
        }
        for i in range(3)
    ]
    rows = plot_rows(history)
    assert rows[2] == {"iteration": 2.0, "reward/total_mean": pytest.approx(0.2), "train/kl": 0.0, "surrogate/cv": 0.2}
    evaluations = [{"iteration": 0, "eval/geneval": 0.1}, {"iteration": 3, "eval/geneval": 0.12}]
    final = {
        "eval/geneval": 0.123456789,
        "eval/geneval_geneval_strict": 0.5,
        "eval/geneval_geneval_strict_ci_low": 0.4,
        "eval/world_pickscore": 12.0,
        "eval/pickscore": 3.0,
        "eval/ocr_exact": 0.3,
    }
    outcome = StageOutcome(
        "s1",
        "out",
        "abc",
        resumed_from=1,
        wall_s=12.34,
        history=tuple(history),
        evaluations=tuple(evaluations),
        final_eval=final,
    )
    details = stage_details(outcome, 1)
    assert details["iterations"] == 3 and details["wall_s"] == 12.3 and details["eval/geneval"] == 0.12346
    assert details["start/eval/geneval"] == 0.1 and details["resumed_from"] == 1 and details["adapter_hash"] == "abc"
    # The metrics file: short names only, the world reward ahead of a generic one of the same kind.
    assert stage_metrics(details, EVALUATION.rewards) == {
        "iterations": 3,
        "wall_s": 12.3,
        "strict": 0.5,
        "pickscore": 12.0,
    }


def test_summary_headlines_of_the_committed_metrics_files(tmp_path: Path) -> None:
    heads = summaries(REPO / "metrics", EVALUATION.rewards)
    base = json.loads((REPO / "metrics/base_eval.json").read_text())
    assert heads["base_eval"]["strict"] == round(base["rewards"]["geneval"]["geneval_strict"], 5)
    assert heads["base_eval"]["pickscore"] == round(base["rewards"]["world_pickscore"]["mean"], 5)
    assert "strict_gain" in heads["curriculum_eval"] and "strict_gain" not in heads["base_eval"]
    assert flat_eval(base)["eval/geneval_geneval_strict"] == base["rewards"]["geneval"]["geneval_strict"]
    # The same short names as a stage's final evaluation.
    assert headline_metrics(flat_eval(base), EVALUATION.rewards) == heads["base_eval"]
    assert set(heads["world_clip"]) == {"acc"} and set(heads["pretrain"]) == {"wall_s", "loss"}
    # The committed headline files are what the summary stage writes from the committed detailed files.
    for stem, numbers in heads.items():
        assert json.loads((REPO / "metrics/summary" / f"{stem}.json").read_text()) == numbers, stem
    args = [
        "summary",
        "--src",
        str(REPO / "metrics"),
        "--out",
        str(tmp_path / "s"),
        "--evaluation",
        str(EVALUATION_PARAMS),
    ]
    assert report_main(args) == 0
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(f"{stem}.json" for stem in heads)


def test_plots_are_pngs_drawn_from_the_rows(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [
        {"iteration": float(i), "reward/total_mean": 0.1 * i, "train/kl": 0.0, "train/grad_norm": 1.0} for i in range(5)
    ]
    (tmp_path / "s1.json").write_text(json.dumps(rows))
    assert report_main(["plots", str(tmp_path)]) == 0
    png = (tmp_path / "s1.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert report_main(["plots", str(tmp_path)]) == 0 and (tmp_path / "s1.png").read_bytes() == png  # same bytes
    assert moving_average([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]


def _dvc_outputs() -> list[tuple[str, str]]:
    """(kind, path) of every output dvc.yaml declares, foreach stages expanded by DVC itself."""
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:
        return [
            ("metric" if o.metric else "plot" if o.plot else "out", o.def_path)
            for s in repo.index.stages
            for o in s.outs
        ]


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


MAX_METRICS_KEYS = 8  # `dvc metrics show` prints one column per key over all files


def test_dvc_yaml_metrics_exist_and_are_short_and_plots_are_images() -> None:
    pytest.importorskip("dvc")
    outputs = _dvc_outputs()
    metrics = [path for kind, path in outputs if kind == "metric"]
    assert "metrics/stages/s5-ocr.json" in metrics and "metrics/summary/curriculum_eval.json" in metrics
    for path in metrics:
        assert (REPO / path).is_file(), f"{path} is declared as a metric but missing: dvc metrics show fails on it"
        keys = _flat(json.loads((REPO / path).read_text()))
        assert len(keys) <= MAX_METRICS_KEYS, (path, sorted(keys))
    plots = [path for kind, path in outputs if kind == "plot"]
    assert plots and all(path.endswith(".png") for path in plots), plots  # a JSON plot makes a CDN-loading page


def test_dvc_metrics_show_is_clean_and_narrow() -> None:
    pytest.importorskip("dvc")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "metrics", "show"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[0] == "Path" and any("metrics/stages/s1-preference.json" in line for line in lines)
    assert max(map(len, lines)) <= 160


def test_the_flow_prints_one_row_per_stage() -> None:
    from flows.artifacts import summary_table
    from vgrpo.config import load_curriculum

    _, stages = load_curriculum(CURRICULUM, root=REPO)
    final = {"eval/ocr": 0.5, "eval/ocr_ci_low": 0.4, "eval/ocr_ci_high": 0.6}
    results = [
        StageOutcome(c.name, "out", "abc", final_eval={"eval/geneval_geneval_strict": 0.1 * i, **final})
        for i, c in enumerate(stages[:2])
    ]
    table = summary_table(stages[:2], results).splitlines()
    header = ["geneval_geneval_strict", "geneval_geneval_partial", "ocr", "world_clipscore", "world_pickscore"]
    assert table[0].split() == ["stage", *(w for h in header for w in (h, "[95%", "CI]"))]
    assert table[2].split() == ["s2-geneval", "0.100", "-", "0.500", "[0.400,", "0.600]", "-", "-"]
