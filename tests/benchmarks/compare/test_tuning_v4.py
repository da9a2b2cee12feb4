"""benchmarks.compare.tuning_v4: the pre-registered plan (docs/benchmarks-v4/tuning-preregistration.md), every
candidate a valid stage config carrying its overrides, v3's rule at the new horizon on synthetic records, the
refusal to run on another CPU model or thread count, and the report's cost columns."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks.compare import tuning_runs, tuning_v4
from benchmarks.compare.analysis import load_records
from benchmarks.compare.plan import Sizes, stage_config
from benchmarks.compare.rungs import BASE
from benchmarks.provenance import cpu_model
from tests.benchmarks.compare.tuning_records import sweep_records
from vgrpo.algorithms.config import MixGRPOConfig
from vgrpo.samplers import mixgrpo_window_start

V4 = tuning_v4.V4

# (method, recipe) -> config fields its stage config must carry, in the pre-registration's order.
EXPECTED: dict[tuple[str, str], dict[str, Any]] = {
    ("vgrpo", "v3"): {
        "algorithm.n_mc": 4,
        "optim.gradient_steps": 2,
        "optim.minibatches": 2,
        "advantage.soft_clip_eta": 3.0,
        "algorithm.clip_range": None,
        "algorithm.kl_coef": 0.0,
    },
    ("vgrpo", "nmc10"): {"algorithm.n_mc": 10, "algorithm.timestep_sampling": "stratified"},
    ("vgrpo", "one-step"): {"optim.gradient_steps": 1, "optim.minibatches": 1},
    ("vgrpo", "four-step-clip"): {
        "optim.gradient_steps": 4,
        "optim.minibatches": 4,
        "algorithm.clip_range": 0.01,
        "advantage.soft_clip_eta": 2.0,
    },
    ("vgrpo", "kl-behaviour"): {"algorithm.kl_coef": 0.3, "algorithm.ref_kl_coef": 0.0},
    ("vgrpo", "eta1"): {"advantage.soft_clip_eta": 1.0},
    ("vgrpo", "group16"): {"rollout.group_size": 16, "rollout.prompts_per_iteration": 4},
    ("flow_grpo", "official-nocfg"): {
        "algorithm.kl_coef": 0.0,
        "algorithm.noise_level": 0.8,
        "algorithm.clip_range": 8e-5,
        "algorithm.timestep_fraction": 0.3,
        "algorithm.timestep_order": "shuffled",
        "advantage.std_scope": "global",
    },
    ("mixgrpo", "official-clip8e-4"): {
        "algorithm.window_size": 2,
        "algorithm.shift_interval": 32,
        "algorithm.clip_range": 8e-4,
        "rollout.group_noise": "shared",
    },
    ("mixgrpo", "official-window"): {
        "algorithm.window_size": 2,
        "algorithm.shift_interval": 80,
        "algorithm.clip_range": 1e-4,
        "rollout.group_noise": "shared",
    },
    ("naive_elbo", "v2"): {"algorithm.n_mc": 4, "optim.gradient_steps": 2},
    ("flow_grpo", "official-clip8e-4"): {
        "algorithm.kl_coef": 0.004,
        "algorithm.timestep_order": "first",
        "algorithm.clip_range": 8e-4,
    },
    ("mixgrpo", "official"): {
        "algorithm.window_size": 2,
        "algorithm.shift_interval": 32,
        "algorithm.clip_range": 1e-4,
        "rollout.group_noise": "shared",
    },
    ("diffusion_nft", "official"): {
        "algorithm.n_mc": 9,
        "algorithm.timestep_sampling": "stratified",
        "algorithm.ema_decay_rate": 0.002,
        "advantage.std_scope": "global",
    },
}


def _field(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config


def test_the_plan_is_the_preregistered_one() -> None:
    planned = V4.plan({})
    assert planned[0] == BASE and len(planned) == 1 + 84 and len({s.name for s in planned}) == 85
    first = planned[1:]
    assert Counter(s.method for s in first) == {
        "vgrpo": 7 * 3 * 2,
        "naive_elbo": 1 * 3 * 2,
        "flow_grpo": 2 * 3 * 2,
        "mixgrpo": 3 * 3 * 2,
        "diffusion_nft": 1 * 3 * 2,
    }
    assert list(dict.fromkeys((s.method, s.variant) for s in first)) == list(EXPECTED)  # V-GRPO first, v3's last
    assert {(s.seed, s.iterations, s.eval_every, s.split) for s in first} == {
        (1600, 160, 20, "val"),
        (1601, 160, 20, "val"),
    }
    assert {s.lr for s in first if s.method == "vgrpo"} == {2e-4, 4e-4, 8e-4}
    assert {s.lr for s in first if s.method == "naive_elbo"} == {1e-4, 2e-4, 4e-4}
    assert {s.lr for s in first if s.method == "flow_grpo"} == {8e-4, 1.6e-3, 3.2e-3}
    assert {s.lr for s in first if s.method in ("mixgrpo", "diffusion_nft")} == {4e-4, 8e-4, 1.6e-3}
    assert (V4.rate_bounds, V4.drop_margin, V4.collapse_margin) == ((1e-4, 1.28e-2), 0.08, 0.10)


def test_every_first_cell_builds_its_config_with_its_overrides(tmp_path: Path) -> None:
    prompts = tmp_path / "val.jsonl"
    prompts.write_text("")
    for spec in V4.plan({})[1:]:
        config = stage_config(spec, Sizes(), prompts)
        assert (config.iterations, config.eval_every, config.seed) == (160, 20, spec.seed)
        assert config.algorithm.name == spec.method and config.optim.lr == spec.lr
        want = {"rollout.prompts_per_iteration": 8, "rollout.group_size": 8, "rollout.num_steps": 10, "lora.rank": 32}
        want |= EXPECTED[(spec.method, spec.variant)]
        assert {k: _field(config, k) for k in want} == pytest.approx(want), spec.name

    def window_starts(recipe: str) -> set[int]:
        algorithm = stage_config(V4.spec("mixgrpo", recipe, 8e-4, 0), Sizes(), prompts).algorithm
        assert isinstance(algorithm, MixGRPOConfig)
        return {
            mixgrpo_window_start(i, num_steps=10, window_size=2, shift_interval=algorithm.shift_interval)
            for i in range(160)
        }

    assert window_starts("official") == {0, 1, 2, 3, 4}  # once over the first 60% of the steps, as v3's over 80
    assert window_starts("official-window") == {0, 1}  # steps 0-2: sigma 1 to 0.7


def test_the_rule_at_the_new_horizon() -> None:
    late_drop = [0.50, 0.55, 0.60, 0.66, 0.66, 0.66, 0.62, 0.55]  # 0.11 below its best at the end
    flat = [0.50, 0.52, 0.53, 0.53, 0.53, 0.53, 0.53, 0.53]
    rising = [0.40 + 0.03 * i for i in range(8)]
    records = sweep_records(
        V4,
        {
            ("vgrpo", "nmc10", 2e-4): [flat, flat],
            ("vgrpo", "nmc10", 4e-4): [[s + 0.02 for s in flat]] * 2,
            ("vgrpo", "nmc10", 8e-4): [late_drop, [0.5, 0.6, 0.65, 0.68, 0.68, 0.68, 0.68, 0.68]],
            ("vgrpo", "eta1", 2e-4): [flat, flat],
            ("vgrpo", "eta1", 4e-4): [flat, flat],
            ("vgrpo", "eta1", 8e-4): [rising, rising],
            ("naive_elbo", "v2", 1e-4): [rising, rising],
            ("naive_elbo", "v2", 2e-4): [flat, flat],
            ("naive_elbo", "v2", 4e-4): [flat, [0.5, 0.25, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]],  # 0.15 below the base
        },
    )
    rungs = {(r.recipe, r.lr): r for r in V4.rungs(records)}
    assert not V4.stable(rungs[("nmc10", 8e-4)]) and rungs[("nmc10", 8e-4)].worst_drop == pytest.approx(0.11)
    assert not V4.stable(rungs[("v2", 4e-4)])
    # the last quarter reads the point at iteration 120 (the sixth of eight)
    assert rungs[("eta1", 8e-4)].last_quarter == pytest.approx(rising[7] - rising[5])
    chosen = V4.choose(records)
    assert chosen["vgrpo"] is not None and (chosen["vgrpo"].recipe, chosen["vgrpo"].lr) == ("eta1", 8e-4)
    assert chosen["naive_elbo"] is not None and chosen["naive_elbo"].lr == 1e-4
    # eta1's best is its top rate: 1.6e-3 is added; naive's is its bottom rate, 1e-4, the bound: nothing below it
    extra = V4.extensions(V4.rungs(records))
    assert {(s.method, s.variant, s.lr, s.seed) for s in extra} == {("vgrpo", "eta1", 1.6e-3, 1600 + i) for i in (0, 1)}
    assert all(s.iterations == 160 for s in extra)


def _machine(records: dict[str, Any], cpu: str, threads: int) -> None:
    for record in records.values():
        record["machine"], record["threads"] = {"cpu": cpu, "under_load": False}, threads


def _every_method_ran(cpu: str, threads: int) -> dict[str, Any]:
    """The base and one finished rung of every method, on ``cpu`` at ``threads``."""
    records = sweep_records(V4, {(m, next(iter(V4.recipes[m])), V4.rates[m][1]): [[0.5], [0.5]] for m in V4.recipes})
    _machine(records, cpu, threads)
    return records


def _write(records: dict[str, Any], out: Path, docs: Path, where: str) -> None:
    target = out if where == "folder" else docs / "tuning"
    target.mkdir(parents=True)
    for name, record in records.items():
        if where == "folder":
            (out / f"{name}.json").write_text(json.dumps(record))
        else:
            with open(target / "cells.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")


@pytest.mark.parametrize("where", ["folder", "committed"])
@pytest.mark.parametrize(("cpu", "threads"), [("Other CPU (25/17)", 2), (None, 1)])
def test_a_machine_that_may_run_no_cell_left_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
    cpu: str | None,
    threads: int,
) -> None:
    out, docs = tmp_path / "out", tmp_path / "docs"
    _write(_every_method_ran(cpu or cpu_model(), threads), out, docs, where)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    def started(*_: Any, **__: Any) -> int:
        raise AssertionError("the sweep started")

    monkeypatch.setattr(tuning_runs, "run", started)
    argv = ["--out", str(out), "--docs", str(docs), "--threads", "2"]
    assert tuning_v4.main(argv) == 2
    err = capsys.readouterr().err
    assert f"vgrpo: {cpu or cpu_model()} at {threads} threads" in err and f"{cpu_model()} at --threads 2" in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written
    # the report alone runs no cell: it is not refused
    monkeypatch.setattr(tuning_runs, "run", lambda *_, **__: 0)
    assert tuning_v4.main([*argv, "--report-only"]) == 0


def test_each_method_runs_on_the_machine_of_its_first_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """V-GRPO's cells ran on another machine: this one runs the baselines' cells and none of V-GRPO's."""
    records = sweep_records(V4, {("vgrpo", "v3", 4e-4): [[0.5]]})
    _machine(records, "Other CPU (6/167)", 2)
    out, docs = tmp_path / "out", tmp_path / "docs"
    _write(records, out, docs, "committed")
    args = tuning_runs.parser("p", "", out, docs).parse_args(["--threads", "2"])
    assert tuning_v4.other_machine(args) is None
    runnable = tuning_v4.runnable_here(records, 2)
    left = [s for s in V4.plan(records) if s.name not in records]
    assert {s.method for s in left if runnable(s)} == set(V4.recipes) - {"vgrpo"}
    assert {s.method for s in left if not runnable(s)} == {"vgrpo"}
    assert not any(tuning_v4.runnable_here(records, 1)(s) for s in left if s.method == "vgrpo")
    # a method's first record decides, by start time, and a method with none runs anywhere
    here = {"cpu": cpu_model(), "under_load": False, "started_at": "2026-12-07T12:00:00+0000"}
    mix = sweep_records(V4, {("mixgrpo", "official", 8e-4): [[0.5], [0.5]]})
    later = {k: {**r, "machine": here, "threads": 2} for k, r in mix.items() if r["spec"]["method"] == "mixgrpo"}
    both = {**records, **later}
    assert tuning_v4.method_machines(both) == {
        "base": ("Other CPU (6/167)", 2),
        "vgrpo": ("Other CPU (6/167)", 2),
        "mixgrpo": (cpu_model(), 2),
    }
    assert "V-GRPO: Other CPU (6/167) at 2 threads; MixGRPO: " in tuning_v4.machine_line(both)
    # the runner leaves V-GRPO's cells for their machine and names them
    seen: dict[str, Any] = {}

    def run(sweep: Any, run_args: Any, report: Any, runnable: Any = None) -> int:
        seen["runnable"] = runnable(records)
        return 0

    monkeypatch.setattr(tuning_runs, "run", run)
    assert tuning_v4.main(["--out", str(out), "--docs", str(docs), "--threads", "2"]) == 0
    assert [s.method for s in left if seen["runnable"](s)] == [s.method for s in left if runnable(s)]


