"""The import rules of ``sandpit.api`` (stated in ``api/__init__.py``), checked with ``ast``
on the source files: no module is imported, so this runs in milliseconds (but for the one
test that loads the settings in a fresh interpreter)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[3] / "api"
SELF_NAMES = {"self", "cls"}
LAYERS: list[tuple[str, ...]] = [
    ("settings", "errors", "metrics", "secrets", "json_rules"),  # the foundation
    ("schemas", "db"),  # the contract and persistence
    ("sandboxes", "scheduler"),  # the executor seam
    ("services",),  # registries: environments, scenarios, tenants, quotas, execution, ...
    ("envs",),  # an env's lifecycle
    ("evaluations",),  # batch jobs over the env verbs
    ("http",),  # the only HTTP code
    ("app",),  # the composition root
]
"""The layers of ``sandpit.api``, lowest first: a module imports only from its own layer
and those below it."""


def module_name(path: Path) -> str:
    """``api/http/routes/envs.py`` -> ``sandpit.api.http.routes.envs`` (packages: their ``__init__``)."""
    parts = list(path.relative_to(API).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["sandpit", "api", *parts])


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, as absolute names (``from . import x`` counts as
    ``package.x``, since ``x`` may be a submodule); imports inside functions and under
    ``TYPE_CHECKING`` included."""
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


def api_modules_imported(name: str) -> set[str]:
    """The modules of ``sandpit.api`` that ``name`` imports (a name imported from a module
    counts as that module; packages as themselves)."""
    out = set()
    for imported in sandpit_imports(name):
        while imported not in MODULES and "." in imported:
            imported = imported.rpartition(".")[0]
        if imported in MODULES and imported != "sandpit.api":
            out.add(imported)
    return out


def modules_in(package: str) -> list[str]:
    return [m for m in MODULES if under(m, f"sandpit.api.{package}")]


def layer_of(name: str) -> int:
    """The index in :data:`LAYERS` of module ``name`` (``sandpit.api`` itself: -1)."""
    if name == "sandpit.api":
        return -1
    top = name.split(".")[2]
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    raise AssertionError(f"{name} is in no layer: add it to LAYERS and to api/__init__.py's map")


def test_the_tree_is_as_documented() -> None:
    for package in ("http.routes", "schemas", "services", "envs", "evaluations", "db"):
        assert f"sandpit.api.{package}" in MODULES, package
    for module in ("sandboxes", "app", "settings", "errors", "metrics", "secrets", "json_rules", "http.step"):
        assert f"sandpit.api.{module}" in MODULES, module
    doc = (API / "__init__.py").read_text()
    for name in MODULES:
        top = name.split(".")[2] if name != "sandpit.api" else None
        if top is not None:
            assert f"{top}" in doc, f"api/__init__.py's map does not name {top}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports_from_its_layer_and_below_only(name: str) -> None:
    mine = layer_of(name)
    upward = {i for i in api_modules_imported(name) if layer_of(i) > mine}
    assert not upward, f"{name} (layer {LAYERS[mine]}) imports from above: {sorted(upward)}"


@pytest.mark.parametrize("name", modules_in("schemas") + modules_in("db"))
def test_the_contract_and_persistence_do_not_import_each_other(name: str) -> None:
    other = "db" if under(name, "sandpit.api.schemas") else "schemas"
    bad = {i for i in api_modules_imported(name) if under(i, f"sandpit.api.{other}")}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", modules_in("http.routes"))
def test_routes_import_deps_schemas_services_and_envs_only(name: str) -> None:
    allowed = ("sandpit.api.http.deps", "sandpit.api.schemas", "sandpit.api.services", "sandpit.api.envs",
               "sandpit.api.http.routes")
    bad = {i for i in sandpit_imports(name) if not any(under(i, a) for a in allowed)}
    assert not bad, f"{name} imports {sorted(bad)}"


def test_only_the_seam_and_the_app_import_the_executor() -> None:
    """Schemas may take the executor's pure profile models (``sandpit.executor.profiles``)."""
    importers = {name for name in MODULES
                 if any(under(i, "sandpit.executor") and not under(i, "sandpit.executor.profiles")
                        for i in sandpit_imports(name))}
    assert importers <= {"sandpit.api.sandboxes", "sandpit.api.scheduler", "sandpit.api.app"}
    assert {"sandpit.api.sandboxes", "sandpit.api.app"} <= importers
    profiles = {name for name in MODULES if any(under(i, "sandpit.executor.profiles") for i in sandpit_imports(name))}
    assert profiles <= {"sandpit.api.sandboxes", "sandpit.api.scheduler", "sandpit.api.app", *modules_in("schemas")}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_api_module_imports_the_clients_of_the_api(name: str) -> None:
    bad = {i for i in sandpit_imports(name)
           if (under(i, "sandpit.client") and not under(i, "sandpit.client.llm")) or under(i, "sandpit.importers")}
    assert not bad, f"{name} imports {sorted(bad)}"


def test_only_http_and_the_app_import_the_web_framework() -> None:
    web = ("fastapi", "starlette", "uvicorn")
    importers = {name for name, path in MODULES.items() if any(under(i, w) for i in imports(path) for w in web)}
    assert importers == {n for n in importers if under(n, "sandpit.api.http") or n == "sandpit.api.app"}
    assert "sandpit.api.http.step" in importers


def test_no_import_cycle() -> None:
    graph = {name: api_modules_imported(name) - {name} for name in MODULES}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_no_module_reaches_into_another_objects_privates() -> None:
    reaches = [r for p in MODULES.values() for r in private_reaches(p)]
    assert not reaches, "\n".join(reaches)


def test_no_module_is_over_600_lines() -> None:
    sizes = {name: path.read_text().count("\n") for name, path in MODULES.items()}
    assert not {name: size for name, size in sizes.items() if size > 600}


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
    """The checker itself: relative imports resolve, layers rank, private reaches are seen."""
    route = API / "http" / "routes" / "envs.py"
    assert "sandpit.api.http.deps" in imports(route)
    assert "sandpit.api.schemas.envs" in imports(route)
    assert api_modules_imported("sandpit.api.http.routes.envs") >= {"sandpit.api.http.deps", "sandpit.api.schemas.envs"}
    probe = API / "http" / "routes" / "_probe_for_test.py"
    assert module_name(probe) == "sandpit.api.http.routes._probe_for_test"
    assert layer_of("sandpit.api.settings") < layer_of("sandpit.api.db.store") < layer_of("sandpit.api.sandboxes") \
        < layer_of("sandpit.api.services.quotas") < layer_of("sandpit.api.envs.steps") \
        < layer_of("sandpit.api.evaluations.runner") < layer_of("sandpit.api.http.step") < layer_of("sandpit.api.app")
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("sandpit.api.newcomer")
    sample = tmp_path / "sample.py"
    sample.write_text("def f(service):\n    return service._db, self._ok\n")
    tree = ast.parse(sample.read_text())
    attrs = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    assert "_db" in attrs
