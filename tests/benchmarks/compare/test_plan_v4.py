"""benchmarks.compare.plan_v4: v4's cells on fresh seed blocks, a replicate V-GRPO group of exactly the methods
group's config, each method's tuned recipe in every phase, no choice before the sweep settles, and the machine-time
estimate computed by hand on synthetic sweep records."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common import METHODS
from benchmarks.compare import grid, plan_v3, plan_v4, tuning_v4
from benchmarks.compare.grid import Tuned
from benchmarks.compare.plan import RunSpec, Sizes, stage_config, stage_lr
from tests.benchmarks.compare.tuning_records import sweep_records

V4 = tuning_v4.V4
TUNED = {
    "vgrpo": Tuned("nmc10", 4e-4, tuning_v4.RECIPES["vgrpo"]["nmc10"]),
    "naive_elbo": Tuned("v2", 2e-4, {}),
    "flow_grpo": Tuned("official-nocfg", 8e-4, tuning_v4.RECIPES["flow_grpo"]["official-nocfg"]),
    "mixgrpo": Tuned("official-window", 8e-4, tuning_v4.RECIPES["mixgrpo"]["official-window"]),
    "diffusion_nft": Tuned("official", 8e-4, tuning_v4.RECIPES["diffusion_nft"]["official"]),
}


def test_the_cells_by_phase_and_their_fresh_seed_blocks() -> None:
    cells = plan_v4.full_plan(TUNED)
    by_phase = Counter(s.phase for s in cells)
    assert by_phase == {
        "base": 2,
        "methods": 55,
        "replicate": 11,
        "stability": 32,
        "own_rate": 36,
        "ablation": 28,
        "preference": 10,
    }
    assert len({s.name for s in cells}) == len(cells)
    used = set(range(0, 202)) | set(range(1000, 1700))  # v2, v3, v3's sweep, v4's sweep
    for spec in cells:
        if spec.phase != "base":
            base = plan_v4.SEED0[spec.phase]
            assert base <= spec.seed < base + 100 and spec.seed not in used, spec.name


def test_the_replicate_group_is_the_methods_group_on_other_seeds() -> None:
    methods = {s.seed - plan_v4.SEED0["methods"]: s for s in plan_v4.full_plan(TUNED) if s.method == "vgrpo"}
    replicate = [s for s in plan_v4.full_plan(TUNED) if s.phase == "replicate"]
    assert {s.method for s in replicate} == {"vgrpo"} and len(replicate) == plan_v4.SIZES.seeds
    for spec in replicate:
        twin = methods[spec.seed - plan_v4.SEED0["replicate"]]
        assert (spec.lr, spec.overrides, spec.iterations, spec.eval_every, spec.variant) == (
            twin.lr,
            twin.overrides,
            twin.iterations,
            twin.eval_every,
            twin.variant,
        )


def test_every_phase_trains_the_tuned_recipe_and_the_preference_cells_at_the_stage_rate(tmp_path: Path) -> None:
    prompts = tmp_path / "test.jsonl"
    prompts.write_text("")
    for spec in plan_v4.full_plan(TUNED):
        if spec.phase == "base":
            continue
        config = stage_config(spec, Sizes(), prompts)
        assert config.iterations == spec.iterations
        if spec.method == "vgrpo" and spec.variant not in ("n_mc_2", "n_mc_8"):
            assert config.algorithm.n_mc == 10, spec.name  # the tuned recipe, in the preference cells too
        if spec.phase == "preference":
            assert spec.lr == stage_lr("preference")
    stress = grid.plan_phase("stability", TUNED, plan_v4.DESIGN)
    x4 = {s.method: s.lr for s in stress if (s.reward, s.variant) == ("geneval", "x4")}
    assert x4 == {"vgrpo": 4 * 4e-4, "naive_elbo": 4 * 2e-4}


def test_v3s_preference_cells_still_run_each_methods_preset() -> None:
    v3 = {m: Tuned("v2", 4e-4, {"algorithm": {"n_mc": 8}}) for m in METHODS}
    assert all(s.overrides == {} for s in plan_v3.full_plan(v3) if s.phase == "preference")


def test_no_grid_before_the_sweep_settles_and_the_choice_after(tmp_path: Path) -> None:
    curves = {("vgrpo", "nmc10", lr): [[0.5, 0.55], [0.5, 0.56]] for lr in V4.rates["vgrpo"]}
    path = _write(tmp_path, sweep_records(V4, curves))
    with pytest.raises(RuntimeError, match="has not settled"):
        plan_v4.load_tuned(path)
    provisional = plan_v4.load_tuned(path, provisional=True)
    assert set(provisional) == {"vgrpo"} and provisional["vgrpo"].overrides == {"algorithm": {"n_mc": 10}}
    assert provisional["vgrpo"].lr == min(V4.rates["vgrpo"])  # equal means: the smaller rate


def _timed(spec_record: dict[str, Any], iteration_s: float, prepare_s: float, update_s: float, wall_s: float) -> None:
    spec_record["time_split_s"] = {"iteration": iteration_s, "prepare": prepare_s, "update": update_s}
    spec_record["wall_s"] = wall_s
    spec_record["machine"] = {"under_load": False}
    n_mc = spec_record["spec"]["overrides"].get("algorithm", {}).get("n_mc", 4)
    spec_record["config"] = {"algorithm": {"n_mc": n_mc}}


def test_the_machine_time_estimate_by_hand() -> None:
    """Two recipes measured without load: v3 at 3 s per iteration (1.5 s of it preparation and update, N_MC 4)
    and nmc10 at 7 s; each cell's 160 iterations plus 8 evaluation points of 240 prompts took 10 s of evaluation,
    so an evaluated prompt costs 10 / (8 * 240) s."""
    records = sweep_records(V4, {("vgrpo", r, 2e-4): [[0.5] * 8] * 2 for r in ("v3", "nmc10")})
    for record in records.values():
        if record["spec"]["phase"] == "tune":
            nmc10 = record["spec"]["variant"] == "nmc10"
            it = 7.0 if nmc10 else 3.0
            _timed(record, it, 1.0 if not nmc10 else 2.5, 0.5 if not nmc10 else 2.5, 160 * it + 10.0)
    loaded = records["tune-geneval-vgrpo-v3-lr0.0002-s1601"]
    _timed(loaded, 30.0, 10.0, 10.0, 160 * 30.0 + 10.0)
    loaded["machine"]["under_load"] = True  # its seconds do not count
    seconds = plan_v4.cost_model(records)
    per_prompt = 10.0 / (8 * 240)
    sizes = plan_v4.SIZES
    test_eval = (sizes.iterations // sizes.eval_every) * sizes.test_prompts * per_prompt  # no evaluation at 0

    def spec(phase: str, variant: str = "default", overrides: dict[str, Any] | None = None) -> RunSpec:
        return RunSpec(
            phase, "vgrpo", lr=4e-4, variant=variant, overrides=overrides or {}, iterations=160, eval_every=20
        )

    assert seconds(spec("methods", overrides={"algorithm": {"n_mc": 10}})) == pytest.approx(160 * 7.0 + test_eval)
    # N_MC 2 on the nmc10 recipe: v3's measured cost with its 1.5 s N_MC part halved
    n_mc_2 = spec("ablation", "n_mc_2", {"algorithm": {"n_mc": 2}})
    assert seconds(n_mc_2) == pytest.approx(160 * (3.0 - 0.75) + test_eval)
    v_pred = spec("ablation", "v_prediction", {"algorithm": {"n_mc": 10, "prediction": "v"}})
    assert seconds(v_pred) == pytest.approx(160 * 7.0 + test_eval)
    pref = RunSpec("preference", "vgrpo", "preference", overrides={"algorithm": {"n_mc": 10}}, iterations=40)
    pref_eval = 4 * sizes.preference_prompts * per_prompt * plan_v4.PREFERENCE_EVAL_FACTOR  # every 10 of 40
    assert seconds(pref) == pytest.approx(40 * 7.0 + pref_eval)
    assert seconds(RunSpec("methods", "mixgrpo", iterations=160)) is None  # not measured


def _write(tmp_path: Path, records: dict[str, Any]) -> Path:
    path = tmp_path / "cells.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records.values()))
    return path


def test_the_power_command_sizes_v4_from_the_v4_sweeps_choices(tmp_path: Path) -> None:
    """``--tuning v4``: each method the v4 sweep has settled stands in with its chosen rung for its methods cells,
    so the rows between settled methods (D1: V-GRPO against DiffusionNFT) are sized; the others have no cells."""
    from benchmarks.compare import power

    curves: dict[tuple[str, str, float], list[list[float]]] = {}
    for lr in V4.rates["vgrpo"]:
        curves[("vgrpo", "nmc10", lr)] = [[0.5] * 7 + [0.60], [0.5] * 7 + [0.62]]
    for lr in V4.rates["diffusion_nft"]:
        curves[("diffusion_nft", "official", lr)] = [[0.5] * 7 + [0.64], [0.5] * 7 + [0.63]]
    path = _write(tmp_path, sweep_records(V4, curves))
    power.main([str(path), "--tuning", "v4", "--claims", "v4", "--out", str(tmp_path / "power.md")])
    text = (tmp_path / "power.md").read_text()
    assert f"`{path.as_posix()} --tuning v4`" in text
    ids = [line.split(" | ")[0][2:] for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert "D1" in ids and "E1" not in ids  # MixGRPO has no settled rung
