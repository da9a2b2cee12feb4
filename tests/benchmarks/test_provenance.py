"""benchmarks.provenance: the cell key follows what decides a cell's result and not its docstrings, the machine
clock sees another process load the cores, and the CPU model names family and model."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import provenance
from benchmarks.common import ROOT


def test_the_cell_key_follows_config_threads_prompt_files_and_code_but_not_docstrings(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("a\n")
    key = provenance.cell_key({"a": 1}, {"lr": 1}, 2, [prompts])
    assert key == provenance.cell_key({"a": 1}, {"lr": 1}, 2, [prompts])
    assert key != provenance.cell_key({"a": 1}, {"lr": 2}, 2, [prompts])
    assert key != provenance.cell_key({"a": 1}, {"lr": 1}, 1, [prompts])
    prompts.write_text("b\n")
    assert key != provenance.cell_key({"a": 1}, {"lr": 1}, 2, [prompts])
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('def f(x):\n    """Doc."""\n    return x + 1\n')
    b.write_text("def f(x):  # a comment\n    return (x + 1)\n")
    c.write_text("def f(x):\n    return x + 2\n")
    assert provenance.source_digest(a) == provenance.source_digest(b) != provenance.source_digest(c)
    files = {p.relative_to(ROOT).as_posix() for p in provenance.code_files()}
    assert {"benchmarks/compare/cell.py", "vgrpo/training/stage.py", "vgrpo/surrogate.py"} <= files
    assert "benchmarks/compare/plan.py" not in files  # the plan's code: what it decides is in the resolved config


def test_the_machine_clock_sees_another_process_load_the_cores() -> None:
    clock, with_children = provenance.MachineClock(), provenance.MachineClock(count_children=True)
    pid = os.fork()
    if pid == 0:  # a child that spends a second of CPU (not of wall time: other load may slow it)
        end = __import__("time").process_time() + 1.0
        while __import__("time").process_time() < end:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    m, mc = clock.finish(), with_children.finish()
    assert m["other_load_cores"] > 0.5 and m["under_load"] and m["process_cpu_s"] < 0.5
    # the same second of the child's CPU is the measurement's own when it counts its children
    assert mc["process_cpu_s"] - m["process_cpu_s"] > 0.8
    assert (m["other_load_cores"] - mc["other_load_cores"]) * mc["wall_s"] > 0.8


def test_the_cpu_model_is_the_first_processor_name_with_family_and_model(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    block = "processor\t: {}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
    info.write_text(block.format(0) + "\n" + block.format(1).replace("AMD EPYC", "other") + "\n")
    assert provenance.cpu_model(str(info)) == "AMD EPYC (25/17)"
    assert provenance.cpu_model(str(tmp_path / "missing")) == "unknown"
    assert provenance.MachineClock().finish()["cpu"] == provenance.cpu_model()
