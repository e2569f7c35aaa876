"""The import rules of ``sandpit.api`` (stated in ``api/__init__.py``), checked with ``ast``
on the source files: no module is imported, so this runs in milliseconds."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[3] / "api"
SELF_NAMES = {"self", "cls"}


def module_name(path: Path) -> str:
    """``api/routes/envs.py`` -> ``sandpit.api.http.routes.envs`` (packages: their ``__init__``)."""
    parts = list(path.relative_to(API).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["sandpit", "api", *parts])


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, as absolute names (``from . import x`` counts as
    ``package.x``, since ``x`` may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(path)
    package = name if is_package(path) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def private_reaches(path: Path) -> list[str]:
    """``x._name`` attribute reads where ``x`` is not ``self``/``cls`` (dunders allowed)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in SELF_NAMES)):
            out.append(f"{path.relative_to(API.parent)}:{node.lineno}: .{node.attr}")
    return out


MODULES = {module_name(p): p for p in sorted(API.rglob("*.py"))}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def sandpit_imports(name: str) -> set[str]:
    return {i for i in imports(MODULES[name]) if under(i, "sandpit")}


def modules_in(package: str) -> list[str]:
    return [m for m in MODULES if under(m, f"sandpit.api.{package}")]


def test_the_tree_is_as_documented() -> None:
    for package in ("http.routes", "schemas", "services", "envs", "evaluations", "db"):
        assert f"sandpit.api.{package}" in MODULES, package
    assert "sandpit.api.sandboxes" in MODULES and "sandpit.api.app" in MODULES


@pytest.mark.parametrize("name", modules_in("http.routes"))
def test_routes_import_deps_schemas_services_and_envs_only(name: str) -> None:
    allowed = ("sandpit.api.http.deps", "sandpit.api.schemas", "sandpit.api.services", "sandpit.api.envs", "sandpit.api.http.routes")
    bad = {i for i in sandpit_imports(name) if not any(under(i, a) for a in allowed)}
    assert not bad, f"{name} imports {sorted(bad)}"


def test_only_the_adapter_and_the_app_factory_import_the_executor() -> None:
    """Schemas may take the executor's pure profile models (``sandpit.executor.profiles``)."""
    importers = {name for name in MODULES
                 if any(under(i, "sandpit.executor") and not under(i, "sandpit.executor.profiles")
                        for i in sandpit_imports(name))}
    assert importers == {"sandpit.api.sandboxes", "sandpit.api.app"}
    profiles = {name for name in MODULES if any(under(i, "sandpit.executor.profiles") for i in sandpit_imports(name))}
    assert profiles <= {"sandpit.api.sandboxes", "sandpit.api.app", *modules_in("schemas")}


@pytest.mark.parametrize("name", modules_in("schemas"))
def test_schemas_import_no_services_db_or_routes(name: str) -> None:
    bad = {i for i in sandpit_imports(name)
           if any(under(i, f"sandpit.api.{p}") for p in ("services", "db", "http", "app"))}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", modules_in("db"))
def test_db_imports_no_routes_services_or_evaluations(name: str) -> None:
    bad = {i for i in sandpit_imports(name)
           if any(under(i, f"sandpit.api.{p}") for p in ("http", "services", "evaluations", "app"))}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_api_module_imports_the_clients_of_the_api(name: str) -> None:
    bad = {i for i in sandpit_imports(name)
           if (under(i, "sandpit.client") and not under(i, "sandpit.client.llm")) or under(i, "sandpit.importers")}
    assert not bad, f"{name} imports {sorted(bad)}"


def test_no_module_reaches_into_another_objects_privates() -> None:
    reaches = [r for p in MODULES.values() for r in private_reaches(p)]
    assert not reaches, "\n".join(reaches)


def test_loading_the_settings_loads_no_executor_no_runner_and_no_fastapi() -> None:
    """``import sandpit.api.settings`` in a fresh interpreter: the foundation stands alone
    (a CLI command reading one setting must not load the executor, the sandbox runner's
    modules or the web framework)."""
    probe = ("import json, sys, sandpit.api.settings; "
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('sandpit', 'fastapi', 'starlette')))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                       text=True, timeout=60).stdout)
    assert "sandpit.api.settings" in loaded  # the probe did load it
    bad = [m for m in loaded if under(m, "sandpit.executor") or under(m, "sandpit.sandbox_images")
           or under(m, "fastapi") or under(m, "starlette")]
    assert not bad, bad


def test_the_rules_catch_what_they_forbid(tmp_path: Path) -> None:
    """The checker itself: relative imports resolve, private reaches are seen."""
    route = API / "http" / "routes" / "envs.py"
    assert "sandpit.api.http.deps" in imports(route)
    assert "sandpit.api.schemas.envs" in imports(route)
    probe = API / "http" / "routes" / "_probe_for_test.py"
    assert module_name(probe) == "sandpit.api.http.routes._probe_for_test"
    sample = tmp_path / "sample.py"
    sample.write_text("def f(service):\n    return service._db, self._ok\n")
    tree = ast.parse(sample.read_text())
    attrs = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    assert "_db" in attrs
