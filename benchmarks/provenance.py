"""Where a cell of the comparison grid came from and what the machine was doing while it ran.

A cell's *key* is a hash of everything that decides its result: its spec, its fully resolved stage config, the
torch threads, the content of every file its config names (prompt files), and the *code hash*: the code that
trains and scores it (:mod:`benchmarks.compare.cell` and the import closure of the library modules it imports, as
``scripts/import_graph.py`` computes closures for the DVC stages) and the model weights under ``models/``. What
the grid's plan decides about a cell is all in its resolved config, so the plan's own code is not in the hash; a
module's code is hashed as its syntax tree without docstrings, so that a comment or a reformat does not count. The grid
resumes a cell only when the record on disk carries the same key (:func:`benchmarks.compare.cell_runs.run_phase`), so a
record from another config, another thread count or other code is run again, never reused under a new name.

The machine's state is read from ``/proc``: the CPU time every process spent while the cell ran, less the cell's
own, is the load other processes put on the cores (in cores, averaged over the cell's wall time).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT
from vgrpo.atomic import file_sha256

REGISTRIES = ("vgrpo.algorithms.", "vgrpo.rewards.", "vgrpo.models.")
"""Packages whose modules the library's registries import by name (``importlib``): every one is in the code."""
LOADED_CORES = 0.25  # a cell ran "under load" when other processes used more than this many cores on average
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def source_digest(path: Path) -> str:
    """sha256 of a Python module's syntax tree without its docstrings (other files: of their bytes)."""
    if path.suffix != ".py":
        return file_sha256(path)
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


@cache
def code_files(module: str = "benchmarks.compare.cell") -> tuple[Path, ...]:
    """The code a cell runs: ``module`` and the closure of the library modules (``vgrpo``) it imports and of every
    module of the packages behind the registries (:data:`REGISTRIES`)."""
    spec = importlib.util.spec_from_file_location("_import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    graph_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph_mod)
    files = graph_mod.module_files(ROOT)
    graph = graph_mod.import_graph(files)
    library = [m for m in graph[module] if m.split(".")[0] == "vgrpo"]
    library += [m for m in files if m.startswith(REGISTRIES)]  # loaded by name, so not in the import graph
    return tuple(sorted({files[module], *(files[m] for m in graph_mod.closure(graph, library))}))


@cache
def code_hash() -> str:
    """A hash of the cell's code (:func:`code_files`) and of every file under ``models/``."""
    h = hashlib.sha256()
    paths = [*code_files(), *sorted(p for p in (ROOT / "models").rglob("*") if p.is_file())]
    for path in paths:
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(source_digest(path).encode())
    return h.hexdigest()[:16]


def cell_key(spec: dict[str, Any], config: dict[str, Any] | None, threads: int, files: list[Path]) -> str:
    """The hash a cell's record must carry to be reused (see the module docstring)."""
    payload = {
        "spec": spec,
        "config": config,
        "threads": threads,
        "files": {str(p): file_sha256(p) for p in files},
        "code": code_hash(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_state() -> dict[str, Any]:
    """The commit the working tree is at and whether the cell's code differs from it."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    rel = [str(p.relative_to(ROOT)) for p in code_files()]
    dirty = git("status", "--porcelain", "--", *rel, "models")
    return {"commit": git("rev-parse", "HEAD") or None, "code_dirty": bool(dirty)}


def cpu_busy_s() -> float:
    """Seconds of CPU every process on the machine has spent since boot (all cores, idle and iowait excluded)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


@cache
def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's name as ``cpuinfo`` gives it, with its family and model numbers (``AMD EPYC (25/17)``):
    wall times compare only between cells on the same CPU, and float sums in another order give other bytes."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo) as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return "unknown"
    return f"{fields.get('model name', 'unknown')} ({fields.get('cpu family', '?')}/{fields.get('model', '?')})"


class MachineClock:
    """The cell's start time, its own CPU time, and the other processes' load while it ran. With
    ``count_children`` the CPU time of the child processes it waited for counts as its own (a measurement run as
    a subprocess)."""

    def __init__(self, count_children: bool = False) -> None:
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.loadavg_start = os.getloadavg()[0]
        self._count_children = count_children
        self._wall = time.perf_counter()
        self._busy = cpu_busy_s()
        self._cpu = self._own_cpu()

    def _own_cpu(self) -> float:
        t = os.times()
        children = t.children_user + t.children_system if self._count_children else 0.0
        return t.user + t.system + children

    def finish(self) -> dict[str, Any]:
        wall = time.perf_counter() - self._wall
        own = self._own_cpu() - self._cpu
        others = max(0.0, cpu_busy_s() - self._busy - own)
        other_cores = others / wall if wall > 0 else 0.0
        return {
            "started_at": self.started_at,
            "wall_s": wall,
            "process_cpu_s": own,
            "other_load_cores": other_cores,
            "loadavg_start": self.loadavg_start,
            "loadavg_end": os.getloadavg()[0],
            "cores": os.cpu_count(),
            "cpu": cpu_model(),
            "under_load": other_cores > LOADED_CORES,
        }


def other_load(seconds: float = 3.0, exclude: set[int] | None = None) -> float:
    """Cores other processes use right now: the machine's CPU time over ``seconds``, less that of ``exclude``
    (pids; the caller itself is always excluded)."""
    pids = {os.getpid(), *(exclude or set())}

    def own() -> float:
        total = 0.0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
                total += (int(parts[11]) + int(parts[12])) / CLK_TCK
            except (OSError, IndexError, ValueError):
                continue
        return total

    b0, o0 = cpu_busy_s(), own()
    time.sleep(seconds)
    return max(0.0, (cpu_busy_s() - b0 - (own() - o0)) / seconds)


def wait_until_idle(exclude: set[int] | None = None, poll_s: float = 30.0) -> None:
    """Return when other processes (not ``exclude``) use at most :data:`LOADED_CORES` cores, saying once that it
    waits: a timing or a cell is not started while something else shares the cores."""
    said = False
    while (load := other_load(3.0, exclude)) > LOADED_CORES:
        if not said:
            print(f"other processes use {load:.2f} cores: waiting for the machine to be idle", flush=True)
            said = True
        time.sleep(poll_s)
