"""Benchmark v3's claim set: the v2 rows as the pre-registration changes them, read off v3's own-rate cells."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.compare import analysis, claim_rows, claims
from tests.benchmarks.compare import synthetic


def test_v3_differs_from_v2_only_where_the_preregistration_says() -> None:
    v2 = {c.id: c for c in claims.V2.claims}
    v3 = {c.id: c for c in claims.V3.claims}
    assert list(v2) == list(v3)  # the same rows in the same order
    assert claims.V3.confirmatory == tuple(i for i in v2 if v2[i].confirmatory or i == "E2")
    assert len(claims.V3.confirmatory) == 15 and len(claims.V2.confirmatory) == 14
    changed = {"E2", *claims.ESTIMATION_ROWS}
    for i in v2:
        if i not in changed:
            assert v3[i] == v2[i], i
    for i, v2_phase in (("S1o", "methods"), ("S2o", "preference")):
        assert {c.phase for c in v3[i].cells} == {"own_rate"} and not v3[i].read_last  # type: ignore[union-attr]
        assert {c.phase for c in v2[i].cells} == {v2_phase} and v2[i].read_last  # type: ignore[union-attr]
    # Only the words and the cells change: every threshold and side is v2's (E3's 0.03 included).
    for i in v2:
        assert (v3[i].threshold, v3[i].side, v3[i].statistic) == (v2[i].threshold, v2[i].side, v2[i].statistic)
    assert v3["E3"].threshold == -0.03


def test_v3_rows_read_the_own_rate_cells_and_holm_covers_fifteen() -> None:
    records = synthetic.full_grid() | synthetic.own_rate_cells()
    an = analysis.Analysis(records, n_boot=1000)
    rows = {r.id: r for r in claim_rows.claim_rows(an, refine_near=False, claims=claims.V3)}
    assert [r for r in rows if rows[r].family == "confirmatory"] == list(claims.V3.confirmatory)
    # Naive's worst drop, at its last point: 0.06 (1 - e^-5) = 0.060; V-GRPO's worst "drop" is its first point,
    # 0.05 (1 - e^-0.5) = 0.020 above the base: naive minus V-GRPO 0.080.
    s1o = rows["S1o"]
    assert s1o.estimate == pytest.approx(0.080, abs=0.01) and s1o.verdict == "reproduced"
    assert (
        s1o.note.startswith(claims.ESTIMATION_NOTE)
        and "; from the own_rate cells (50 iterations, evaluated every 5)" in s1o.note
    )
    assert rows["S2o"].estimate == pytest.approx(0.596 + 0.020, abs=0.02)  # naive dips ten times more
    assert "pre-registered" in rows["E3"].note and "after the grid ran" not in rows["E3"].note
    assert rows["N1"].note.startswith(claims.ESTIMATION_NOTE) and rows["E1"].note.find(claims.ESTIMATION_NOTE) < 0
    # E2 is in the family now: its Holm-adjusted p exists and is at least its own p.
    assert rows["E2"].p_holm is not None and rows["E2"].p_holm >= rows["E2"].p
    # v2 over the same records: E2 exploratory, fourteen in the family, S1o read from the methods cells.
    v2 = {r.id: r for r in claim_rows.claim_rows(an, refine_near=False, claims=claims.V2)}
    assert v2["E2"].p_holm is None and v2["S1o"].note.startswith("not pre-registered; from the methods cells")


def test_holm_over_v3_adjusts_by_fifteen() -> None:
    from benchmarks.compare import verdicts

    row = verdicts.Row(id="E2", claim="", paper="", rule="", p=0.001, extra={"lean": "above"}, confirmatory=True)
    verdicts.decide([row], claims.V3.confirmatory)
    assert row.p_holm == pytest.approx(0.015) and row.verdict == "reproduced"
    again = dataclasses.replace(row, p_holm=None, verdict="not run")
    verdicts.decide([again], claims.V2.confirmatory)  # E2 is not in v2's family
    assert again.p_holm is None and again.verdict == "reproduced"
