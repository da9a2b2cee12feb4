"""benchmarks.compare: the grid's plan (every cell's params validate; seeds, rates and prompt files as the protocol
says), resume by provenance key, the statistics' pieces with known values, and the report read off synthetic
records whose effects are known, rebuilt from the committed records, with an interval recomputed independently."""

from __future__ import annotations

import json
from argparse import Namespace
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import provenance
from benchmarks.common import GENEVAL_TAGS, METHODS, ROOT
from benchmarks.compare import (
    analysis,
    bootstrap,
    cell_runs,
    claim_rows,
    claims,
    collapse,
    mlflow_runs,
    plan,
    plan_v3,
    registered,
    report,
    verdicts,
)
from tests.benchmarks.compare import synthetic
from vgrpo.world import read_jsonl


@pytest.mark.parametrize("quick", [True, False])
def test_every_planned_cell_has_valid_params_and_the_same_rollout(quick: bool, tmp_path: Path) -> None:
    sizes = plan.QUICK if quick else plan.Sizes()
    best = {m: 2e-4 for m in METHODS} | {"flow_grpo": 4e-4}
    specs = [s for phase in plan.PHASES for s in plan.plan_phase(phase, sizes, best, quick)]
    assert len({s.name for s in specs}) == len(specs)
    trained = [s for s in specs if s.phase != "base"]
    configs = [plan.stage_config(s, sizes, tmp_path / "prompts.jsonl") for s in trained]
    rollouts = {(c.rollout.prompts_per_iteration, c.rollout.group_size, c.rollout.num_steps) for c in configs}
    assert rollouts == {(8, 8, 10)}
    for spec, config in zip(trained, configs, strict=True):
        assert config.algorithm.name == spec.method and config.optim.lr == spec.lr
        assert config.eval_at_start is False and config.iterations == spec.iterations
        assert config.evaluation.group_size == 1 and config.checkpoint_every == spec.iterations
    if quick:
        assert {(s.method, s.lr) for s in trained} == {(m, lr) for m in ("vgrpo", "naive_elbo") for lr in (2e-4, 4e-4)}
        return
    by_phase = {p: [s for s in specs if s.phase == p] for p in plan.PHASES}
    assert Counter(s.phase for s in specs) == {
        "base": 3,
        "sweep": 40,
        "methods": 25,
        "stability": 24,
        "ablation": 12,
        "preference": 6,
    }
    assert all(s.split == "val" and s.seed in (200, 201) and s.iterations == 30 for s in by_phase["sweep"])
    assert all(s.split == "test" for p in ("methods", "stability", "ablation") for s in by_phase[p])
    assert {s.lr for s in by_phase["methods"] if s.method == "flow_grpo"} == {4e-4}
    # Stability: fresh seeds, 2x and 4x each method's own rate (the preference stage's rate: 5e-4), every 5.
    stab = by_phase["stability"]
    assert {s.seed for s in stab} == {100, 101, 102} and {s.eval_every for s in stab} == {5}
    assert {(s.reward, s.variant, s.lr) for s in stab} == {
        ("geneval", "x2", 4e-4),
        ("geneval", "x4", 8e-4),
        ("preference", "x2", 1e-3),
        ("preference", "x4", 2e-3),
    }
    ablation = {(s.variant, s.seed): c for s, c in zip(trained, configs, strict=True) if s.phase == "ablation"}
    assert len(ablation) == 12 and {seed for _, seed in ablation} == {0, 1, 2}
    assert ablation["n_mc_2", 0].algorithm.n_mc == 2 and ablation["eps_prediction", 1].algorithm.prediction == "eps"