def test_the_runner_runs_only_the_cells_this_machine_may_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records = _every_method_ran("Other CPU (6/167)", 2)
    out, docs = tmp_path / "out", tmp_path / "docs"
    _write(records, out, docs, "folder")
    ran: list[list[str]] = []
    monkeypatch.setattr(tuning_runs.cell_runs, "run_phase", lambda todo, *_: ran.append([s.method for s in todo]))
    monkeypatch.setattr(tuning_runs, "eval_prompt_file", lambda *_: None)
    args = tuning_runs.parser("p", "", out, docs).parse_args(["--threads", "2"])
    runnable = {"mixgrpo"}
    code = tuning_runs.run(V4, args, lambda *_: "report", runnable=lambda _: lambda s: s.method in runnable)
    assert code == 1 and ran  # its cells did not finish (run_phase is a stand-in), each tried once, one at a time
    assert all(batch == ["mixgrpo"] for batch in ran)
    left = [s for s in V4.plan(records) if s.method == "mixgrpo" and s.name not in records]
    assert len(ran) == len(left)
    assert "did not finish" in capsys.readouterr().err
    runnable.clear()
    assert tuning_runs.run(V4, args, lambda *_: "report", runnable=lambda _: lambda s: s.method in runnable) == 0
    assert "cells left for another machine" in capsys.readouterr().err
    assert (docs / "tuning.md").read_text() == "report"


