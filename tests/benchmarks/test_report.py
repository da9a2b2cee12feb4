"""benchmarks: every planned cell's params validate, the bootstrap's pieces have known values, and the report
reads the paper's claims off cell records (synthetic here, so the numbers are known)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import bootstrap, grid, mlflow_runs, paired_gain, report
from benchmarks.common import METHODS, ROOT


@pytest.mark.parametrize("quick", [True, False])
def test_every_planned_cell_has_valid_params_and_the_same_rollout(quick: bool, tmp_path: Path) -> None:
    sizes = grid.QUICK if quick else grid.Sizes()
    best = {m: 2e-4 for m in METHODS} | {"flow_grpo": 4e-4}
    specs = [s for phase in grid.PHASES for s in grid.plan_phase(phase, sizes, best, quick)]
    assert len({s.name for s in specs}) == len(specs)
    trained = [s for s in specs if s.phase != "base"]
    configs = [grid.stage_config(s, sizes, tmp_path / "prompts.jsonl") for s in trained]
    rollouts = {(c.rollout.prompts_per_iteration, c.rollout.group_size, c.rollout.num_steps) for c in configs}
    assert rollouts == {(8, 8, 10)}
    for spec, config in zip(trained, configs, strict=True):
        assert config.algorithm.name == spec.method and config.optim.lr == spec.lr
        assert config.eval_at_start is False and config.iterations == spec.iterations
    if quick:
        assert {(s.method, s.lr) for s in trained} == {(m, lr) for m in ("vgrpo", "naive_elbo") for lr in (2e-4, 4e-4)}
        return
    by_phase = {p: [s for s in specs if s.phase == p] for p in grid.PHASES}
    assert len(by_phase["sweep"]) == 15 and all(s.split == "val" for s in by_phase["sweep"])
    assert all(s.split == "test" for p in ("methods", "stability", "ablation") for s in by_phase[p])
    assert {s.lr for s in by_phase["methods"] if s.method == "flow_grpo"} == {4e-4}
    assert {s.lr for s in by_phase["stability"]} == {4e-4} and len(by_phase["stability"]) == 10
    ablation = {s.variant: c for s, c in zip(trained, configs, strict=True) if s.phase == "ablation"}
    assert ablation["n_mc_2"].algorithm.n_mc == 2 and ablation["eps_prediction"].algorithm.prediction == "eps"


def test_the_sweep_picks_each_methods_best_validation_score(tmp_path: Path) -> None:
    for method in METHODS:
        for lr, score in ((1e-4, 0.5), (2e-4, 0.6 if method != "mixgrpo" else 0.4), (4e-4, 0.6)):
            spec = grid.RunSpec("sweep", method, lr=lr, split="val")
            (tmp_path / f"{spec.name}.json").write_text(
                json.dumps({"spec": {"method": method, "lr": lr}, "curve": [{"score": score}]})
            )
    best = grid.best_learning_rates(tmp_path)
    assert best["vgrpo"] == 2e-4  # a tie goes to the smaller rate
    assert best["mixgrpo"] == 4e-4
    # MixGRPO's best is the highest rate tried: the sweep goes one factor 2 further (and no further than 8e-4).
    extra = grid.sweep_extensions(tmp_path, grid.Sizes())
    assert [(s.method, s.lr) for s in extra] == [("mixgrpo", 8e-4)]
    spec = extra[0]
    (tmp_path / f"{spec.name}.json").write_text(
        json.dumps({"spec": {"method": "mixgrpo", "lr": 8e-4}, "curve": [{"score": 0.7}]})
    )
    assert grid.sweep_extensions(tmp_path, grid.Sizes()) == []  # 1.6e-3 is outside the bounds
    assert grid.best_learning_rates(tmp_path)["mixgrpo"] == 8e-4
    for p in tmp_path.glob("sweep-geneval-diffusion_nft-*"):
        p.unlink()
    with pytest.raises(RuntimeError, match="diffusion_nft"):
        grid.best_learning_rates(tmp_path)


def test_bootstrap_weights_reproduce_the_stratified_mean_and_resample_within_tags() -> None:
    tags = ["a", "a", "a", "b"]
    x = np.array([0.0, 1.0, 1.0, 0.0])
    assert bootstrap.point_weights(tags) @ x == pytest.approx((2 / 3 + 0.0) / 2)
    w = bootstrap.prompt_weights(tags, 500, np.random.default_rng(0))
    assert w.sum(axis=1) == pytest.approx(np.ones(500))
    assert w[:, 3] == pytest.approx(np.full(500, 0.5))  # the only "b" prompt always carries that tag's half
    assert (w @ x).mean() == pytest.approx(1 / 3, abs=0.02)


def test_curve_replicates_resample_seeds() -> None:
    scores = np.stack([np.full((2, 3), 0.2), np.full((2, 3), 0.6)])  # 2 seeds, 2 points, 3 prompts
    reps = bootstrap.curve_replicates(
        scores, bootstrap.prompt_weights(["t"] * 3, 400, np.random.default_rng(0)), np.random.default_rng(1)
    )
    assert set(np.round(reps[:, 0], 6)) == {0.2, 0.4, 0.6}  # both seeds drawn twice, or one of each
    assert reps.mean() == pytest.approx(0.4, abs=0.03)


def test_first_crossing_interpolates_and_reports_never_as_inf() -> None:
    xs = np.array([0.0, 10.0, 20.0])
    ys = np.array([[0.5, 0.6, 0.8], [0.5, 0.55, 0.58], [0.7, 0.7, 0.7]])
    assert bootstrap.first_crossing(xs, ys, 0.65) == pytest.approx([12.5, np.inf, 0.0])
    assert bootstrap.first_crossing(xs, ys, np.array([0.6, 0.55, 0.71])) == pytest.approx([10.0, 10.0, np.inf])
    low, high = bootstrap.interval(np.array([1.0] * 90 + [np.inf] * 10))
    assert low == 1.0 and high == np.inf
    assert bootstrap.verdict(0.2, 0.4, at_most=0.5) == "met"
    assert bootstrap.verdict(0.6, np.inf, at_most=0.5) == "missed"
    assert bootstrap.verdict(-0.1, 0.2, above=0.0) == "unresolved"


def _cell(
    phase: str,
    method: str,
    values: list[float],
    *,
    seed: int = 0,
    step_s: float = 10.0,
    steps_per_it: float = 2.0,
    variant: str = "default",
    cv: float = 0.2,
    lr: float = 2e-4,
    jitter: float = 0.0,
) -> dict[str, Any]:
    """A synthetic cell: 2 tags x 4 prompts, every prompt at the point's value (plus ``jitter`` on odd ones)."""
    spec = grid.RunSpec(phase, method, lr=lr, seed=seed, variant=variant, iterations=10 * len(values))
    curve = [
        {
            "iteration": 10.0 * (i + 1),
            "train_s": step_s * 10 * (i + 1),
            "gradient_steps": steps_per_it * 10 * (i + 1),
            "nfe": 1000.0 * (i + 1),
            "score": v,
            "partial": v,
            "per_prompt": [v + (jitter if p % 2 else -jitter) for p in range(8)],
            "tags": ["a"] * 4 + ["b"] * 4,
        }
        for i, v in enumerate(values)
    ]
    return {
        "spec": dataclasses.asdict(spec),
        "name": spec.name,
        "curve": curve,
        "wall_s": 60.0,
        "diverged": None,
        "skipped_iterations": 0,
        "gradient_steps_per_iteration": steps_per_it,
        "peak_rss_mb": 900.0,
        "time_split_s": {"iteration": step_s, "rollout": 1.0, "reward": 0.1, "prepare": 0.5, "update": 1.0},
        "surrogate_cv": cv,
        "surrogate_cv_within_group": cv / 2,
        "surrogate_cv_per_iteration": [cv] * 5,
        "surrogate_cv_within_group_per_iteration": [cv / 2] * 5,
        "config": {"optim": {"lr": lr}, "evaluation": {"group_size": 4}},
    }


