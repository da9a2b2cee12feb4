"""The repository imports without circles (a circle makes import order matter and hides a module's real
dependencies, from readers and from DVC's deps lists), and each DVC stage's code deps are its import closure
(scripts/import_graph.py)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
assert _spec is not None and _spec.loader is not None
graph_tool = importlib.util.module_from_spec(_spec)
sys.modules["import_graph"] = graph_tool
_spec.loader.exec_module(graph_tool)


def test_the_repository_has_no_import_circle() -> None:
    files = graph_tool.module_files(REPO)
    graph = graph_tool.import_graph(files)
    assert {m.split(".")[0] for m in files} >= {"vgrpo", "tasks", "flows", "services", "benchmarks", "tests"}
    assert len(graph) > 150 and "vgrpo.training.stage" in graph["vgrpo.trainer"]  # lazy imports are edges too
    assert graph_tool.cycles(graph) == []


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


Graph = dict[str, set[str]]


@pytest.fixture
def graph_of(tmp_path: Path) -> Callable[..., Graph]:
    """The import graph (scripts/import_graph.py) of a repository written under ``tmp_path``: the modules ``files``
    (path -> text) and the ``empty`` ones; keyword ``options`` go to ``import_graph``."""

    def graph(files: dict[str, str], empty: tuple[str, ...], **options: bool) -> Graph:
        _package(tmp_path, files | dict.fromkeys(empty, ""))
        return graph_tool.import_graph(graph_tool.module_files(tmp_path), **options)

    return graph


def test_a_circle_is_found_across_packages_and_through_lazy_imports(graph_of: Callable[..., Graph]) -> None:
    graph = graph_of(
        {
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def f():\n    from other.c import x\n",
            "other/c.py": "import pkg.a\n",
            "other/d.py": "from other import c\n",
        },
        empty=("pkg/__init__.py", "other/__init__.py"),
    )
    assert graph_tool.cycles(graph) == [["other.c", "pkg.a", "pkg.b"]]


def test_a_closure_follows_parents_and_lazy_imports_but_not_a_lazy_getattr(graph_of: Callable[..., Graph]) -> None:
    graph = graph_of(
        {
            "pkg/__init__.py": "def __getattr__(name):\n    from pkg.heavy import H\n    return H\n",
            "pkg/sub/__init__.py": "from pkg.sub import leaf\n",
            "pkg/sub/leaf.py": "def f():\n    from pkg import util\n",
        },
        empty=("pkg/heavy.py", "pkg/util.py", "pkg/unused.py"),
        lazy_getattr=False,
    )
    assert graph_tool.closure(graph, ["pkg.sub.leaf"]) == {"pkg", "pkg.sub", "pkg.sub.leaf", "pkg.util"}


def test_every_dvc_stages_code_deps_are_its_import_closure() -> None:
    expected, listed = graph_tool.expected_code_deps(REPO), graph_tool.listed_code_deps(REPO)
    assert {"world_splits", "pretrain_base", "stage", "evaluate_curriculum"} <= set(expected)
    differ = {s: sorted(set(expected[s]) ^ set(listed[s])) for s in expected}
    assert {s: d for s, d in differ.items() if d} == {}, "python scripts/import_graph.py dvc-deps --write"
    code_stages = {s for s, deps in listed.items() if deps}
    assert code_stages == set(expected), "a stage with code deps names its modules in meta.code"


def test_the_deps_writer_keeps_data_deps_and_comments(tmp_path: Path) -> None:
    repo = _package(
        tmp_path,
        {
            "lib/__init__.py": "",
            "lib/a.py": "from lib import b\n",
            "lib/b.py": "",
            "lib/c.py": "",
            "dvc.yaml": (
                "stages:\n"
                "  one:\n"
                "    meta:\n"
                "      code: [lib.a]\n"
                "    cmd: python -m lib.a\n"
                "    deps:  # why\n"
                "      - data/x.json\n"
                "      - lib/c.py   # stale\n"
                "      # a note\n"
                "      - models/m\n"
                "    outs:\n"
                "      - out\n"
            ),
        },
    )
    graph_tool.write_code_deps(repo)
    assert (
        graph_tool.expected_code_deps(repo)
        == graph_tool.listed_code_deps(repo)
        == {"one": ["lib/__init__.py", "lib/a.py", "lib/b.py"]}
    )
    text = (repo / "dvc.yaml").read_text()
    assert "data/x.json" in text and "models/m" in text and "# a note" in text and "lib/c.py" not in text


PACKAGE_ORDER: tuple[tuple[str, ...], ...] = (
    (
        "errors",
        "import_target",
        "seeding",
        "atomic",
        "logs",
        "config_base",
        "config_batch",
        "params_file",
        "images",
        "image_files",
    ),
    ("outputs", "splits", "progress_bar", "progress_line", "flow", "prompts"),
    ("parallel", "surrogate", "pairs", "advantages"),
    ("policy",),
    ("samplers", "losses", "rewards"),
    ("models",),
    ("algorithms", "checkpoints"),
    ("evaluation",),
    ("config", "training"),
    ("trainer", "counting_edit", "demo"),
    ("cli",),
    ("world",),
)
"""The library's packages and top-level modules from the bottom up: a module imports only from its own tier or
those below it (the run's config and the training loop share a tier: the schemas compose the loop's configs and
the loop reads the schemas). The world is the top: a wing the library never imports."""


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "vgrpo" and len(parts) > 1 else None


def _downhill_violations(graph: dict[str, set[str]]) -> list[str]:
    """``module -> imported`` for every import of a higher tier's module (lazy and type-checking ones included)."""
    tier = {name: i for i, names in enumerate(PACKAGE_ORDER) for name in names}
    out = []
    for module, deps in sorted(graph.items()):
        here = _package_of(module)
        for dep in sorted(deps):
            there = _package_of(dep)
            if here and there and tier.get(there, -1) > tier.get(here, len(tier)):
                out.append(f"{module} -> {dep}")
    return out


