"""The repository's import graph: circles anywhere in the tree, and each DVC stage's code dependencies.

    python scripts/import_graph.py cycles             # exit 1 and list them if any package imports in a circle
    python scripts/import_graph.py dvc-deps           # exit 1 if a stage's code deps differ from its closure
    python scripts/import_graph.py dvc-deps --write   # rewrite the code deps in dvc.yaml from the closures

The graph has one node per module of the repository's packages (every top-level folder with an ``__init__.py``)
and an edge for every import of another of them, at any depth in the file: a function-local import runs when the
function does, so it is a dependency too. An import of ``a.b.c`` also runs ``a/__init__.py`` and
``a/b/__init__.py``, so the closure follows parents; imports inside a module-level ``__getattr__`` run only on
attribute access (``from vgrpo import Trainer``) and are left out of the closure, not out of the circle check.

A DVC stage names the modules whose code decides its outputs in ``meta.code`` (the library function its command
calls); its code dependencies (the ``.py`` files among its deps) must be exactly their closure, so that
``dvc status`` reports a stage as changed when, and only when, code that can change its outputs has changed.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def module_files(repo: Path = REPO) -> dict[str, Path]:
    """Module name -> file, for every package at the top of ``repo``."""
    files: dict[str, Path] = {}
    for package in sorted(p.parent for p in repo.glob("*/__init__.py")):
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _imported_names(path: Path, module: str, *, lazy_getattr: bool) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    if not lazy_getattr:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                node.body = [ast.Pass()]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names |= {base, *(f"{base}.{a.name}" for a in node.names)}
    return names


def import_graph(files: dict[str, Path], *, lazy_getattr: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of ``files`` it imports (``from a import b`` counts ``a.b`` when it is a module)."""
    return {
        m: {n for n in _imported_names(p, m, lazy_getattr=lazy_getattr) if n in files and n != m}
        for m, p in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def closure(graph: dict[str, set[str]], modules: Iterable[str]) -> set[str]:
    """Every module that importing ``modules`` can run: their imports, transitively, and their parent packages."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        if m not in graph:
            raise KeyError(f"no module {m!r} in the repository")
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += graph[m]
    return seen


def _stages(dvc: dict) -> dict[str, dict]:
    """Stage name -> its definition (a ``foreach`` stage's ``do`` block once, under its own name)."""
    return {name: stage.get("do", stage) for name, stage in dvc["stages"].items()}


def expected_code_deps(repo: Path = REPO) -> dict[str, list[str]]:
    """Stage name -> the sorted ``.py`` paths of the closure of its ``meta.code`` modules."""
    files = module_files(repo)
    graph = import_graph(files, lazy_getattr=False)
    dvc = yaml.safe_load((repo / "dvc.yaml").read_text())
    out: dict[str, list[str]] = {}
    for name, stage in _stages(dvc).items():
        code = (stage.get("meta") or {}).get("code")
        if code:
            out[name] = sorted(str(files[m].relative_to(repo)) for m in closure(graph, code))
    return out


def listed_code_deps(repo: Path = REPO) -> dict[str, list[str]]:
    """Stage name -> the sorted ``.py`` paths among its deps in dvc.yaml."""
    dvc = yaml.safe_load((repo / "dvc.yaml").read_text())
    stages = _stages(dvc).items()
    return {name: sorted(d for d in stage.get("deps", []) if str(d).endswith(".py")) for name, stage in stages}


def write_code_deps(repo: Path = REPO) -> None:
    """Rewrite each stage's ``.py`` deps in dvc.yaml to its closure, keeping every other line as it is."""
    expected = expected_code_deps(repo)
    lines = (repo / "dvc.yaml").read_text().splitlines()
    out: list[str] = []
    stage: str | None = None
    in_deps = False
    for line in lines:
        top = re.match(r"^  (\S[^:]*):\s*$", line)
        if top:
            stage, in_deps = top.group(1), False
        if re.match(r"^\s+deps:", line):
            in_deps, indent = True, len(line) - len(line.lstrip())
            out.append(line)
            if stage in expected:
                out += [f"{' ' * (indent + 2)}- {p}" for p in expected[stage]]
            continue
        if in_deps:
            item = re.match(r"^(\s+)- (\S+)\s*(#.*)?$", line)
            if item and len(item.group(1)) > indent:
                if item.group(2).endswith(".py") and stage in expected:
                    continue
                out.append(line)
                continue
            if line.strip().startswith("#") and len(line) - len(line.lstrip()) > indent:
                out.append(line)
                continue
            in_deps = False
        out.append(line)
    (repo / "dvc.yaml").write_text("\n".join(out) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cycles")
    deps = sub.add_parser("dvc-deps")
    deps.add_argument("--write", action="store_true", help="rewrite dvc.yaml's code deps from the closures")
    args = parser.parse_args(argv)
    if args.command == "cycles":
        found = cycles(import_graph(module_files()))
        for c in found:
            print(" <-> ".join(c))
        return 1 if found else 0
    if args.write:
        write_code_deps()
    expected, listed = expected_code_deps(), listed_code_deps()
    bad = {s for s in expected if expected[s] != listed[s]}
    for s in sorted(bad):
        missing, extra = sorted(set(expected[s]) - set(listed[s])), sorted(set(listed[s]) - set(expected[s]))
        print(f"{s}: missing {missing}, extra {extra}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
