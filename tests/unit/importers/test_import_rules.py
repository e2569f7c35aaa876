"""Importers are API clients: every module under `importers/` imports only the standard
library, pydantic, ijson (streamed JSON) and `sandpit.client` (besides its own package), never the server
(`sandpit.api`), the sandboxes (`sandpit.executor`, `sandpit.sandbox_images`) or anything
else, and imports nothing dynamically. Read with `ast`: nothing is imported to check."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import sandpit.importers

ROOT = Path(sandpit.importers.__file__).resolve().parent
PACKAGE = "sandpit.importers"
ALLOWED_THIRD_PARTY = {"pydantic", "ijson"}
ALLOWED_SANDPIT = ("sandpit.client",)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import anywhere in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                found.append((".".join(base + ([node.module] if node.module else [])), node.lineno))
            else:
                found.append((node.module or "", node.lineno))
    return found


def _dynamic_imports(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in ("__import__", "import_module"):
                lines.append(node.lineno)
    return lines


def _allowed(name: str) -> bool:
    top = name.partition(".")[0]
    if top == "sandpit":
        return name == PACKAGE or name.startswith(PACKAGE + ".") or any(
            name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED_SANDPIT)
    return top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY or top == "__future__"


def test_importers_import_only_the_client_the_stdlib_and_pydantic() -> None:
    files = sorted(ROOT.rglob("*.py"))
    assert {f.relative_to(ROOT).as_posix() for f in files} >= {"envscaler.py", "bfcl/__init__.py", "bfcl/wheel.py"}
    offending = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                 for path in files for name, line in _imports(path) if not _allowed(name)]
    offending += [f"{path.relative_to(ROOT)}:{line} imports dynamically"
                  for path in files for line in _dynamic_imports(path)]
    assert offending == []


def test_the_rule_catches_server_imports() -> None:
    assert not _allowed("sandpit.api.bfcl") and not _allowed("sandpit.policy")
    assert not _allowed("sandpit.sandbox_images.runner.render") and not _allowed("httpx")
    assert _allowed("sandpit.client") and _allowed("sandpit.client.models") and _allowed("json")
    assert _allowed("sandpit.importers.bfcl.wheel") and _allowed("pydantic")
