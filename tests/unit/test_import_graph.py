"""The import graph, read from the source: no cycle among the modules of ``hf_hsap`` or of ``benchmarks`` (imports
at module level and inside functions, ``TYPE_CHECKING`` ones included, relative ones resolved), and every module of
``hf_hsap`` under a layer of the import contract (``.importlinter``, which ``test_import_contract.py`` checks); the
unit tests import no ``benchmarks`` module (the tests that check the library against a benchmark tool live under
``tests/benchmarks``)."""
from __future__ import annotations

import ast
import configparser
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def module_files(package: str) -> dict[str, pathlib.Path]:
    """Every module of a package directory under the repository root, by dotted name (a package by its
    ``__init__.py``)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _known(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules`` (``a.b.func`` -> ``a.b``), else None."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def imports_of(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The modules of ``modules`` that ``name`` imports, anywhere in its source.

    ``from X import y`` is an edge to ``X.y`` where that is a module, else to ``X``; a relative import is resolved
    against the module's package. Importing ``a.b`` is not counted as importing the package ``a`` (every module would
    then import its package's ``__init__``, which imports it back).
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {_known(a.name, modules) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found |= {_known(f"{base}.{a.name}" if base else a.name, modules) for a in node.names}
    return found - {None, name}


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = module_files(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each as the shortest cycle
    through every one of its modules (``[a, b, ..., a]``, starting at its first module; each cycle once), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = set()
    for comp in components:
        for start in comp:
            cycle = _cycle_through(graph, comp, start)[:-1]
            first = cycle.index(min(cycle))
            found.add(tuple(cycle[first:] + cycle[:first] + [cycle[first]]))
    return sorted(list(c) for c in found)


def _cycle_through(graph: dict[str, set[str]], comp: set[str], start: str) -> list[str]:
    """A shortest cycle through ``start`` (breadth first, inside its component)."""
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in its component")


def test_the_cycle_finder_finds_cycles_and_only_them():
    """The finder on hand-made graphs: a three-module cycle, a two-module one and a chain without any."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"d"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    graph["b"].add("a")  # a second cycle through a and b: each module's shortest one is listed
    assert cycles(graph) == [["a", "b", "a"], ["a", "b", "c", "a"], ["e", "f", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_reads_every_kind_of_import(tmp_path, monkeypatch):
    """Function-level, TYPE_CHECKING and relative imports (``from . import m``, ``from ..pkg.m import name``) are
    edges; a name imported from a module is an edge to the module."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n    return b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n")
    (pkg / "c.py").write_text("import p.sub.b\nfrom . import a\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    graph = import_graph("p")
    assert graph == {"p": {"p.a"}, "p.a": {"p.sub.b"}, "p.sub": set(), "p.sub.b": {"p.c"}, "p.c": {"p.sub.b", "p.a"}}
    assert cycles(graph) == [["p.a", "p.sub.b", "p.c", "p.a"], ["p.c", "p.sub.b", "p.c"]]


@pytest.mark.parametrize("package", ["hf_hsap", "benchmarks"])
def test_no_import_cycle(package):
    """No module of the package imports, directly or through others, a module that imports it back."""
    found = cycles(import_graph(package))
    assert not found, f"{len(found)} import cycle(s) in {package}/:\n" + "\n".join(" -> ".join(c) for c in found)


def contract_layers() -> set[str]:
    """The modules the layers contract of ``.importlinter`` names (``hf_hsap.<name>``)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    (contract,) = [s for s in cfg.sections() if cfg.get(s, "type", fallback="") == "layers"
                   and cfg.get(s, "containers", fallback="").split() == ["hf_hsap"]]
    return {name.strip() for name in re.split(r"[|:\n]", cfg.get(contract, "layers")) if name.strip()}


def test_every_module_is_in_a_layer_of_the_contract():
    """Every module of hf_hsap falls under a layer of the contract (so lint-imports checks its imports), and every
    layer the contract names exists."""
    layers = contract_layers()
    modules = set(module_files("hf_hsap")) - {"hf_hsap"}
    tops = {m.split(".")[1] for m in modules}
    assert not tops - layers, f"modules outside the contract's layers: {sorted(tops - layers)}"
    assert not layers - tops, f"layers naming no module of hf_hsap: {sorted(layers - tops)}"


READS_BENCHMARKS_GRAPH = {"test_import_contract.py", "test_import_graph.py"}  # name the package, never import it


def imported_packages(source: str) -> set[str]:
    """Top-level packages a source imports, anywhere in it (relative imports left out)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_unit_tests_import_no_benchmarks():
    """No file under ``tests/unit`` imports ``benchmarks`` (at module level or inside a function), but the two that
    read its import graph from the source."""
    assert {"benchmarks", "numpy"} <= imported_packages(
        "import numpy\ndef f():\n    from benchmarks.analytic.sweep import SweepConfig\n")
    assert "benchmarks" in imported_packages("import benchmarks.suites.core as core\n")
    assert "benchmarks" not in imported_packages("from .benchmarks import x\nfrom hf_hsap import benchmarks\n")
    files = sorted((ROOT / "tests" / "unit").rglob("*.py"))
    assert READS_BENCHMARKS_GRAPH <= {f.name for f in files}
    offending = [str(f.relative_to(ROOT)) for f in files
                 if f.name not in READS_BENCHMARKS_GRAPH and "benchmarks" in imported_packages(f.read_text())]
    assert offending == [], f"unit tests importing benchmarks (move them under tests/benchmarks): {offending}"
