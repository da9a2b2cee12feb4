"""benchmarks/compare.py and benchmarks/report.py: every planned run's params validate, and the report computes
its tables and targets from run records (synthetic here, so the numbers are known)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402
import paired_gain  # noqa: E402
import report  # noqa: E402


@pytest.mark.parametrize("quick", [True, False])
def test_every_planned_run_has_valid_params_with_equal_rollout_budgets(quick: bool) -> None:
    args = argparse.Namespace(iterations=16, eval_every=4, eval_prompts=24, prompts=4, group=8)
    runs = compare.plan(quick)
    assert len({r.name for r in runs}) == len(runs)
    assert {r.method for r in runs if r.group == "methods"} == set(compare.METHODS)
    configs = [compare.stage_config(r, args) for r in runs]
    assert {(c.rollout.prompts_per_iteration, c.rollout.group_size, c.rollout.num_steps, c.iterations)
            for c in configs} == {(4, 8, 10, 16)}  # fmt: skip
    for spec, config in zip(runs, configs, strict=True):
        assert config.algorithm.name == spec.method
    if not quick:
        lrs = {(r.method, r.lr_scale): c.optim.lr for r, c in zip(runs, configs, strict=True) if r.reward == "geneval"}
        assert lrs[("flow_grpo", 2.0)] == pytest.approx(2 * lrs[("flow_grpo", 1.0)])
        ablation = {r.variant: c for r, c in zip(runs, configs, strict=True) if r.group == "ablation"}
        assert ablation["no_shared_pairs"].algorithm.share == "none"
        assert (
            ablation["multi_step_kl"].optim.gradient_steps == 2 and ablation["multi_step_kl"].algorithm.kl_coef == 0.3
        )


def _record(method: str, seed: int, values: list[float], *, step_s: float, steps_per_it: float = 1.0,
            reward: str = "geneval", cv: float | None = None) -> dict[str, Any]:  # fmt: skip
    curve = [
        {"iteration": 4.0 * i, "train_s": step_s * 4 * i, "gradient_steps": steps_per_it * 4 * i, "nfe": 400.0 * i,
         "geneval_partial": v, "geneval_strict": v / 2}
        for i, v in enumerate(values)
    ]  # fmt: skip
    spec = {"group": "methods", "method": method, "reward": reward, "lr_scale": 1.0, "seed": seed,
            "variant": "default", "overrides": {}}  # fmt: skip
    return {"spec": spec, "name": f"{method}-{seed}", "curve": curve, "iterations": 8, "samples_per_iteration": 32,
            "lr": 3e-4, "skipped_iterations": 0, "peak_rss_mb": 900.0, "surrogate_cv": cv, "wall_s": 60.0,
            "surrogate_cv_within_group": None if cv is None else cv / 4,
            "time_split_s": {"total": step_s, "rollout": 1.0, "reward": 0.1, "prepare": 0.5,
                             "update": step_s - 1.6}}  # fmt: skip


def test_report_computes_targets_and_variance_from_the_records(tmp_path: Path) -> None:
    runs = [
        _record("vgrpo", 0, [0.10, 0.20, 0.30], step_s=5.0, cv=0.1),
        _record("vgrpo", 1, [0.10, 0.22, 0.28], step_s=5.0, cv=0.1),
        _record("naive_elbo", 0, [0.10, 0.04, 0.03], step_s=5.0, cv=0.3),  # collapses: 0.03 < 0.5 x 0.10
        _record("flow_grpo", 0, [0.10, 0.15, 0.20], step_s=20.0, steps_per_it=2.0),
        _record("diffusion_nft", 0, [0.10, 0.12, 0.21], step_s=6.0, steps_per_it=4.0),
    ]
    for r in runs:
        (tmp_path / f"{r['name']}.json").write_text(json.dumps(r))
    docs = tmp_path / "docs"
    report.write_report(
        tmp_path, docs, command="python benchmarks/compare.py", planned=[r["name"] for r in runs] + ["x"]
    )
    text = (docs / "README.md").read_text()
    # Flow-GRPO's best 0.20 at 160 s; V-GRPO's mean curve (0.21 at 20 s) reaches it at the first point: 20 / 160.
    assert "ratio 0.12 (target <= 0.5): **met**" in text
    # DiffusionNFT's final 0.21 after 32 steps; V-GRPO's mean reaches it after 4 steps: 4 / 32 = 0.125.
    assert "ratio 0.12 (target <= 0.33): **met**" in text
    assert "| naive ELBO-GRPO | 1 | 0.100 | 0.030 +- n/a | 0.100 | 1/1 |" in text
    assert "| V-GRPO | 0.100 | 0.025 |" in text and "| naive ELBO-GRPO | 0.300 | 0.075 |" in text
    assert "Not run yet (1; the command resumes the grid): x" in text
    assert all((docs / f"geneval-vs-{axis}.png").stat().st_size > 1000 for axis in ("train_s", "gradient_steps", "nfe"))
    assert len((docs / "runs.jsonl").read_text().splitlines()) == 5


def test_a_target_never_reached_is_reported_missed() -> None:
    v = report.mean_curve([_record("vgrpo", 0, [0.1, 0.12, 0.13], step_s=5.0)], "geneval_partial")
    f = report.mean_curve([_record("flow_grpo", 0, [0.1, 0.2, 0.3], step_s=20.0)], "geneval_partial")
    lines = report._targets({"vgrpo": v, "flow_grpo": f})
    assert "**not reached**" in lines[0] and "target missed" in lines[0]
    assert report.first_reaching(f, 0.2, "train_s") == 80.0


def test_each_record_becomes_one_mlflow_run(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tasks.tracking import tracking_uri

    records = tmp_path / "records"
    records.mkdir()
    for r in (_record("vgrpo", 0, [0.1, 0.2], step_s=5.0, cv=0.2), _record("naive_elbo", 0, [0.1, 0.1], step_s=5.0)):
        (records / f"{r['name']}.json").write_text(json.dumps(r))
    uri = tracking_uri(tmp_path / "mlflow")
    assert len(report.log_to_mlflow(records, uri)) == 2
    assert report.log_to_mlflow(records, uri) == []  # idempotent
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vgrpo-bench")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"vgrpo-0", "naive_elbo-0"}
    history = client.get_metric_history(runs["vgrpo-0"].info.run_id, "held_out/geneval_partial")
    assert [(m.step, m.value) for m in history] == [(0, 0.1), (4, 0.2)]
    assert runs["vgrpo-0"].data.metrics["surrogate_cv"] == 0.2
    assert runs["vgrpo-0"].data.tags["vgrpo.bench.method"] == "vgrpo"


def test_paired_gain_pairs_images_and_splits_the_colour_prompts() -> None:
    prompts = ["a photo of a red triangle", "a photo of a green square", "a photo of two circles", "a sign"]
    tags = ["colors", "colors", "counting", "ocr"]
    base = {
        "prompt": [*prompts, "not evaluated by the run"],
        "tag": [*tags, "counting"],
        "geneval": {"strict": [0.25, 0.5, 0.5, None, 0.0]},
        "ocr": {"mean": [None, None, None, 0.5, None]},
    }
    run = {
        "prompt": prompts,
        "tag": tags,
        "geneval": {"strict": [0.0, 1.0, 0.75, None]},
        "ocr": {"mean": [None, None, None, 0.75]},
    }
    row = paired_gain.paired_row(run, base, [("red", "triangle")])
    # strict is the mean over tags: colors (0 + 1) / 2, counting 0.75; the base's (0.25 + 0.5) / 2 and 0.5
    assert row["strict"] == pytest.approx((0.5 + 0.75) / 2) and row["base_strict"] == pytest.approx((0.375 + 0.5) / 2)
    assert row["gain"] == pytest.approx(row["strict"] - row["base_strict"])
    assert row["per_tag_gain"] == pytest.approx({"colors": 0.125, "counting": 0.25})
    assert row["held_out_colour_gain"] == pytest.approx(-0.25) and row["seen_colour_gain"] == pytest.approx(0.5)
    assert row["ocr_gain"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="first prompts"):
        paired_gain.paired_row({**run, "prompt": prompts[::-1]}, base, [])