def test_the_evaluation_prompts_are_balanced_and_the_validation_draw_is_not_the_test_draw(tmp_path: Path) -> None:
    sizes = plan.Sizes()
    test = read_jsonl(plan.eval_prompt_file(tmp_path, "geneval", "test", sizes))
    val = read_jsonl(plan.eval_prompt_file(tmp_path, "geneval", "val", sizes))
    pref = read_jsonl(plan.eval_prompt_file(tmp_path, "preference", "test", sizes))
    assert len(test) == 540 >= 512 and Counter(r["tag"] for r in test) == {t: 90 for t in GENEVAL_TAGS}
    assert len(pref) == 630 and Counter(r["tag"] for r in pref)["ocr"] == 90
    assert len(val) == 240
    assert [r["prompt"] for r in test[:24]] != [r["prompt"] for r in val[:24]]  # another seed's draw
    # The file is written once and read back: a second call returns the same draw.
    assert read_jsonl(plan.eval_prompt_file(tmp_path, "geneval", "test", sizes)) == test


def _sweep(method: str, lr: float, score_by_seed: list[float]) -> dict[str, dict]:
    out = {}
    for i, score in enumerate(score_by_seed):
        spec = plan.sweep_spec(method, lr, i, plan.Sizes())
        out[spec.name] = {"spec": {**spec.__dict__}, "curve": [{"score": score}], "name": spec.name}
    return out


def test_the_sweep_picks_the_best_seed_mean_and_extends_until_the_best_is_interior() -> None:
    sizes = plan.Sizes()
    records: dict[str, dict] = {}
    for m in METHODS:
        for lr, scores in ((1e-4, [0.5, 0.5]), (2e-4, [0.6, 0.62]), (4e-4, [0.7, 0.5]), (8e-4, [0.4, 0.4])):
            records |= _sweep(m, lr, scores if m != "mixgrpo" else [0.1 * lr / 1e-4] * 2)
    best = plan.best_learning_rates(records, sizes)
    assert best["vgrpo"] == 2e-4  # 0.61 against 0.60: the seed mean, not the best single seed
    assert best["mixgrpo"] == 8e-4  # at the top edge: one rung further, with every sweep seed
    extra = plan.sweep_extensions(records, sizes)
    assert sorted((s.method, s.lr, s.seed) for s in extra) == [("mixgrpo", 1.6e-3, 200), ("mixgrpo", 1.6e-3, 201)]
    # The later phases are planned only when the sweep is finished.
    assert {s.phase for s in plan.full_plan(records, sizes, False)} == {"base", "sweep"}
    records |= _sweep("mixgrpo", 1.6e-3, [0.5, 0.5])  # below 8e-4's 0.8: the best is interior now
    assert plan.sweep_extensions(records, sizes) == []
    planned = plan.full_plan(records, sizes, False)
    assert {s.lr for s in planned if s.phase == "methods" and s.method == "mixgrpo"} == {8e-4}
    # One finished seed of a rung does not count; a seed outside the sweep's does not either.
    partial = {k: v for k, v in records.items() if not k.endswith("s201") or "diffusion_nft" not in k}
    with pytest.raises(RuntimeError, match="diffusion_nft"):
        plan.best_learning_rates(partial, sizes)


def test_a_record_is_reused_only_under_its_key_and_a_stale_one_is_kept(tmp_path: Path, monkeypatch) -> None:
    spec = plan.RunSpec("methods", "vgrpo", lr=2e-4, seed=0, iterations=80)
    monkeypatch.setattr(cell_runs, "expected_key", lambda spec, sizes, out, threads: f"key-{threads}")
    path = tmp_path / f"{spec.name}.json"
    path.write_text(json.dumps({"key": "key-2", "machine": {"under_load": True}}))
    args = Namespace(threads=2, rerun_loaded=False)
    assert cell_runs.reusable(spec, args, plan.Sizes(), tmp_path)
    assert not cell_runs.reusable(spec, Namespace(threads=1, rerun_loaded=False), plan.Sizes(), tmp_path)
    assert not path.exists() and len(list((tmp_path / "stale").glob(f"{spec.name}.key-2.*.json"))) == 1
    path.write_text(json.dumps({"key": "key-2", "machine": {"under_load": True}}))
    assert not cell_runs.reusable(spec, Namespace(threads=2, rerun_loaded=True), plan.Sizes(), tmp_path)


