"""benchmarks.compare.exchange_check: a replicate group takes its methods group's place and nothing else moves;
an identical replicate group leaves every row as it was, and one that scores lower moves the rows that read it."""

from __future__ import annotations

import copy
from dataclasses import replace

from benchmarks.compare import exchange_check, plan_v4
from benchmarks.compare.analysis import Analysis
from benchmarks.compare.claim_rows import claim_rows
from benchmarks.compare.claim_sets import V4
from tests.benchmarks.compare.synthetic import v4_grid
from tests.benchmarks.compare.test_plan_v4 import TUNED

SMALL = replace(
    plan_v4.DESIGN,
    sizes=replace(plan_v4.SIZES, seeds=4, ablation_seeds=3, preference_seeds=2, stability_seeds=2),
    preference_stress_seeds=3,
    own_rate_seeds=3,
    replicate_seeds=4,
)
RECORDS = v4_grid(TUNED, SMALL)


def _phase_method(records: dict, phase: str, method: str) -> dict:
    return {k: r for k, r in records.items() if (r["spec"]["phase"], r["spec"]["method"]) == (phase, method)}


def test_the_replicate_group_takes_the_methods_groups_place() -> None:
    out = exchange_check.exchanged(RECORDS, "vgrpo")
    assert not _phase_method(out, "replicate", "vgrpo")
    methods = _phase_method(out, "methods", "vgrpo")
    assert sorted(r["spec"]["seed"] for r in methods.values()) == list(range(1800, 1804))
    assert all(k == r["name"] and k.startswith("methods-geneval-vgrpo-default-") for k, r in methods.items())
    untouched = {
        k
        for k, r in RECORDS.items()
        if r["spec"]["method"] != "vgrpo" or r["spec"]["phase"] not in ("methods", "replicate")
    }
    assert {k: out[k] for k in untouched} == {k: RECORDS[k] for k in untouched}
    assert exchange_check.replicated_methods(RECORDS) == ["vgrpo"]
    assert exchange_check.exchanged(RECORDS, "mixgrpo") == RECORDS


def test_an_identical_group_moves_nothing_and_a_lower_one_moves_the_rows_that_read_it() -> None:
    same = copy.deepcopy(RECORDS)
    methods = _phase_method(same, "methods", "vgrpo")
    for r in _phase_method(same, "replicate", "vgrpo").values():
        twin = methods[
            r["name"]
            .replace("replicate-", "methods-")
            .replace(f"-s{r['spec']['seed']}", f"-s{r['spec']['seed'] - 100}")
        ]
        r["curve"] = copy.deepcopy(twin["curve"])
    rows = claim_rows(Analysis(same), claims=V4)
    lines = exchange_check.exchange_lines(same, rows, V4)
    body = [line for line in lines if line.startswith("| ") and not line.startswith("| id")]
    assert len(body) == len(rows) and all(line.endswith("| yes |") for line in body)

    lower = copy.deepcopy(RECORDS)
    for r in _phase_method(lower, "replicate", "vgrpo").values():
        for point in r["curve"]:
            point["score"] -= 0.25
            point["per_prompt"] = [x - 0.25 for x in point["per_prompt"]]
    rows = claim_rows(Analysis(lower), claims=V4)
    moved = {
        line.split(" | ")[0][2:] for line in exchange_check.exchange_lines(lower, rows, V4) if line.endswith("**no** |")
    }
    assert {"E1", "E2", "N1"} <= moved  # V-GRPO 0.25 lower loses its lead over MixGRPO, Flow-GRPO and naive
    assert not moved & {"S1", "S2", "C1", "C2"}  # rows that read no methods cell of V-GRPO
