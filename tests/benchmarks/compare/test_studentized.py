"""benchmarks.compare.studentized and the claim rows' statistics (issue 47): Welch's test with the prompt interaction,
an interval that keeps its coverage at 3 seeds where the percentile bootstrap does not, the seeds for 80% power by
hand, and the committed E1 row's verdict and p unchanged across random streams."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import ttest_ind

from benchmarks.common import ROOT
from benchmarks.compare import analysis, bootstrap, claim_rows, claims, studentized, verdicts


def test_without_a_prompt_interaction_the_t_test_is_welchs() -> None:
    # Every prompt of a seed scores the same: no image noise, no prompt interaction; the per-seed values are 1, 2,
    # 4 (group a) and 0, 0.5, 0.5, 2 (group b, entered with its minus sign).
    a, b = np.array([1.0, 2.0, 4.0]), np.array([0.0, 0.5, 0.5, 2.0])
    tags = ["x", "x", "y", "y"]
    w = bootstrap.point_weights(tags)
    t = studentized.t_test([np.repeat(a[:, None], 4, 1), -np.repeat(b[:, None], 4, 1)], w, tags, 0.0)
    assert t is not None and t.interaction_var == 0.0
    welch = ttest_ind(a, b, equal_var=False)
    assert t.estimate == pytest.approx(a.mean() - b.mean()) and t.p == pytest.approx(welch.pvalue, rel=1e-9)
    # Satterthwaite by hand: v_a = (7/3)/3 = 0.7778, v_b = 0.75/4 = 0.1875; df = 0.9653^2 / (0.7778^2/2 + 0.1875^2/3)
    assert t.df == pytest.approx(0.96528**2 / (0.77778**2 / 2 + 0.1875**2 / 3), rel=1e-4)
    assert t.seed_units == pytest.approx(7 / 3 + 0.75)  # each group's unbiased variance: the variance at 1 seed
    assert studentized.t_test([np.ones((1, 4))], w, tags, 0.0) is None  # one seed: no seed variance


def test_the_prompt_interaction_is_the_stratified_variance_of_the_difference_less_the_images() -> None:
    tags = ["x"] * 4
    w = bootstrap.point_weights(tags)
    seeds = np.array([0.0, 0.1, 0.3])[:, None]
    prompts = np.array([0.0, 0.1, 0.2, 0.3])[None, :]
    # Additive seeds and prompts (no image noise): the interaction is var(0, .1, .2, .3) / 4 = 0.016667 / 4.
    t = studentized.t_test([seeds + prompts, np.zeros((3, 4))], w, tags, 0.0)
    assert t is not None and t.interaction_var == pytest.approx(0.0166667 / 4, rel=1e-4)
    # Pure image noise (seed x prompt, no prompt effect in expectation): what it puts into the per-prompt
    # difference is subtracted, so the interaction is near 0 however many prompts.
    rng = np.random.default_rng(0)
    tags = ["x"] * 400
    noise = studentized.t_test(
        [rng.normal(0, 1, (5, 400)), rng.normal(0, 1, (5, 400))], bootstrap.point_weights(tags), tags, 0.0
    )
    assert noise is not None and noise.interaction_var < 0.1 * noise.seed_var


def test_seeds_for_power_against_a_hand_computation() -> None:
    # z_0.975 + z_0.8 = 1.959964 + 0.841621 = 2.801585; (0.03 / 2.801585)^2 = 1.146662e-4; less the interaction
    # 1e-5 leaves 1.046662e-4; the seeds' part at one seed per group 5e-4 (1e-4 at 5 seeds): n = 4.7771.
    assert studentized.seeds_for_power(0.03, 5e-4, 1e-5) == pytest.approx(4.7771, abs=1e-3)
    # Without the interaction floor: 5e-4 / 1.146662e-4 = 4.3605; at Bonferroni's level over 14 rows z = 2.9137 +
    # 0.8416 = 3.7553: 5e-4 * (3.7553 / 0.03)^2 = 7.8347.
    assert studentized.seeds_for_power(0.03, 5e-4, 0.0) == pytest.approx(4.3605, abs=1e-3)
    assert studentized.seeds_for_power(0.03, 5e-4, 0.0, alpha=0.05 / 14) == pytest.approx(7.8347, abs=2e-3)
    assert studentized.seeds_for_power(0.03, 5e-4, 1.2e-4) is None  # the prompts alone are too wide


def test_at_three_seeds_the_t_interval_covers_where_the_percentile_bootstrap_does_not() -> None:
    """An S-row's design: 3 seeds per group, seed effects sd 1, image noise sd 1 on 16 prompts in 2 tags, true
    difference 0. The old interval: the 95% percentile bootstrap drawing seeds and prompts (4,000 replicates in the
    report; 400 here); the new one: the hull of it and the t interval."""
    rng = np.random.default_rng(47)
    tags = ["x"] * 8 + ["y"] * 8
    w = bootstrap.point_weights(tags)
    trials, n_boot, seeds = 2000, 400, 3
    old = new = 0
    for _ in range(trials):
        groups = [rng.normal(0, 1, (seeds, 1)) + rng.normal(0, 1, (seeds, 16)) for _ in range(2)]
        pw = bootstrap.prompt_weights(tags, n_boot, rng)
        reps = np.zeros(n_boot)
        for sign, y in zip((1.0, -1.0), groups, strict=True):
            draw = y[rng.integers(0, seeds, (n_boot, seeds))]  # (B, S, P)
            reps += sign * np.einsum("bsp,bp->b", draw, pw) / seeds
        low, high = bootstrap.interval(reps)
        old += low <= 0.0 <= high
        t = studentized.t_test([groups[0], -groups[1]], w, tags, 0.0)
        assert t is not None
        new += min(low, t.low) <= 0.0 <= max(high, t.high)
    # Binomial standard error of a coverage near 0.95 over 2000 trials: 0.005.
    assert old / trials < 0.88  # measured 0.827: anti-conservative
    assert new / trials >= 0.95 - 0.01  # measured 0.9585 (the t interval alone: the same)


@pytest.fixture(scope="module")
def committed_rows() -> tuple[dict, list[verdicts.Row]]:
    records = analysis.load_records(ROOT / "docs" / "benchmarks" / "cells.jsonl")
    return records, claim_rows.claim_rows(analysis.Analysis(records))


def test_e1s_verdict_and_p_do_not_move_with_the_random_stream(committed_rows) -> None:
    """E1 sits at its Holm threshold (p about 0.005 against a step of 0.05 / 10). Its bootstrap is redrawn from two
    more streams with the report's replicates; the decision p (the larger of the bootstrap's and the t test's)
    and the verdict stay to the third decimal, and the bootstrap p moves only by its Monte Carlo error."""
    records, rows = committed_rows
    readings = []
    for stream in (0, 1, 2):
        again = [dataclasses.replace(r, extra=dict(r.extra)) for r in rows]
        if stream:
            verdicts.refine(again, analysis.Analysis(records, stream=stream), claims.V2.confirmatory, ids={"E1"})
        e1 = next(r for r in again if r.id == "E1")
        assert e1.n_boot == verdicts.REFINED and e1.t is not None
        readings.append((verdicts.fmt_p(e1.p), verdicts.fmt_p(e1.p_holm), e1.verdict, e1.p_boot, e1.t.p))
    assert len({r[:3] for r in readings}) == 1, readings
    assert readings[0][:3] == ("0.005", "0.058", "unresolved (Holm)")
    boot = [r[3] for r in readings]
    # 2 sqrt(0.0023 / 200,000) = 0.0002 per stream: three streams within 4 of those.
    assert max(boot) - min(boot) < 0.0008 and all(b < readings[0][4] for b in boot)


def test_the_stress_rows_read_wider_and_say_what_their_seeds_would_do(committed_rows) -> None:
    _, rows = committed_rows
    by_id = {r.id: r for r in rows}
    s2 = by_id["S2"]
    assert s2.t is not None and s2.n_boot == verdicts.REFINED
    # Welch over 3 seeds per cell: the t interval is wider than the 3-seed percentile one and includes 0.
    assert s2.t.low < 0 < s2.boot_low and s2.low == s2.t.low and s2.t.p == pytest.approx(0.141, abs=0.001)
    assert s2.verdict == "unresolved" and s2.extra["power_goal"] == "reproduce"
    assert int(np.ceil(s2.extra["seeds_power"])) == 9 and int(np.ceil(s2.extra["seeds_power_holm"])) == 15
    assert by_id["N2"].extra["power_goal"] == "refute" and int(np.ceil(by_id["N2"].extra["seeds_power"])) == 114
    assert int(np.ceil(by_id["E1"].extra["seeds_power_holm"])) == 7
    # The own-rate rows beside the stress rows, exploratory, from the cells at each method's own rate.
    assert [r.id for r in rows].index("S1o") == [r.id for r in rows].index("S1") + 1
    assert by_id["S2o"].family == "exploratory" and by_id["S2o"].estimate is not None
    assert by_id["E3"].threshold == -claims.E3_MARGIN == -0.03 and "iterations" in by_id["E3"].claim


def test_the_power_command_reads_the_seeds_off_the_committed_rows(committed_rows) -> None:
    from benchmarks.compare import power

    _, rows = committed_rows
    table = power.power_table(rows, "cells.jsonl", claims.V2)
    lines = {line.split(" | ")[0]: line for line in table if line.startswith("| ")}
    # E1: 4 seeds per method at 0.05, 7 at Bonferroni's 0.05/14; E2 (exploratory in v2): 10 at Bonferroni.
    assert lines["| E1"].endswith("| 5 | 4 | 7 | reproduce |")
    assert lines["| E2"].endswith("| 5 | 4 | 10 | reproduce |")
    assert lines["| S2"].endswith("| 3 | 9 | 15 | reproduce |") and lines["| N2"].endswith("| 114 | 205 | refute |")