def test_report_reads_the_claims_off_the_records(tmp_path: Path) -> None:
    base = {
        "spec": dataclasses.asdict(grid.RunSpec("base", "base")),
        "name": "base-geneval-test",
        "wall_s": 5.0,
        "curve": [
            {"iteration": 0.0, "score": 0.5, "partial": 0.5, "per_prompt": [0.5] * 8, "tags": ["a"] * 4 + ["b"] * 4}
        ],
    }
    cells = [base]
    for s in (0, 1, 2):
        cells += [
            _cell("methods", "vgrpo", [0.6, 0.7], seed=s, cv=0.1),
            _cell("methods", "naive_elbo", [0.55, 0.6], seed=s, cv=0.4),
            _cell("methods", "mixgrpo", [0.55, 0.6], seed=s, step_s=20.0),  # best 0.6 at 400 s
            _cell("methods", "flow_grpo", [0.8, 0.7], seed=s, step_s=10.0),  # best 0.8 at 100 s: never reached
            _cell("methods", "diffusion_nft", [0.6, 0.65], seed=s, steps_per_it=8.0),  # best 0.65 at 160 steps
        ]
    for s in range(5):
        cells += [
            _cell("stability", "vgrpo", [0.6], seed=s, lr=4e-4),
            _cell("stability", "naive_elbo", [0.2], seed=s, lr=4e-4),
        ]
    cells += [
        _cell("ablation", "vgrpo", [0.5, 0.5], variant="n_mc_2", jitter=0.1),
        _cell("ablation", "vgrpo", [0.6, 0.72], variant="n_mc_8", jitter=0.1),
    ]
    out = tmp_path / "cells"
    out.mkdir()
    for c in cells:
        (out / f"{c['name']}.json").write_text(json.dumps(c))
    docs = tmp_path / "docs"
    report.write_report(
        out,
        docs,
        command="python -m benchmarks.compare",
        planned=[c["name"] for c in cells] + ["x"],
        sizes=grid.Sizes(),
    )
    text = (docs / "README.md").read_text()
    # V-GRPO (0.5 at 0 s, 0.6 at 100 s, 0.7 at 200 s) reaches MixGRPO's best 0.6 at 100 s against its 400 s.
    assert "| 0.25 [0.25, 0.25] | reproduced |" in text
    assert "Flow-GRPO's best held-out reward in at most half its wall time | faster" in text
    assert "| inf [inf, inf] | refuted |" in text  # 0.8 is never reached
    # DiffusionNFT's best 0.65 after 160 steps; V-GRPO reaches it halfway between 20 and 40 steps: 30 / 160.
    assert "| 0.19 [0.19, 0.19] | reproduced |" in text
    assert "| +0.100 [+0.100, +0.100] | reproduced |" in text  # V-GRPO ends 0.1 above naive
    assert "0/5 against 5/5 (Fisher exact p = 0.01) | reproduced |" in text
    assert "0.400 -> 0.100 (ratio 0.25 [0.25, 0.25]) | reproduced |" in text
    assert "| N_MC 2 fails to converge (final strict, N_MC 4 minus N_MC 2) | N_MC 2 fails to converge | +0.200 " in text
    assert "| naive ELBO-GRPO | 0.0002 | 3 | 0.600 [0.600, 0.600] | +0.100 [+0.100, +0.100] |" in text
    assert "Not run yet (1; the command resumes the grid): x" in text
    assert all((docs / f"geneval-vs-{a}.png").stat().st_size > 1000 for a in ("train_s", "gradient_steps", "nfe"))
    assert len((docs / "cells.jsonl").read_text().splitlines()) == len(cells)
    again = tmp_path / "again"
    report.write_report(
        docs / "cells.jsonl",
        again,
        command="python -m benchmarks.compare",
        planned=[c["name"] for c in cells] + ["x"],
        sizes=grid.Sizes(),
    )
    assert (again / "README.md").read_text() == text  # the committed records rebuild the same report