def test_the_grid_resumes_from_the_committed_records_and_writes_them_back(tmp_path: Path) -> None:
    committed, out = tmp_path / "cells.jsonl", tmp_path / "out"
    out.mkdir()
    rows = [{"name": "a", "key": "k", "spec": {}}, {"name": "old", "spec": {}}]  # "old" predates keys
    committed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cell_runs.sync_records(out, committed, export=False)
    assert sorted(p.name for p in out.glob("*.json")) == ["a.json"]
    (out / "b.json").write_text(json.dumps({"name": "b", "key": "k2", "spec": {}}))
    cell_runs.sync_records(out, committed, export=True)
    assert [json.loads(line)["name"] for line in committed.read_text().splitlines()] == ["a", "b"]


def test_holm_bootstrap_p_values_budget_reading_and_worst_drop_have_known_values() -> None:
    assert verdicts.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    reps = np.concatenate([np.full(97, 1.0), np.full(3, -1.0)])
    p, lean = verdicts.test(reps, 0.0)
    assert lean == "above" and p == pytest.approx(2 * 4 / 101)
    xs = np.array([0.0, 10.0, 20.0])
    c = np.array([[0.5, 0.6, 0.8], [0.5, 0.7, 0.8]])  # 2 seeds, 3 points
    assert analysis.at_budget(xs, c, 15.0) == pytest.approx(0.725)
    assert analysis.at_budget(xs, c, 10.0) == pytest.approx(0.65)
    assert np.isnan(analysis.at_budget(xs, c, 25.0))
    base = {"curve": [{"score": 0.5, "per_prompt": [0.5, 0.5], "tags": ["a", "b"]}]}
    runs = [
        {"curve": [{"per_prompt": [0.3, 0.3], **_axes(10, 0.3)}, {"per_prompt": [0.6, 0.6], **_axes(20, 0.6)}]},
        {"curve": [{"per_prompt": [0.6, 0.6], **_axes(10, 0.6)}], "diverged": "non-finite loss"},
    ]
    g = analysis.Group(runs, base)
    # Seed 0 fell 0.2 below the base before recovering; seed 1 diverged: its drop is the base's whole score.
    assert g.worst_drop(g.per_seed(bootstrap.point_weights(["a", "b"]))) == pytest.approx([0.2, 0.5])
    assert collapse.collapsed(runs[0], base, 0.1) and not collapse.collapsed(runs[0], base, 0.25)


def test_holm_counts_a_confirmatory_row_not_run_yet_as_p_one() -> None:
    pre_registered = ("E1", "E3", "N1", "N2", "S1", "S2", "A1", "A2", "A3", "A4", "A5", "A6", "C1", "C2")
    assert pre_registered == claims.V2.confirmatory
    ran = [verdicts.Row(id=i, claim="", paper="", rule="", p=0.004, extra={"lean": "above"}) for i in ("E1", "S2")]
    not_run = verdicts.Row(id="A1", claim="", paper="", rule="")
    verdicts.decide(
        [*ran, not_run], claims.V2.confirmatory
    )  # the other eleven confirmatory rows are not even passed: they count as p = 1
    # The two ran rows share the smallest p: the first is adjusted by 14, the second by 13 and carried up to it.
    assert [r.p_holm for r in ran] == pytest.approx([0.056, 0.056])
    assert [r.verdict for r in ran] == ["unresolved (Holm)", "unresolved (Holm)"]
    assert not_run.verdict == "not run" and not_run.p_holm is None
    # Over the two ran rows alone the same p-values would pass (2 x 0.004): rows not run yet make Holm stricter,
    # never laxer (a row's own new cells can still move its p-value either way).
    assert verdicts.holm({"E1": 0.004, "S2": 0.004})["E1"] == pytest.approx(0.008)


def _axes(it: int, score: float) -> dict[str, float]:
    return {"iteration": float(it), "train_s": 3.0 * it, "gradient_steps": 2.0 * it, "nfe": 100.0 * it, "score": score}