def test_the_report_gives_each_rungs_cost_without_loaded_seconds() -> None:
    curve = [0.5 + 0.01 * i for i in range(8)]
    rungs = {("vgrpo", recipe, lr): [curve, curve] for recipe in ("v3", "nmc10") for lr in V4.rates["vgrpo"]}
    records = sweep_records(V4, rungs)
    _machine(records, "Test CPU (6/167)", 2)
    for record in records.values():
        if record["spec"]["phase"] != "tune":
            continue
        nmc10 = record["spec"]["variant"] == "nmc10"
        record["curve"][-1]["nfe"] = 160 * (3940.0 if nmc10 else 1960.0)
        record["time_split_s"] = {"iteration": 6.0 if nmc10 else 3.0}
        if nmc10 and record["spec"]["seed"] == 1601:  # its seconds are left out, its score counts
            record["time_split_s"]["iteration"] = 60.0
            record["machine"]["under_load"] = True
    text = tuning_v4.report(records, V4.plan(records), tuning_v4.COMMAND)
    assert "| lowest point - base | stable | NFE / iteration | s / iteration |" in text
    assert "| V-GRPO | v3 | 0.0004 | 0.570, 0.570 | 0.570 |" in text
    row = next(line for line in text.splitlines() if line.startswith("| V-GRPO | nmc10 | 0.0004 |"))
    assert row.endswith("| yes | 3940 | 6.00 (1 of 2 seeds) |")
    row = next(line for line in text.splitlines() if line.startswith("| V-GRPO | v3 | 0.0004 |"))
    assert row.endswith("| yes | 1960 | 3.00 |")
    assert (
        "Machines: the base: Test CPU (6/167) at 2 threads; V-GRPO: Test CPU (6/167) at 2 threads." in text
        and "(3 of the 12 cells ran under load" in text
    )
    assert "Deviations from the pre-registration: from 2026-12-07 each method's cells run on the CPU model" in text
    assert text.startswith("# Benchmark v4: the tuning sweep (validation prompts)")
    assert "2 seeds (1600-1601), 160 iterations (benchmark v4's horizon), validation GenEval strict every 20" in text


