"""The `specc` package has no import cycles, and only the command line imports `specc/commands/`.

The import graph is built statically with `ast` over every ``.py`` file under
``specc/``: each `import x` and `from x import y` anywhere in a module (top
level, inside functions, inside ``if TYPE_CHECKING`` blocks alike: a lazy
import that closes a cycle is still a cycle) becomes an edge from the module to
the `specc` module it names. ``from pkg import mod`` resolves to the submodule
``pkg.mod`` when ``pkg/mod.py`` (or ``pkg/mod/__init__.py``) exists, to the
package ``pkg`` (its ``__init__``) otherwise; relative imports are resolved
against the importing module's package. A package ``__init__`` is its own node.

Every elementary cycle (networkx `simple_cycles`) is reported, one per line.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "specc"


def _module_files(root: Path) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under ``root/specc``."""
    out: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _resolve_base(module: str, level: int, target: str | None,
                  modules: dict[str, Path]) -> str:
    """The absolute dotted name of a (possibly relative) ``from`` target."""
    if level == 0:
        return target or ""
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    parts = package.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{target}" if target else base


def _owning_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is a module of the package."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_edges(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the `specc` modules it imports (self-imports dropped)."""
    modules = _module_files(root)
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_base(module, node.level, node.module, modules)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                if target != PACKAGE and not target.startswith(PACKAGE + "."):
                    continue
                owner = _owning_module(target, modules)
                if owner is not None and owner != module:
                    edges[module].add(owner)
    return edges


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Every elementary cycle of the import graph, each rotated to start at
    its smallest module name, sorted."""
    graph = nx.DiGraph()
    for module, targets in import_edges(root).items():
        graph.add_node(module)
        graph.add_edges_from((module, t) for t in targets)
    cycles = []
    for cycle in nx.simple_cycles(graph):
        i = cycle.index(min(cycle))
        cycles.append(cycle[i:] + cycle[:i])
    return sorted(cycles, key=lambda c: (len(c), c))


def test_graph_sees_the_package():
    """The walker finds the package's modules and real edges (so an empty
    cycle list is not an empty graph)."""
    edges = import_edges()
    assert "specc" in edges and "specc.cli" in edges
    assert sum(len(v) for v in edges.values()) > 100


def test_walker_finds_a_planted_cycle(tmp_path):
    """A lazy relative import that closes a loop, and a `from pkg import mod`
    edge, are both seen."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from specc.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "def f():\n    from ..c import g\n    return g\n")
    (pkg / "c.py").write_text("import specc.a as _a\ndef g():\n    return _a\n")
    (pkg / "d.py").write_text("from . import sub\n")
    assert import_cycles(tmp_path) == [["specc.a", "specc.sub.b", "specc.c"]]
    assert import_edges(tmp_path)["specc.d"] == {"specc.sub"}


def test_no_import_cycles():
    cycles = import_cycles()
    if cycles:
        lines = "\n".join(" -> ".join(c + [c[0]]) for c in cycles)
        pytest.fail(f"{len(cycles)} import cycle(s) in specc/:\n{lines}")


def test_only_the_command_line_imports_the_commands():
    """`specc/commands/` is the command-line layer: the library (plan, check, predict, compiler, runtime,
    methods, engines, tune, ...) never imports it, so everything a command does is callable without it."""
    front = ("specc.commands", "specc.cli")
    wrong = sorted(f"{m} -> {t}" for m, targets in import_edges().items()
                   if not m.startswith(front) and m != PACKAGE
                   for t in targets if t.startswith("specc.commands"))
    assert not wrong, "library modules import the command-line layer:\n" + "\n".join(wrong)
