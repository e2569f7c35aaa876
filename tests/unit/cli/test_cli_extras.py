"""``sandpit.cli_extras`` against ``pyproject.toml`` and the installed distributions (the dev
venv has every extra): each mapped package belongs to its extra and not to the default
install, and every package the project's modules import is either in the default install
or mapped, so a command never meets a missing module it cannot name the extra of."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
import typer
from packaging.requirements import Requirement
from sandpit.cli_extras import EXTRA_OF_MODULE, extra_for, fail_missing, missing_message

ROOT = Path(__file__).resolve().parents[3]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
HOST_DIRS = ("cli", "client", "api", "executor", "policy", "synthesis", "importers", "migrations")
"""Code that runs on the host; sandbox_images/ runs inside sandboxes (its imports are the image's)."""


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _closure(requirements: list[str], extras: tuple[str, ...] = ()) -> frozenset[str]:
    """Distributions (normalised names) that installing ``requirements`` brings in."""
    found: set[str] = set()
    todo = [(Requirement(r), extras) for r in requirements]
    while todo:
        requirement, via = todo.pop()
        if requirement.marker is not None and not any(
                requirement.marker.evaluate({"extra": extra}) for extra in (via or ("",))):
            continue
        name = _name(requirement.name)
        if name == "sandpit":
            for extra in requirement.extras:
                todo += [(Requirement(r), ()) for r in PROJECT["optional-dependencies"][extra]]
            continue
        if name in found and not requirement.extras:
            continue
        found.add(name)
        todo += [(Requirement(r), tuple(requirement.extras)) for r in metadata.requires(requirement.name) or []]
    return frozenset(found)


@cache
def core() -> frozenset[str]:
    return _closure(PROJECT["dependencies"])


@cache
def extra(name: str) -> frozenset[str]:
    return _closure(PROJECT["optional-dependencies"][name])


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


@pytest.mark.parametrize(("module", "extra_name"), sorted(EXTRA_OF_MODULE.items()))
def test_each_mapped_package_comes_with_its_extra_and_not_the_default_install(module: str, extra_name: str) -> None:
    dists = {_name(d) for d in metadata.packages_distributions().get(module, [])}
    assert dists, f"{module} is not installed in the dev venv"
    assert dists & extra(extra_name), f"{module} ({dists}) is not installed by sandpit[{extra_name}]"
    assert not dists & core(), f"{module} ({dists}) comes with the default install: no extra to name"


def test_every_package_the_host_code_imports_is_in_the_default_install_or_mapped() -> None:
    distributions = metadata.packages_distributions()
    unmapped: dict[str, list[str]] = {}
    for folder in HOST_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            for module in _imports(path) - set(sys.stdlib_module_names) - {"sandpit", "__future__"}:
                dists = {_name(d) for d in distributions.get(module, [])}
                if module not in EXTRA_OF_MODULE and not dists & core():
                    unmapped.setdefault(module, []).append(str(path.relative_to(ROOT)))
    assert not unmapped, f"imported, not in the default install, and no extra named in EXTRA_OF_MODULE: {unmapped}"


def test_the_default_install_is_the_client() -> None:
    assert {"httpx", "pydantic", "tenacity", "typer", "rich"} <= core()
    assert not {"docker", "fastapi", "sqlalchemy", "alembic", "restrictedpython", "uvicorn", "cryptography",
                "openai", "gymnasium"} & core()
    for name in ("postgres", "ray", "dev"):  # they run or test the server
        assert {"docker", "fastapi", "sqlalchemy"} <= extra(name)


def test_the_answer_is_one_line_with_the_brackets_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    exc = ModuleNotFoundError("No module named 'docker'", name="docker.errors")
    assert extra_for(exc) == "server"
    with pytest.raises(typer.Exit) as info:
        fail_missing("serve", exc)
    assert info.value.exit_code == 1
    assert capsys.readouterr().err == ("error: `sandpit serve` needs the 'server' extra (docker is not installed): "
                                       "pip install 'sandpit[server]'\n")
    assert missing_message("", ModuleNotFoundError(name="gymnasium")) == (
        "error: this command needs the 'rl' extra (gymnasium is not installed): pip install 'sandpit[rl]'")


@pytest.mark.parametrize("name", [None, "", "sandpit.executor", "no_such_package", "docker_", "."])
def test_a_module_no_extra_provides_is_raised_as_it_is(name: str | None) -> None:
    exc = ModuleNotFoundError("No module named x", name=name)
    assert extra_for(exc) is None and missing_message("serve", exc) is None
    with pytest.raises(ModuleNotFoundError) as info:
        fail_missing("serve", exc)
    assert info.value is exc
