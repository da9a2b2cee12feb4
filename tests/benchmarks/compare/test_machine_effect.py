"""benchmarks.compare.machine_effect: the arms paired with v3's records by seed, the pre-registered verdicts, the
refusal to run on other code than v3's, and the report's rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.compare import machine_effect
from benchmarks.compare.plan import RunSpec
from tests.benchmarks.compare.tuning_records import record


def _cells(scores: dict[int, tuple[float, float]], cpu: str, threads: int) -> dict[int, dict[str, Any]]:
    """V-GRPO methods-phase records per seed scoring (iteration 40, iteration 80), v3's config and code hash."""
    out = {}
    for seed, (mid, end) in scores.items():
        spec = RunSpec("methods", "vgrpo", lr=4e-4, seed=seed, iterations=80, eval_every=10)
        curve = [0.5, 0.5, 0.5, mid, 0.5, 0.5, 0.5, end]
        r = record(spec, curve)
        r.update(config={"lr": 4e-4}, code_hash=machine_effect.V3_CODE_HASH, threads=threads)
        r["machine"] = {"cpu": cpu, "under_load": False}
        out[seed] = r
    return out


V3 = {1000 + i: (0.59 + 0.01 * (i % 3), 0.60 + 0.01 * (i % 4)) for i in range(10)}


def test_a_machine_that_only_reorders_sums_is_within_the_margin() -> None:
    ref = _cells(V3, "Intel(R) Xeon(R) Processor (6/167)", 2)
    wobble = [0.004, -0.003, 0.002, -0.004, 0.001, 0.003, -0.002, 0.0, -0.001, 0.002]
    arm = _cells({s: (m + w, e - w) for (s, (m, e)), w in zip(V3.items(), wobble, strict=True)}, "AMD EPYC (25/17)", 2)
    at40 = machine_effect.paired(arm, ref, 40)
    assert at40["mean"] == pytest.approx(sum(wobble) / 10)
    assert at40["verdict"] == "within the margin" and -machine_effect.MARGIN <= at40["lo"] < 0 < at40["hi"]
    assert machine_effect.paired(arm, ref, 80)["verdict"] == "within the margin"


def test_a_systematic_difference_is_a_shift_and_a_wide_one_unresolved() -> None:
    ref = _cells(V3, "Intel(R) Xeon(R) Processor (6/167)", 2)
    lower = _cells({s: (m - 0.03 + 0.002 * (s % 2), e) for s, (m, e) in V3.items()}, "AMD EPYC (25/17)", 1)
    at40 = machine_effect.paired(lower, ref, 40)
    assert at40["verdict"] == "shift" and at40["hi"] < 0 and at40["mean"] == pytest.approx(-0.029)
    noisy = _cells({s: (m + (0.05 if s % 2 else -0.05), e) for s, (m, e) in V3.items()}, "AMD EPYC (25/17)", 1)
    assert machine_effect.paired(noisy, ref, 40)["verdict"] == "unresolved"
    two = {s: r for s, r in lower.items() if s < 1002}
    assert machine_effect.paired(two, ref, 40)["verdict"] == "too few seeds"


def test_the_report_pairs_each_arm_and_refuses_another_config(tmp_path: Path) -> None:
    ref = _cells(V3, "Intel(R) Xeon(R) Processor (6/167)", 2)
    v3 = tmp_path / "v3.jsonl"
    v3.write_text("".join(json.dumps(r) + "\n" for r in ref.values()))
    arms = tmp_path / "docs" / "machine-effect"
    arms.mkdir(parents=True)
    same = _cells(V3, "AMD EPYC (25/17)", 2)
    for r in same.values():  # the evaluation prompts' path names the arm's records folder: not a difference
        r["config"] = {**r["config"], "eval_prompts": "/elsewhere/prompts/geneval-test-540.jsonl"}
    (arms / "amd-epyc-25-17-t2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in same.values()))
    other = _cells(V3, "AMD EPYC (25/17)", 1)
    other[1003]["config"] = {"lr": 8e-4}
    (arms / "amd-epyc-25-17-t1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other.values()))
    text = machine_effect.report(tmp_path / "docs", v3)
    assert "Intel(R) Xeon(R) Processor (6/167) at 2 threads" in text
    assert "| amd-epyc-25-17-t1 | | | another config or code than v3's at seeds [1003]: not compared |" in text
    rows = [line for line in text.splitlines() if line.startswith("| AMD EPYC (25/17) at 2 threads")]
    assert len(rows) == 2 and all(
        "| +0.000 [+0.000, +0.000] |" in r and r.endswith("| within the margin |") for r in rows
    )


def test_the_runner_refuses_other_code_than_v3s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(machine_effect, "code_hash", lambda: "0000000000000000")
    monkeypatch.setattr(machine_effect.cell_runs, "run_phase", lambda *_: pytest.fail("a cell ran"))
    argv = ["run", "--threads", "2", "--docs", str(tmp_path / "docs"), "--out", str(tmp_path / "out")]
    assert machine_effect.main(argv) == 2
    assert "v3's is 8a1a0d70a81f4314" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "docs").exists()


def test_the_runner_trains_v3s_specs_in_its_arms_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _cells({1000: (0.6, 0.6), 1001: (0.6, 0.6)}, "Intel(R) Xeon(R) Processor (6/167)", 2)
    v3 = tmp_path / "v3.jsonl"
    v3.write_text("".join(json.dumps(r) + "\n" for r in ref.values()))
    monkeypatch.setattr(machine_effect, "code_hash", lambda: machine_effect.V3_CODE_HASH)
    monkeypatch.setattr(machine_effect, "cpu_model", lambda: "AMD EPYC (25/17)")
    ran: list[Any] = []

    def run_phase(specs: list[RunSpec], args: Any, sizes: Any, out: Path, started: float) -> None:
        ran.append((out, args.grid, args.threads, [s.seed for s in specs]))
        for r in ref.values():  # the cells write their records: here v3's own
            (out / f"{r['name']}.json").write_text(json.dumps({**r, "machine": {"cpu": "AMD EPYC (25/17)"}}))

    monkeypatch.setattr(machine_effect.cell_runs, "run_phase", run_phase)
    argv = ["run", "--threads", "1", "--v3-records", str(v3), "--docs", str(tmp_path / "docs")]
    assert machine_effect.main([*argv, "--out", str(tmp_path / "out")]) == 0
    assert ran == [((tmp_path / "out" / "amd-epyc-25-17-t1").resolve(), "v3", 1, [1000, 1001])]
    assert machine_effect.arm_name("Intel(R) Xeon(R) Processor (6/167)", 2) == "intel-xeon-processor-6-167-t2"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--threads", "0"], "--threads 0 and --workers 1: each at least 1"),
        (["--v3-records", "nowhere.jsonl"], "no such file"),
    ],
)
def test_bad_input_is_refused_before_any_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    monkeypatch.setattr(machine_effect.cell_runs, "run_phase", lambda *_: pytest.fail("a cell ran"))
    argv = ["run", "--threads", "2", "--docs", str(tmp_path / "docs"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        machine_effect.main([*argv, *extra])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
