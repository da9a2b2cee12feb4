"""Benchmark v3's claim set and report: the v2 rows as the pre-registration changes them, read off the records of
v3's plan (its own-rate cells included)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks.common import METHODS
from benchmarks.compare import analysis, claim_rows, claim_sets, claims, plan_v3, registered, report, rules, verdicts
from tests.benchmarks.compare import synthetic

TUNED = {m: plan_v3.Tuned("v2", 4e-4, {}) for m in METHODS} | {
    "diffusion_nft": plan_v3.Tuned("official", 8e-4, {"algorithm": {"n_mc": 9}})
}


@pytest.fixture(scope="module")
def v3_records() -> dict:
    return synthetic.v3_grid(TUNED)


def test_v3_differs_from_v2_only_where_the_preregistration_says() -> None:
    v2 = {c.id: c for c in claims.V2.claims}
    v3 = {c.id: c for c in claim_sets.V3.claims}
    assert list(v2) == list(v3)  # the same rows in the same order
    assert claim_sets.V3.confirmatory == tuple(i for i in v2 if v2[i].confirmatory or i == "E2")
    assert len(claim_sets.V3.confirmatory) == 15 and len(claims.V2.confirmatory) == 14
    changed = {"E2", *claim_sets.ESTIMATION_ROWS}
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


def test_v3_rows_read_the_own_rate_cells_and_holm_covers_fifteen(v3_records) -> None:
    an = analysis.Analysis(v3_records, n_boot=1000)
    rows = {r.id: r for r in claim_rows.claim_rows(an, refine_near=False, claims=claim_sets.V3)}
    assert [r for r in rows if rows[r].family == "confirmatory"] == list(claim_sets.V3.confirmatory)
    # Naive's worst drop, at its last point: 0.06 (1 - e^-5) = 0.060; V-GRPO's worst "drop" is its first point,
    # 0.05 (1 - e^-0.5) = 0.020 above the base: naive minus V-GRPO 0.080.
    s1o = rows["S1o"]
    assert s1o.estimate == pytest.approx(0.080, abs=0.01) and s1o.verdict == "reproduced"
    assert (
        s1o.note.startswith(claim_sets.ESTIMATION_NOTE)
        and "; from the own_rate cells (50 iterations, evaluated every 5)" in s1o.note
    )
    assert rows["S2o"].estimate == pytest.approx(0.596 + 0.020, abs=0.02)  # naive dips ten times more
    assert "pre-registered" in rows["E3"].note and "after the grid ran" not in rows["E3"].note
    assert rows["N1"].note.startswith(claim_sets.ESTIMATION_NOTE)
    assert claim_sets.ESTIMATION_NOTE not in rows["E1"].note
    # E2 is in the family now: its Holm-adjusted p exists and is at least its own p.
    assert rows["E2"].p_holm is not None and rows["E2"].p_holm >= rows["E2"].p
    # v2 over the same records: E2 exploratory, fourteen in the family, S1o read from the methods cells.
    v2 = {r.id: r for r in claim_rows.claim_rows(an, refine_near=False, claims=claims.V2)}
    assert v2["E2"].p_holm is None and v2["S1o"].note.startswith("not pre-registered; from the methods cells")


def test_the_v3_report_states_its_protocol_recipes_and_fifteen_row_family(v3_records, tmp_path: Path) -> None:
    folder = tmp_path / "cells"
    folder.mkdir()
    for name, r in v3_records.items():
        (folder / f"{name}.json").write_text(json.dumps(r))
    planned = [s.name for s in plan_v3.full_plan(TUNED)]
    docs = tmp_path / "docs"
    docs.mkdir()
    runs = [{"started_at": "a", "elapsed_s": 3600.0, "workers": 1, "threads": 2}]
    runs.append({"started_at": "b", "elapsed_s": 7200.0, "workers": 2, "threads": 1})
    (docs / "grid.json").write_text(json.dumps(runs))
    deviations = tmp_path / "deviations.md"
    deviations.write_text("# Deviations\n\n- Cell x reran after a kill.\n")
    rows = report.write_report(
        folder,
        docs,
        command="python -m benchmarks.compare --grid v3",
        planned=planned,
        sizes=plan_v3.V3,
        tuned=TUNED,
        grid=dataclasses.replace(registered.GRIDS["v3"], deviations=deviations),
    )
    text = (docs / "README.md").read_text()
    assert text.startswith("# Benchmark v3: the pre-registered replication")
    top = text.index("## Deviations from the pre-registration")
    assert top < text.index("- Cell x reran after a kill.") < text.index("## Protocol (pre-registered)")
    assert "# Deviations\n" not in text  # the file's own title is left out
    assert "## Protocol (pre-registered)" in text and "Learning-rate sweep" not in text
    assert f"Cells done: {len(planned)} of {len(planned)} planned" in text and len(planned) == 198
    assert '| DiffusionNFT | official | 0.0008 | `{"algorithm": {"n_mc": 9}}` |' in text
    assert "10 per method (80 iterations" in text and "15 per preference cell" in text and "9 per cell" in text
    assert "The 15 confirmatory rows are Holm-corrected" in text and "(0.05/15)" in text
    assert "1 of 1 cell(s) at a time x 2 thread(s) (1.0 h); 1 of 2 cell(s) at a time x 1 thread(s) (2.0 h)" in text
    assert {r.id for r in rows if r.family == "confirmatory"} == set(claim_sets.V3.confirmatory)
    assert (docs / "cells.jsonl").is_file() and len((docs / "cells.jsonl").read_text().splitlines()) == len(planned)


def test_a_v3_report_without_a_deviations_file_says_none_is_listed(tmp_path: Path) -> None:
    lines = report.deviation_lines(tmp_path / "deviations.md")
    assert lines[0] == "## Deviations from the pre-registration"
    assert "None listed (`deviations.md` does not exist)." in lines


def test_the_v3_grid_refuses_to_start_before_its_preregistration_is_committed(tmp_path: Path) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    path = tmp_path / "prereg.md"
    path.write_text("# Benchmark v3: pre-registration — DRAFT\n")
    with pytest.raises(plan_v3.NotPreregistered, match="still a DRAFT"):
        plan_v3.check_preregistered(path, tmp_path)
    path.write_text("# Benchmark v3: pre-registration\n")
    with pytest.raises(plan_v3.NotPreregistered, match="not committed"):
        plan_v3.check_preregistered(path, tmp_path)
    git("add", "prereg.md")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pre-register")
    plan_v3.check_preregistered(path, tmp_path)  # committed as it is
    with pytest.raises(plan_v3.NotPreregistered, match="missing"):
        plan_v3.check_preregistered(tmp_path / "none.md", tmp_path)


def test_holm_over_v3_adjusts_by_fifteen() -> None:
    from benchmarks.compare import verdicts

    row = verdicts.Row(id="E2", claim="", paper="", rule="", p=0.001, extra={"lean": "above"}, confirmatory=True)
    verdicts.decide([row], claim_sets.V3.confirmatory)
    assert row.p_holm == pytest.approx(0.015) and row.verdict == "reproduced"
    again = dataclasses.replace(row, p_holm=None, verdict="not run")
    verdicts.decide([again], claims.V2.confirmatory)  # E2 is not in v2's family
    assert again.p_holm is None and again.verdict == "reproduced"


def test_the_v3_report_reads_every_confirmatory_row_again_from_other_streams() -> None:
    from benchmarks.compare.stream_check import fmt_p, stream_lines

    # Noisy enough that most rows' p-values lie inside (0, 1) and move with the stream.
    records = synthetic.v3_grid(TUNED, noise=1.5)
    rows = claim_rows.claim_rows(analysis.Analysis(records), claims=claim_sets.V3)
    lines = stream_lines(records, rows, claim_sets.V3, streams=(1, 2))
    table = [line.strip("| ").split(" | ") for line in lines[6:] if line.startswith("| ")]
    confirmatory = [r for r in rows if r.confirmatory]
    assert [cells[0] for cells in table] == [r.id for r in confirmatory]
    others = [
        {o.id: o for o in claim_rows.claim_rows(analysis.Analysis(records, stream=s), claims=claim_sets.V3)}
        for s in (1, 2)
    ]

    def fmt(r):
        return f"{fmt_p(r.p)} [{fmt_p(r.decision_p)}]"

    for cells, r in zip(table, confirmatory, strict=True):
        again = [o[r.id] for o in others]
        assert cells[1] == r.verdict and cells[2] == fmt(r) and cells[3] == ", ".join(fmt(o) for o in again)
        moved = [float(x) for x in cells[4].split("; ")]
        assert moved[0] == pytest.approx(max(abs(o.p - r.p) for o in again), abs=5e-5)
        assert moved[1] == pytest.approx(max(abs(o.decision_p - r.decision_p) for o in again), abs=5e-5)
        same = "yes" if all(round(o.p, 3) == round(r.p, 3) for o in again) else "no"
        assert cells[5].split("; ")[0] == same
        assert cells[6] == ("yes" if all(o.verdict == r.verdict for o in again) else "no")
    # A bootstrap p inside (0, 1) from 4,000 replicates moves with the stream; the t p alone would not.
    assert any(float(cells[4].split("; ")[0]) > 0 for cells in table)


def test_a_one_machine_claim_set_refuses_a_row_whose_cells_ran_on_two_machine_types(v3_records) -> None:
    """Benchmark v4's rule: every group of a comparison on one CPU model and thread count. On one machine type the
    rows read as without the rule; with V-GRPO's methods cells on another model, the rows that read them are
    refused (no estimate, both machines named, p = 1 in Holm's family) and the others read as before."""
    one = dataclasses.replace(claim_sets.V3, one_machine=True)
    records = {n: {**r, "machine": {"cpu": "CPU A (6/167)"}, "threads": 2} for n, r in v3_records.items()}

    def rows(records: dict, claims: object) -> dict:
        an = analysis.Analysis(records, n_boot=500)
        return {r.id: r for r in claim_rows.claim_rows(an, refine_near=False, claims=claims)}  # type: ignore[arg-type]

    plain, guarded = rows(records, claim_sets.V3), rows(records, one)
    assert {i: (r.estimate, r.verdict) for i, r in plain.items()} == {
        i: (r.estimate, r.verdict) for i, r in guarded.items()
    }
    moved = dict(records)
    for name, r in records.items():
        if r["spec"]["phase"] == "methods" and r["spec"]["method"] == "vgrpo":
            moved[name] = {**r, "machine": {"cpu": "CPU B (25/17)"}}
    plain, guarded = rows(moved, claim_sets.V3), rows(moved, one)
    refused = {i for i, r in guarded.items() if r.verdict.startswith("refused")}
    reads_vgrpo_methods = {
        c.id
        for c in claim_sets.V3.claims
        if not isinstance(c.cells, claim_rows.RaisedRates)
        and any(g.phase == "methods" and g.method == "vgrpo" for g in c.cells)
    }
    assert "E1" in refused and refused == reads_vgrpo_methods
    e1 = guarded["E1"]
    assert e1.estimate is None and e1.p is None and e1.p_holm is None
    assert e1.verdict == "refused: its cells ran on CPU A (6/167) at 2 threads and CPU B (25/17) at 2 threads"
    assert plain["E1"].estimate is not None  # v3's set reads across machines, as v3 ran
    # the other rows' estimates stand (their intervals draw from the stream after fewer rows, and Holm's family
    # holds the refused rows at p = 1, so their intervals and verdicts may move)
    assert {i: guarded[i].estimate for i in guarded.keys() - refused} == {
        i: plain[i].estimate for i in guarded.keys() - refused
    }
    line = next(x for x in verdicts.claims_table(list(guarded.values()), 15) if x.startswith("| E1 |"))
    assert "| refused | " in line and "| refused: its cells ran on CPU A (6/167) at 2 threads and" in line


def test_equal_budget_reads_both_methods_at_the_smaller_full_budget(v3_records) -> None:
    """V-GRPO minus DiffusionNFT at equal transformer evaluations: both curves read at the smaller of the two
    methods' last NFE (linear between evaluation points), through the claim machinery (its linearity check,
    its t test)."""
    an = analysis.Analysis(v3_records, n_boot=500)
    ours, theirs = (an.group("methods", m) for m in ("vgrpo", "diffusion_nft"))
    assert ours is not None and theirs is not None
    x = min(ours.axes["nfe"][-1], theirs.axes["nfe"][-1])
    point, _ = an.weights("geneval")
    expected = float(
        analysis.at_budget(ours.axes["nfe"], ours.per_seed(point), x)
        - analysis.at_budget(theirs.axes["nfe"], theirs.per_seed(point), x)
    )
    claim = claims.Claim(
        "D1",
        "V-GRPO matches DiffusionNFT at equal cost",
        "",
        "V-GRPO minus DiffusionNFT at the smaller of their NFE budgets > -0.03",
        (claims.Cells("methods", "vgrpo"), claims.Cells("methods", "diffusion_nft")),
        rules.EqualBudget("nfe"),
        threshold=-0.03,
    )
    row = claim_rows.read(claim, an, {}, 1)
    assert row is not None and row.estimate == pytest.approx(expected) and row.t is not None
    # the synthetic cells cost the same per iteration: equal NFE is equal iterations, the final difference
    final = analysis.final(ours.per_seed(point)) - analysis.final(theirs.per_seed(point))
    assert ours.axes["nfe"][-1] == theirs.axes["nfe"][-1] and row.estimate == pytest.approx(float(final))
    cheap = copy.copy(ours)
    cheap.axes = {**ours.axes, "nfe": ours.axes["nfe"] / 2}  # V-GRPO at half the cost: the other read at its middle
    fn = rules.EqualBudget("nfe").function([cheap, theirs])
    mid = analysis.at_budget(theirs.axes["nfe"], theirs.per_seed(point), theirs.axes["nfe"][-1] / 2)
    assert float(fn(cheap.per_seed(point), theirs.per_seed(point))) == pytest.approx(
        float(analysis.final(ours.per_seed(point)) - mid)
    )


def test_v4_states_what_each_row_tests_adds_equal_cost_rows_and_reads_on_one_machine(v3_records) -> None:
    v3 = {c.id: c for c in claim_sets.V3.claims}
    v4 = {c.id: c for c in claim_sets.V4.claims}
    assert list(v4)[:8] == ["E1", "E4", "E2", "E5", "E3", "D1", "D2", "D3"]  # wall time beside iterations
    assert list(v4)[8:] == [i for i in v3 if not i.startswith("E")] and set(v3) < set(v4)
    assert claim_sets.V4.one_machine and not claim_sets.V3.one_machine
    assert claim_sets.V4.confirmatory == (
        "E1",
        "E2",
        "E3",
        "D1",
        "D2",
        *[i for i in claim_sets.V3.confirmatory if not i.startswith("E")],
    )
    for i in v3:  # only words and notes change: every rule, threshold, side and statistic is v3's
        assert (v4[i].threshold, v4[i].side, v4[i].statistic, v4[i].cells) == (
            v3[i].threshold,
            v3[i].side,
            v3[i].statistic,
            v3[i].cells,
        )
    words = " ".join(c.claim for c in v4.values())
    assert "2x faster" not in words and "unstable where" not in words and "is stable" not in words
    assert all(claim_sets.ESTIMATION_NOTE not in (c.note if isinstance(c.note, str) else "") for c in v4.values())
    # Read over one machine's records: the equal-cost rows and the ablations' notes.
    records = {n: {**r, "machine": {"cpu": "CPU A (6/167)"}, "threads": 2} for n, r in v3_records.items()}
    an = analysis.Analysis(records, n_boot=500)
    rows = {r.id: r for r in claim_rows.claim_rows(an, refine_near=False, claims=claim_sets.V4)}
    assert not any(r.verdict.startswith("refused") for r in rows.values())
    # the synthetic methods cost the same per iteration: D1 (iterations) and D2 (NFE) read the same difference
    assert rows["D1"].estimate is not None and rows["D2"].estimate == pytest.approx(rows["D1"].estimate)
    assert rows["D1"].rule == "final V-GRPO minus DiffusionNFT > -0.03 (non-inferiority, margin 0.03)"
    assert rows["D2"].rule.startswith("V-GRPO minus DiffusionNFT, both at the smaller of their full budgets in trans")
    assert rows["S1"].claim.startswith("Naive ELBO-GRPO drops further below the base than V-GRPO at x2 and x4 each")
    n_mc = records[next(n for n, r in records.items() if r["spec"]["phase"] == "methods")]["config"]["algorithm"]
    assert rows["A4"].note == f"at V-GRPO's chosen recipe and rate (N_MC {n_mc['n_mc']}), not retuned for the variant"


def test_the_power_command_sizes_v4_from_records_that_ran_across_machines(v3_records, tmp_path: Path, capsys) -> None:
    """v4 refuses rows read across machine types; its power analysis reads v3's variances, which did: every row
    with a test gets its seeds, the ablation rows (another machine than the methods cells here) included."""
    from benchmarks.compare import power

    cells = tmp_path / "cells"
    cells.mkdir()
    for name, r in v3_records.items():
        cpu = "CPU B (25/17)" if r["spec"]["phase"] == "ablation" else "CPU A (6/167)"
        (cells / f"{name}.json").write_text(json.dumps({**r, "machine": {"cpu": cpu}, "threads": 2}))
    power.main([str(cells), "--claims", "v4", "--out", str(tmp_path / "power.md")])
    ids = [
        line.split(" | ")[0][2:] for line in (tmp_path / "power.md").read_text().splitlines() if line.startswith("| ")
    ]
    assert {"A2", "A3", "A5", "D1", "D2", "E1"} <= set(ids) and "refused" not in capsys.readouterr().out
    assert "(v4's confirmatory rows)" in (tmp_path / "power.md").read_text()