def test_a_superseded_record_runs_again_and_pins_no_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deviation 2: V-GRPO's one record on another machine is superseded; its cell runs again here, and the
    method's machine is fixed by its next record. A record of the same name from another run stays."""
    records = sweep_records(V4, {("vgrpo", "v3", 2e-4): [[0.5]]})
    _machine(records, "Other CPU (6/167)", 2)
    name = next(n for n, r in records.items() if r["spec"]["method"] == "vgrpo")
    records[name]["machine"]["started_at"] = "2026-12-06T18:43:35+0000"
    out, docs = tmp_path / "out", tmp_path / "docs"
    _write(records, out, docs, "folder")
    (docs / "tuning").mkdir(parents=True)
    (docs / "tuning" / "superseded.jsonl").write_text(json.dumps(records[name]) + "\n")
    seen: dict[str, Any] = {}

    def run(sweep: Any, run_args: Any, report: Any, runnable: Any = None) -> int:
        seen["records"] = load_records(run_args.out)
        return 0

    monkeypatch.setattr(tuning_runs, "run", run)
    argv = ["--out", str(out), "--docs", str(docs), "--threads", "2"]
    assert tuning_v4.main([*argv, "--report-only"]) == 0  # the report reads no superseded record either
    assert name not in seen["records"] and (out / "stale" / f"{name}.superseded.json").is_file()
    assert tuning_v4.method_machines(seen["records"]) == {"base": ("Other CPU (6/167)", 2)}
    assert tuning_v4.runnable_here(seen["records"], 2)(next(s for s in V4.plan(seen["records"]) if s.name == name))
    # the cell's new record (another start) is not superseded
    rerun = {**records[name], "machine": {"cpu": cpu_model(), "started_at": "2026-12-07T15:40:00+0000"}}
    (out / f"{name}.json").write_text(json.dumps(rerun))
    assert tuning_v4.main(argv) == 0 and name in seen["records"]
    assert tuning_v4.method_machines(seen["records"])["vgrpo"] == (cpu_model(), 2)


