"""Rules that hold for every package of the distribution, checked with ``ast`` on the source
files (nothing is imported): no import cycle between modules, no module over 600 lines.

Module names come from ``pyproject.toml``'s ``package-dir`` (the directories are not named
like the packages: ``api/`` is ``sandpit.api``). An import counts when it runs at import
time: at module level, or in a class body; imports inside functions and under
``if TYPE_CHECKING:`` run later or never and cannot make a cycle at import time.
The per-package rules (layers, who may import what) are in each package's own
``test_import_rules.py``."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600


def package_dirs() -> dict[str, Path]:
    """``{"sandpit.api": ROOT / "api", ...}`` from ``pyproject.toml``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = config["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / path for name, path in dirs.items()}


def modules() -> dict[str, Path]:
    """Every installed module's name and file (a package: its ``__init__.py``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = package_dirs()
    found: dict[str, Path] = {}
    for package in config["tool"]["setuptools"]["packages"]:
        if package in dirs:
            folder = dirs[package]
        else:  # a subpackage laid out under its parent's directory
            parent = max((p for p in dirs if package.startswith(p + ".")), key=len)
            folder = dirs[parent].joinpath(*package[len(parent) + 1:].split("."))
        for path in folder.glob("*.py"):
            found[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
    return found


def _import_time_nodes(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run when the module is imported (not in functions, not under
    ``if TYPE_CHECKING``)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _import_time_nodes(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _import_time_nodes([n for n in inner if isinstance(n, ast.stmt)])
            if field == "handlers" and isinstance(inner, list):
                for handler in inner:
                    yield from _import_time_nodes(handler.body)


def import_time_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the distribution ``name`` imports at import time (``from p import x``
    counts as ``p.x`` when that is a module, else as ``p``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_time_nodes(tree.body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            targets = [f"{base_name}.{alias.name}" if f"{base_name}.{alias.name}" in known else base_name
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_is_found() -> None:
    found = modules()
    assert {"sandpit.api.app", "sandpit.executor.pool.pool", "sandpit.sandbox_images.runner.pid1_runner",
            "sandpit.client.rl", "sandpit.policy"} <= set(found)
    assert len(found) > 200


def test_no_import_cycle_between_modules() -> None:
    found = modules()
    known = set(found)
    graph = {name: import_time_imports(name, path, known) for name, path in found.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_function_level_import_does_not_count(tmp_path: Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text("import os\nif TYPE_CHECKING:\n    import sys\ndef f():\n    import json\n"
                    "class C:\n    from a import b\n")
    assert import_time_imports("probe", path, {"os", "sys", "json", "a", "a.b"}) == {"os", "a.b"}


def test_no_module_is_over_600_lines() -> None:
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
