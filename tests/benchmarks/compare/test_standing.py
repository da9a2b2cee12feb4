"""The standing section: each pair the papers order, this grid's paired difference and whether it orders the pair
the same way, read off synthetic records of v3's plan whose effects are known."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.compare import plan_v3, standing
from benchmarks.compare.analysis import Analysis
from tests.benchmarks.compare import synthetic
from tests.benchmarks.compare.test_claims_v3 import TUNED


@pytest.fixture(scope="module")
def analysis() -> Analysis:
    records = synthetic.v3_grid(TUNED)
    return Analysis({n: r for n, r in records.items() if r["spec"]["phase"] in ("base", "methods")})


def test_the_order_word_follows_the_interval_and_the_papers_sign() -> None:
    assert standing.order_here(+0.04, 0.01, 0.05) == "as the papers"
    assert standing.order_here(-0.04, -0.05, -0.01) == "as the papers"
    assert standing.order_here(+0.04, -0.12, -0.08) == "reversed"
    assert standing.order_here(-0.04, 0.01, 0.05) == "reversed"
    assert standing.order_here(+0.04, -0.01, 0.02).startswith("unresolved")


def _final_mean(analysis: Analysis, method: str) -> float:
    return statistics.mean(r["curve"][-1]["score"] for r in analysis.groups[method].runs)


def test_each_pair_reads_the_paired_final_difference_and_orders_it(analysis: Analysis) -> None:
    lines = standing.standing_lines(analysis, "synthetic")
    assert lines[0] == "## Standing against the papers"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[6:] if line.startswith("| ")}
    assert len(rows) == len(standing.PAPER_PAIRS)
    # Synthetic gains over the base at 80 iterations: V-GRPO 0.199, Flow-GRPO 0.087, MixGRPO 0.069: the papers put
    # Flow-GRPO above V-GRPO (+0.04) and V-GRPO above MixGRPO; the records order the first pair the other way.
    flow = rows["Flow-GRPO minus V-GRPO"]
    by_hand = _final_mean(analysis, "flow_grpo") - _final_mean(analysis, "vgrpo")
    assert by_hand == pytest.approx(-0.112, abs=0.01)
    assert (
        f"| {by_hand:+.3f} [" in flow
        and flow.endswith("| reversed |")
        and "+0.040 (SD3.5-M GenEval 0.95 vs 0.91)" in flow
    )
    mix = rows["V-GRPO minus MixGRPO"]
    by_hand = _final_mean(analysis, "vgrpo") - _final_mean(analysis, "mixgrpo")
    assert f"| {by_hand:+.3f} [" in mix and mix.endswith("| as the papers |")
    # No naive cell of the synthetic methods phase falls below the base.
    assert any(line.startswith("The V-GRPO paper finds naive ELBO-GRPO severely unstable") for line in lines)
    assert "at its own rate, 0 of its 10 cells collapsed" in "\n".join(lines)


def test_no_pair_without_both_methods() -> None:
    records = synthetic.v3_grid(TUNED)
    only = {n: r for n, r in records.items() if r["spec"]["phase"] == "base" or r["spec"]["method"] == "vgrpo"}
    only = {n: r for n, r in only.items() if r["spec"]["phase"] in ("base", "methods")}
    assert standing.standing_lines(Analysis(only), "synthetic") == []
    assert plan_v3.V3.seeds == 10  # the count the naive line reads above


def test_the_interval_holds_both_the_percentile_and_the_t_interval(analysis: Analysis) -> None:
    from benchmarks.compare.analysis import final
    from benchmarks.compare.bootstrap import interval
    from benchmarks.compare.studentized import t_test

    pair = standing.PAPER_PAIRS[0]
    groups = [(pair.first, analysis.groups[pair.first]), (pair.second, analysis.groups[pair.second])]

    def fn(a, b):
        return final(a) - final(b)

    est, low, high = standing._difference(analysis, pair)
    p_low, p_high = interval(analysis.statistic(groups, fn)[1])
    assert analysis.base is not None
    tt = t_test(analysis.design(groups, fn), analysis.weights("geneval")[0], analysis.base["curve"][0]["tags"], 0.0)
    assert tt is not None and tt.estimate == pytest.approx(est)
    assert (low, high) == (min(p_low, tt.low), max(p_high, tt.high))