def test_an_edge_extension_runs_next_to_its_recipes_rungs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """V-GRPO's v3 recipe is best at its lowest rate: its next rate down runs before the next recipe's cells, not
    after every recipe's first rungs (the cells are planned again after each)."""
    lows = {("vgrpo", "v3", lr): [[0.5, 0.6 - 1000 * (lr - 2e-4)]] * 2 for lr in V4.rates["vgrpo"]}
    records = sweep_records(V4, lows)
    _machine(records, cpu_model(), 2)
    out, docs = tmp_path / "out", tmp_path / "docs"
    _write(records, out, docs, "folder")
    ran: list[str] = []

    def run_phase(todo: list[Any], *_: Any) -> None:
        for spec in todo:
            ran.append(spec.name)
            score = 0.55 if spec.variant == "v3" else 0.6 - 1000 * abs(spec.lr - 4e-4)  # interior: no extension
            (out / f"{spec.name}.json").write_text(json.dumps(_cell(spec, score)))

    monkeypatch.setattr(tuning_runs.cell_runs, "run_phase", run_phase)
    monkeypatch.setattr(tuning_runs, "eval_prompt_file", lambda *_: None)
    args = tuning_runs.parser("p", "", out, docs).parse_args(["--threads", "2"])
    here = {"v3", "nmc10"}
    assert tuning_runs.run(V4, args, lambda *_: "report", runnable=lambda _: lambda s: s.variant in here) == 0
    assert ran[:2] == ["tune-geneval-vgrpo-v3-lr0.0001-s1600", "tune-geneval-vgrpo-v3-lr0.0001-s1601"]
    assert all("nmc10" in name for name in ran[2:]) and len(ran) == 2 + 2 * len(V4.rates["vgrpo"])


def _cell(spec: Any, score: float) -> dict[str, Any]:
    from tests.benchmarks.compare.tuning_records import record

    return record(spec, [0.5, score], every=float(V4.eval_every))
