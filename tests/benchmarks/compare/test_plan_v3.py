"""benchmarks.compare.plan_v3: the pre-registration draft's seed counts and fresh seeds, each method at the tuning
sweep's choice, every cell a valid stage config, and no choice before the sweep has settled."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from benchmarks.common import METHODS
from benchmarks.compare import plan_v3, tuning
from benchmarks.compare.plan import Sizes, stage_config
from tests.benchmarks.compare.test_tuning import _records

TUNED = {
    "vgrpo": plan_v3.Tuned("v2", 4e-4, {}),
    "naive_elbo": plan_v3.Tuned("v2", 8e-4, {}),
    "flow_grpo": plan_v3.Tuned("official", 1.6e-3, tuning.RECIPES["flow_grpo"]["official"]),
    "mixgrpo": plan_v3.Tuned("official", 8e-4, tuning.RECIPES["mixgrpo"]["official"]),
    "diffusion_nft": plan_v3.Tuned("v2", 1.6e-3, {}),
}


def test_the_cell_counts_are_the_preregistered_ones() -> None:
    cells = plan_v3.full_plan(TUNED)
    by_phase = Counter(s.phase for s in cells)
    assert by_phase == {"base": 2, "methods": 50, "stability": 72, "own_rate": 36, "ablation": 28, "preference": 10}
    assert sum(n for p, n in by_phase.items() if p != "base") == 196
    assert len({s.name for s in cells}) == len(cells)
    stress = Counter((s.reward, s.variant) for s in cells if s.phase == "stability")
    assert stress == {("geneval", "x2"): 6, ("geneval", "x4"): 6, ("preference", "x2"): 30, ("preference", "x4"): 30}


def test_every_seed_is_fresh() -> None:
    v2_seeds = set(range(5)) | {100, 101, 102, 200, 201}
    tuning_seeds = set(range(tuning.TUNING_SEED0, tuning.TUNING_SEED0 + 100))
    seeds = {s.seed for s in plan_v3.full_plan(TUNED) if s.phase != "base"}
    assert not seeds & (v2_seeds | tuning_seeds)
    for phase, base in plan_v3.SEED0.items():
        assert all(base <= s.seed < base + 100 for s in plan_v3.plan_phase(phase, TUNED))


def test_each_method_trains_its_chosen_recipe_and_rate(tmp_path: Path) -> None:
    prompts = tmp_path / "test.jsonl"
    prompts.write_text("")
    for spec in plan_v3.full_plan(TUNED):
        if spec.phase == "base":
            continue
        config = stage_config(spec, Sizes(), prompts)
        assert config.algorithm.name == spec.method
        if spec.phase == "methods":
            assert spec.lr == TUNED[spec.method].lr and spec.variant == "default"
    mix = next(s for s in plan_v3.plan_phase("methods", TUNED) if s.method == "mixgrpo")
    config = stage_config(mix, Sizes(), prompts)
    assert (config.algorithm.window_size, config.rollout.group_noise) == (2, "shared")
    x4 = {s.method: s.lr for s in plan_v3.plan_phase("stability", TUNED) if (s.reward, s.variant) == ("geneval", "x4")}
    assert x4 == {"vgrpo": 4 * 4e-4, "naive_elbo": 4 * 8e-4}


def test_no_choice_until_the_sweep_settles() -> None:
    partial = _records({("vgrpo", "v2", lr): [[0.5, 0.55], [0.5, 0.55]] for lr in (4e-4, 8e-4)})
    with pytest.raises(RuntimeError, match="has not settled"):
        plan_v3.tuned_settings(partial)
    settled: dict[tuple[str, str, float], list[list[float]]] = {}
    for m in METHODS:
        for i, recipe in enumerate(tuning.RECIPES[m]):  # the first recipe's middle rate scores highest
            low, mid, high = tuning.RATES[m]
            settled.update({(m, recipe, low): [[0.5, 0.5]] * 2, (m, recipe, mid): [[0.5, 0.6 - 0.01 * i]] * 2})
            settled[(m, recipe, high)] = [[0.5, 0.52]] * 2
    chosen = plan_v3.tuned_settings(_records(settled))
    assert {m: (t.recipe, t.lr) for m, t in chosen.items()} == {
        m: (next(iter(tuning.RECIPES[m])), tuning.RATES[m][1]) for m in METHODS
    }