def test_fisher_power() -> None:
    # 5 seeds per arm: only 5/5 against 0/5 (p = 0.008) or 4/5 against 0/5 (p = 0.048) pass at 0.05.
    assert collapse.fisher_power(5, 0.5, 0.0) == pytest.approx((1 + 5) / 32)
    n = collapse.seeds_for_power(0.5, 0.0)
    assert n is not None and collapse.fisher_power(n, 0.5, 0.0) >= 0.8 > collapse.fisher_power(n - 1, 0.5, 0.0)


def test_a_replicate_at_the_threshold_counts_on_both_sides_whatever_its_rounding() -> None:
    # Two replicates are 0 in exact arithmetic; one reads 1e-17 above, one 1e-17 below after floating-point sums.
    reps = np.concatenate([np.full(96, 1.0), [1e-17, -1e-17], np.full(2, -1.0)])
    p, lean = verdicts.test(reps, 0.0)
    assert lean == "above" and p == pytest.approx(2 * (1 + 4) / 101)


@pytest.fixture(scope="module")
def synthetic_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[verdicts.Row], dict]:
    records = synthetic.full_grid()
    folder = tmp_path_factory.mktemp("grid")
    for name, r in records.items():
        (folder / f"{name}.json").write_text(json.dumps(r))
    docs = tmp_path_factory.mktemp("docs")
    planned = [s.name for s in plan.full_plan(records, plan.Sizes(), False)] + ["not-run-cell"]
    rows = report.write_report(folder, docs, command="python -m benchmarks.compare", planned=planned, code_now="c")
    return docs, rows, records


def test_the_report_reads_every_claim_off_the_records(synthetic_report) -> None:
    docs, rows, _ = synthetic_report
    by_id = {r.id: r for r in rows}
    # V-GRPO at 40 iterations, 0.2 (1 - e^(-40/15)) = 0.186, minus MixGRPO at 80, 0.08 (1 - e^-2) = 0.069.
    assert by_id["E1"].estimate == pytest.approx(0.186 - 0.069, abs=0.01) and by_id["E1"].verdict == "reproduced"
    # At a third of DiffusionNFT's 80 iterations (its 160 gradient steps) V-GRPO (0.164, read between 20 and 30
    # iterations) is 0.042 below its final 0.206: beyond the paper's own 0.03 margin, so "matches" is refuted.
    assert by_id["E3"].estimate == pytest.approx(-0.042, abs=0.01) and by_id["E3"].verdict == "refuted"
    assert "a third of the iterations is a third of the gradient steps" in by_id["E3"].note
    assert by_id["N1"].verdict == by_id["N2"].verdict == "reproduced"
    assert by_id["S1"].estimate == pytest.approx(0.2, abs=0.03) and by_id["S1"].verdict == "reproduced"
    assert "naive 6/6, V-GRPO 0/6" in by_id["S1"].note and by_id["S2"].verdict == "reproduced"
    # N_MC 2 gains 0.1 (1 - e^-2) = 0.086 > 0.02: it does not fail to converge; it converges slower.
    assert by_id["A1"].verdict == "refuted" and by_id["A2"].verdict == "reproduced"
    assert by_id["A3"].verdict == "reproduced"  # N_MC 8 adds 0.005 (1 - e^(-80/15)), inside the margin
    assert by_id["A6"].verdict == "reproduced" and by_id["A6"].estimate == pytest.approx(0.15, abs=0.02)
    assert by_id["C1"].estimate == pytest.approx(1 / 3, abs=0.01) and by_id["C1m"].verdict == "differs"
    confirmatory = [r for r in rows if r.family == "confirmatory"]
    assert len(confirmatory) == len(claims.V2.confirmatory) and all(r.p_holm is not None for r in confirmatory)
    assert all(r.p_holm is None for r in rows if r.family == "exploratory")
    for r in rows:  # the decision p is the larger of the two tests', the interval the hull of the two intervals
        if r.t is not None and r.p_boot is not None:
            assert r.p == max(r.p_boot, r.t.p) and r.low == min(r.boot_low, r.t.low)
    for r in rows:  # every verdict agrees with its interval and its rule
        if r.verdict == "reproduced":
            assert (r.low > r.threshold) if r.side == "above" else (r.high < r.threshold)
        if r.verdict == "refuted":
            assert (r.high < r.threshold) if r.side == "above" else (r.low > r.threshold)
    text = (docs / "README.md").read_text()
    assert (
        "Cells done: 110 of 111 planned" in text
        and "Not run yet (1; the command resumes the grid): not-run-cell" in text
    )
    assert "| V-GRPO | 0.0002 | 5 |" in text and "plateaued" in text
    assert "Cells whose config is not the one this checkout's plan gives their spec: none." in text
    assert all((docs / f"geneval-vs-{a}.png").stat().st_size > 1000 for a in analysis.AXES)


