"""The executor's boundaries as rules over the source (``ast``; no module is imported):

1. only ``executor/docker/`` imports the Docker SDK (``docker``), in every package the
   distribution installs;
2. ``api`` imports the executor only through its package face (``sandpit.executor``), and
   its schemas ``sandpit.executor.profiles`` (pure models), never a backend or ``pool``;
3. a backend folder (``docker/``, ``ray/``) imports only the contract (the top-level
   modules; ``config`` too: a Ray host builds its node's pool as the local backend) and
   ``pool/``, never the other backend; ``pool/`` imports no backend and not ``config``
   (which builds backends); the contract modules import no backend and not ``pool/``, and
   ``config`` and the package face import backends only inside functions (lazily);
4. no ``hasattr``/``getattr`` on an executor outside ``executor/``: capabilities are
   protocols checked with ``isinstance`` (``executor/interface.py``);
5. nothing in ``executor/`` imports ``sandpit.api``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE_DIRS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
EXECUTOR = ROOT / "executor"
BACKENDS = ("docker", "ray")
CONTRACT = {"errors", "interface", "profiles", "results", "settings"}
"""Top-level executor modules every part may import (``config`` builds backends; ``fake``
is a test double; the face re-exports)."""


def module_name(path: Path) -> str:
    """The installed name of ``path`` under the ``package-dir`` mapping (longest match)."""
    relative = path.relative_to(ROOT)
    package, directory = max(((p, d) for p, d in PACKAGE_DIRS.items()
                              if relative.parts[:len(Path(d).parts)] == Path(d).parts),
                             key=lambda item: len(Path(item[1]).parts))
    rest = list(relative.relative_to(directory).with_suffix("").parts)
    if rest[-1] == "__init__":
        rest.pop()
    return ".".join([package, *rest])


def sources() -> dict[str, Path]:
    """Every module of the installed packages (environments and EnvScaler data excluded)."""
    found: dict[str, Path] = {}
    for directory in {Path(d).parts[0] for d in PACKAGE_DIRS.values()}:
        for path in sorted((ROOT / directory).rglob("*.py")):
            if not {"environments", "envscaler"} & set(path.parts):
                found[module_name(path)] = path
    return found


MODULES = sources()


def imports(name: str, top_level_only: bool = False) -> set[str]:
    """Absolute names ``name`` imports outside ``if TYPE_CHECKING:`` (``from . import x``
    counts as ``package.x``: ``x`` may be a submodule); with ``top_level_only``, only the
    imports that run when the module is imported (not inside a function)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            in_function = True
        if not (top_level_only and in_function):
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
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(tree, False)
    return found


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def part_of_executor(name: str) -> str | None:
    """``docker``/``ray``/``pool`` for a module in those folders, the module's own name
    for a top-level executor module, None outside the executor."""
    if not under(name, "sandpit.executor") or name == "sandpit.executor":
        return None
    return name.split(".")[2]


EXECUTOR_MODULES = sorted(m for m in MODULES if under(m, "sandpit.executor"))
SUBMODULES = {path.stem if path.suffix else path.name for path in EXECUTOR.iterdir()
              if path.name != "__init__.py" and (path.suffix == ".py" or (path / "__init__.py").exists())}


def test_the_layout_is_as_documented() -> None:
    assert {"pool", "docker", "ray", "config", "interface", "errors", "fake"} <= SUBMODULES
    for backend in (*BACKENDS, "pool"):
        assert any(m.startswith(f"sandpit.executor.{backend}.") for m in MODULES), backend
    assert "sandpit.policy" in MODULES and "sandpit.api.scheduler" in MODULES and "sandpit.demo" in MODULES


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_the_docker_folder_imports_the_docker_sdk(name: str) -> None:
    if under(name, "sandpit.executor.docker"):
        return
    assert not {i for i in imports(name) if under(i, "docker")}, f"{name} imports the Docker SDK"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if under(m, "sandpit.api")))
def test_the_api_imports_only_the_executors_face(name: str) -> None:
    allowed = {"sandpit.executor", "sandpit.executor.profiles"} if under(name, "sandpit.api.schemas") \
        else {"sandpit.executor"}
    found = {i for i in imports(name) if under(i, "sandpit.executor")}
    # ``from <allowed> import X`` is allowed unless X is a submodule (a backend, pool...)
    bad = {i for i in found if i not in allowed and not (i.rpartition(".")[0] in allowed
                                                           and i.rpartition(".")[2] not in SUBMODULES)}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", EXECUTOR_MODULES)
def test_backends_import_only_the_contract_and_the_pool(name: str) -> None:
    part = part_of_executor(name)
    reached = {p for p in (part_of_executor(i) for i in imports(name)) if p is not None and p != part}
    if part in BACKENDS:
        allowed = CONTRACT | {"pool", "config"}
    elif part == "pool":
        allowed = CONTRACT
    elif part in CONTRACT:
        allowed = CONTRACT
    else:
        return  # the face, config (checked below) and the fake
    assert reached <= allowed, f"{name} imports executor parts {sorted(reached - allowed)}"


def test_config_imports_its_backends_only_when_building() -> None:
    eager = {part_of_executor(i) for i in imports("sandpit.executor.config", top_level_only=True)}
    assert not eager & {*BACKENDS, "pool"}
    lazy = {part_of_executor(i) for i in imports("sandpit.executor.config")}
    assert set(BACKENDS) <= lazy  # the rule is not vacuous: build() does import them


def test_the_face_imports_no_backend_when_imported() -> None:
    eager = {part_of_executor(i) for i in imports("sandpit.executor", top_level_only=True)}
    assert not eager & set(BACKENDS)


@pytest.mark.parametrize("name", sorted(m for m in MODULES if not under(m, "sandpit.executor")))
def test_no_capability_probing_on_an_executor_outside_the_executor(name: str) -> None:
    tree = ast.parse(MODULES[name].read_text())
    probes = [f"{MODULES[name].relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}"
              for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("hasattr", "getattr") and node.args
              and "executor" in ast.unparse(node.args[0]).lower()]
    assert not probes, "use the capability protocols (isinstance): " + "; ".join(probes)


@pytest.mark.parametrize("name", EXECUTOR_MODULES)
def test_the_executor_never_imports_the_api(name: str) -> None:
    assert not {i for i in imports(name) if under(i, "sandpit.api")}, f"{name} imports sandpit.api"


def test_the_rules_see_what_they_forbid(tmp_path: Path) -> None:
    """The checker itself: relative and lazy imports resolve, TYPE_CHECKING is skipped,
    a probe is seen."""
    assert "sandpit.executor.pool.driver.SandboxHandle" in imports("sandpit.executor.pool.pool")
    assert "sandpit.executor.docker" in imports("sandpit.executor.config")
    assert "sandpit.executor.docker" not in imports("sandpit.executor.config", top_level_only=True)
    assert "sandpit.executor.ray.executor" not in imports("sandpit.executor.ray.session")  # TYPE_CHECKING only
    assert module_name(ROOT / "cli" / "demo.py") == "sandpit.demo"
    assert module_name(ROOT / "executor" / "docker" / "__init__.py") == "sandpit.executor.docker"
    probe = ast.parse("if hasattr(self.sandboxes.executor, 'drain'): pass").body[0]
    call = probe.test  # type: ignore[attr-defined]
    assert isinstance(call, ast.Call) and "executor" in ast.unparse(call.args[0])