def test_every_import_in_the_library_runs_downhill() -> None:
    graph = graph_tool.import_graph(graph_tool.module_files(REPO))
    packages = {p for m in graph if (p := _package_of(m))}
    placed = {name for names in PACKAGE_ORDER for name in names}
    assert {"models", "rewards", "evaluation", "training"} <= packages  # the rule saw the packages it orders
    assert packages - placed == set(), "place each new package or module in PACKAGE_ORDER"
    assert _downhill_violations(graph) == []
    reader = {d for d in graph["vgrpo.params_file"] if d.startswith("vgrpo")}
    assert reader <= {"vgrpo", "vgrpo.errors"}  # the YAML reader knows no schema


TOP_ORDER: tuple[tuple[str, ...], ...] = (("vgrpo",), ("tasks",), ("flows", "services"), ("benchmarks",), ("tests",))
"""The repository's packages from the bottom up: the library; the units the pipeline runs; the flows composing them
and the servers the runs talk to; what measures them; the tests. A package imports only from its own tier or those
below it (the library imports none of the run layer)."""


def test_every_import_between_the_top_level_packages_runs_downhill() -> None:
    graph = graph_tool.import_graph(graph_tool.module_files(REPO))
    tier = {name: i for i, names in enumerate(TOP_ORDER) for name in names}
    assert {m.split(".")[0] for m in graph} == set(tier), "place each new top-level package in TOP_ORDER"
    upward = [
        f"{m} -> {d}"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if d.split(".")[0] in tier and tier[d.split(".")[0]] > tier[m.split(".")[0]]
    ]
    assert upward == []


def test_the_order_finds_an_uphill_import_between_library_packages(graph_of: Callable[..., Graph]) -> None:
    graph = graph_of(
        {
            "vgrpo/models/call.py": "from vgrpo.evaluation.evaluator import sample_noise\n",
            "vgrpo/evaluation/evaluator.py": "from vgrpo.seeding import x\n",
            "vgrpo/models/x.py": "def f():\n    from vgrpo.training import loop\n",  # a lazy import
            "vgrpo/rewards/y.py": "import typing\nif typing.TYPE_CHECKING:\n    from vgrpo.config import C\n",
        },
        empty=(
            "vgrpo/__init__.py",
            "vgrpo/seeding.py",
            "vgrpo/config.py",
            "vgrpo/models/__init__.py",
            "vgrpo/evaluation/__init__.py",
            "vgrpo/training/__init__.py",
            "vgrpo/training/loop.py",
            "vgrpo/rewards/__init__.py",
        ),
    )
    assert _downhill_violations(graph) == [
        "vgrpo.models.call -> vgrpo.evaluation.evaluator",
        "vgrpo.models.x -> vgrpo.training",
        "vgrpo.models.x -> vgrpo.training.loop",
        "vgrpo.rewards.y -> vgrpo.config",
    ]


MAX_MODULE_LINES = 350
"""No module of the library, the tasks, the flows, the services or the benchmarks is longer: a longer one holds more
than one idea."""
LONGER_MODULES: dict[str, int] = {}
"""Today's longer modules with their line counts as ceilings: they may shrink, not grow; none may join them."""


def test_no_module_is_longer_than_the_limit_and_the_allowed_ones_do_not_grow() -> None:
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
        for top in ("vgrpo", "tasks", "flows", "services", "benchmarks")
        for path in sorted((REPO / top).rglob("*.py"))
    }
    assert len(sizes) > 100 and "benchmarks/compare/claims.py" in sizes
    too_long = {p: n for p, n in sizes.items() if n > LONGER_MODULES.get(p, MAX_MODULE_LINES)}
    assert too_long == {}
    assert all(p in sizes for p in LONGER_MODULES)  # a module that was split leaves the list