def test_an_unresolved_confirmatory_row_says_how_many_seeds_would_resolve_it() -> None:
    records = synthetic.full_grid(noise=0.3)  # noisy prompts and seeds: small effects stop being resolved
    rows = {r.id: r for r in claim_rows.claim_rows(analysis.Analysis(records, n_boot=1000))}
    a3 = rows["A3"]
    assert a3.verdict.startswith("unresolved") and a3.low < a3.threshold < a3.high
    assert a3.extra["power_goal"] == "reproduce" and a3.extra["seeds_power"] is not None
    assert a3.extra["seeds_power_holm"] > a3.extra["seeds_power"]  # Bonferroni's level needs more


def test_an_independent_recomputation_reproduces_an_interval(synthetic_report) -> None:
    """V-GRPO minus naive ELBO-GRPO at the final point, recomputed with plain loops and another random stream:
    prompts drawn within tags (shared), each method's seeds drawn with replacement."""
    _, rows, records = synthetic_report
    n1 = {r.id: r for r in rows}["N1"]
    base = records["base-geneval-test"]["curve"][0]
    tags = np.asarray(base["tags"])
    finals = {
        m: np.asarray(
            [
                r["curve"][-1]["per_prompt"]
                for r in records.values()
                if r["spec"]["phase"] == "methods" and r["spec"]["method"] == m
            ]
        )
        for m in ("vgrpo", "naive_elbo")
    }
    rng = np.random.default_rng(12345)
    kinds = sorted(set(tags))
    diffs = []
    for _ in range(3000):
        idx = {k: rng.choice(np.flatnonzero(tags == k), size=int((tags == k).sum())) for k in kinds}
        score = {}
        for m, x in finals.items():
            seeds = x[rng.integers(0, x.shape[0], x.shape[0])]
            score[m] = np.mean([seeds[:, idx[k]].mean() for k in kinds])
        diffs.append(score["vgrpo"] - score["naive_elbo"])
    low, high = np.quantile(diffs, [0.025, 0.975])
    assert low == pytest.approx(n1.low, abs=0.004) and high == pytest.approx(n1.high, abs=0.004)


def test_bootstrap_weights_reproduce_the_stratified_mean_and_resample_within_tags() -> None:
    tags = ["a", "a", "a", "b"]
    x = np.array([0.0, 1.0, 1.0, 0.0])
    assert bootstrap.point_weights(tags) @ x == pytest.approx((2 / 3 + 0.0) / 2)
    w = bootstrap.prompt_weights(tags, 500, np.random.default_rng(0))
    assert w.sum(axis=1) == pytest.approx(np.ones(500))
    assert w[:, 3] == pytest.approx(np.full(500, 0.5))  # the only "b" prompt always carries that tag's half
    assert (w @ x).mean() == pytest.approx(1 / 3, abs=0.02)


def test_first_crossing_interpolates_and_reports_never_as_inf() -> None:
    xs = np.array([0.0, 10.0, 20.0])
    ys = np.array([[0.5, 0.6, 0.8], [0.5, 0.55, 0.58], [0.7, 0.7, 0.7]])
    assert bootstrap.first_crossing(xs, ys, 0.65) == pytest.approx([12.5, np.inf, 0.0])
    assert bootstrap.first_crossing(xs, ys, np.array([0.6, 0.55, 0.71])) == pytest.approx([10.0, 10.0, np.inf])
    low, high = bootstrap.interval(np.array([1.0] * 90 + [np.inf] * 10))
    assert low == 1.0 and high == np.inf