def test_each_cell_becomes_one_mlflow_run_under_one_parent(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tasks.tracking import tracking_uri

    base = {
        "spec": dataclasses.asdict(grid.RunSpec("base", "base")),
        "name": "base-geneval-test",
        "wall_s": 5.0,
        "curve": [{"iteration": 0.0, "score": 0.5, "per_prompt": [0.5] * 8, "tags": ["a"] * 8}],
    }
    records = {
        c["name"]: c
        for c in (base, _cell("methods", "vgrpo", [0.6, 0.7]), _cell("methods", "naive_elbo", [0.55, 0.6], lr=1e-4))
    }
    uri = tracking_uri(tmp_path / "mlflow")
    mlflow_runs.track(records, uri, grid="full")
    mlflow_runs.track(records, uri, grid="full")  # idempotent: a resumed grid adds only new cells
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vgrpo-benchmarks")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("bench.role") == "parent"]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("bench.role") == "cell"}
    assert len(parent) == 1 and len(children) == 3
    assert all(r.data.tags["mlflow.parentRunId"] == parent[0].info.run_id for r in children.values())
    v = children[_cell("methods", "vgrpo", [0.6])["name"]]
    assert v.data.params["method"] == "vgrpo" and v.data.params["lr"] == "0.0002"
    history = client.get_metric_history(v.info.run_id, "heldout/score")
    assert [(m.step, m.value) for m in history] == [(10, 0.6), (20, 0.7)]


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


def _without_progress(text: str) -> list[str]:
    """The report's lines less those on how much of the planned grid ran (the standalone report plans only the
    records it is given)."""
    return [
        line
        for line in text.replace("\n\nNot run yet", "\nNot run yet").splitlines()
        if not line.startswith(("Cells done:", "Not run yet"))
    ]


@pytest.mark.parametrize("folder", ["benchmarks", "benchmarks-quick"])
def test_the_committed_records_rebuild_the_committed_report(folder: str, tmp_path: Path) -> None:
    committed = ROOT / "docs" / folder
    quick = folder.endswith("-quick")
    records = report.load_records(committed / "cells.jsonl")
    report.write_report(
        committed / "cells.jsonl",
        tmp_path,
        command="python -m benchmarks.compare" + " --quick" * quick,
        planned=list(records),
        quick=quick,
        sizes=grid.QUICK if quick else grid.Sizes(),
    )
    rebuilt, text = (tmp_path / "README.md").read_text(), (committed / "README.md").read_text()
    assert _without_progress(rebuilt) == _without_progress(text)
    if quick:  # every planned cell ran
        assert rebuilt == text
    assert (tmp_path / "cells.jsonl").read_bytes() == (committed / "cells.jsonl").read_bytes()