def test_each_cell_becomes_one_mlflow_run_under_one_parent(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tasks.tracking import tracking_uri

    full = synthetic.full_grid()
    names = [
        "base-geneval-test",
        "methods-geneval-vgrpo-default-lr0.0002-s0",
        "methods-geneval-naive_elbo-default-lr0.0002-s0",
    ]
    records = {n: full[n] for n in names}
    uri = tracking_uri(tmp_path / "mlflow")
    row = verdicts.Row("E1", "faster", "2x", "rule", estimate=0.1, low=0.02, high=0.18, verdict="reproduced")
    mlflow_runs.track(records, uri, grid="full", claims=[row])
    mlflow_runs.track(records, uri, grid="full")  # idempotent: a resumed grid adds only new cells
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vgrpo-benchmarks")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("bench.role") == "parent"]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("bench.role") == "cell"}
    assert len(parent) == 1 and len(children) == 3
    assert all(r.data.tags["mlflow.parentRunId"] == parent[0].info.run_id for r in children.values())
    assert parent[0].data.tags["claim_E1"] == "faster: reproduced"
    assert parent[0].data.metrics["claim_E1_low"] == pytest.approx(0.02)
    v = children[names[1]]
    assert v.data.params["method"] == "vgrpo" and v.data.params["lr"] == "0.0002"
    history = client.get_metric_history(v.info.run_id, "heldout/score")
    assert [(m.step, m.value) for m in history] == [(p["iteration"], p["score"]) for p in full[names[1]]["curve"]]


def _without_progress(text: str) -> list[str]:
    """The report's lines less those on how much of the planned grid ran and the machine time (a grid still
    running adds to both between the report's commit and this test)."""
    return [line for line in text.splitlines() if not line.startswith(("Cells done:", "Not run yet"))]


def _rebuild_committed_report(committed: Path, tmp_path: Path, **kwargs: Any) -> str:
    """Build the report from ``committed``'s records into ``tmp_path``, check that it says what the committed one
    says and that every cell's config is its plan's; return it."""
    (tmp_path / "grid.json").write_text((committed / "grid.json").read_text())
    report.write_report(committed / "cells.jsonl", tmp_path, code_now=provenance.code_hash(), **kwargs)
    rebuilt, text = (tmp_path / "README.md").read_text(), (committed / "README.md").read_text()
    assert _without_progress(rebuilt) == _without_progress(text)
    assert "Cells whose config is not the one this checkout's plan gives their spec: none." in rebuilt
    return rebuilt


@pytest.mark.parametrize("folder", ["benchmarks", "benchmarks-quick"])
def test_the_committed_records_rebuild_the_committed_report(folder: str, tmp_path: Path) -> None:
    committed = ROOT / "docs" / folder
    quick = folder.endswith("-quick")
    records = report.load_records(committed / "cells.jsonl")
    sizes = plan.QUICK if quick else plan.Sizes()
    _rebuild_committed_report(
        committed,
        tmp_path,
        command="python -m benchmarks.compare" + " --quick" * quick,
        planned=[s.name for s in plan.full_plan(records, sizes, quick)],
        quick=quick,
        sizes=sizes,
    )


@pytest.mark.slow
def test_the_committed_v3_records_rebuild_the_committed_v3_report(tmp_path: Path) -> None:
    tuned = plan_v3.load_tuned()
    rebuilt = _rebuild_committed_report(
        registered.V3_DOCS,
        tmp_path,
        command="python -m benchmarks.compare --grid v3",
        planned=[s.name for s in plan_v3.full_plan(tuned, plan_v3.V3)],
        sizes=plan_v3.V3,
        tuned=tuned,
        grid=registered.GRIDS["v3"],
    )
    assert "Not run yet" not in rebuilt
