"""Every field of every settings class is on the settings page (``docs/settings.md``), so the
page cannot drift from the code.

The classes are found, not listed: every module of the packages ``pyproject.toml`` maps
(``[tool.setuptools] package-dir``) whose source defines a subclass of pydantic-settings'
``BaseSettings`` (directly or through another such class) is imported, and its classes'
fields are read with pydantic's ``model_fields``; no server is needed. A field is on the
page when its environment variable is (``env_prefix`` + name, upper case); with an
``env_nested_delimiter`` the fields of a nested model are variables of their own
(``SANDPIT_QUOTAS__MAX_LIVE_ENVS``); a nested model given as JSON (no delimiter) has its
field names on the page in backticks (the fields of a resource profile).
"""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "settings.md"
NAMED_IN_THE_BRIEF = {"ApiSettings", "ExecutorSettings", "ImageSettings", "SynthSettings"}


def package_dirs(root: Path) -> dict[str, Path]:
    """``import name -> directory`` from ``pyproject.toml``'s ``package-dir``."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: root / directory for name, directory in mapping.items()}


def module_name(dirs: dict[str, Path], file: Path) -> str:
    """The import name of ``file``: the longest mapped directory holding it, plus the rest
    of its path."""
    package, directory = max(((name, d) for name, d in dirs.items() if file.is_relative_to(d)),
                             key=lambda item: len(item[1].parts))
    rest = file.relative_to(directory).with_suffix("").parts
    return ".".join((package, *(part for part in rest if part != "__init__")))


def settings_class_names(source: str, known: set[str]) -> set[str]:
    """Module-level classes of ``source`` that derive from ``BaseSettings`` or from a class in
    ``known`` (by the base's last name: ``BaseSettings``, ``pydantic_settings.BaseSettings``)."""
    found: set[str] = set()
    bases_of = {node.name: node.bases for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    changed = True
    while changed:  # a class may derive from one defined further down, or from another found here
        changed = False
        for name, bases in bases_of.items():
            names = {base.id if isinstance(base, ast.Name) else base.attr
                     for base in bases if isinstance(base, ast.Name | ast.Attribute)}
            if name not in found and names & ({"BaseSettings"} | known | found):
                found.add(name)
                changed = True
    return found


def settings_classes(root: Path) -> list[type[BaseSettings]]:
    """Every settings class defined in the packages (see the module docstring)."""
    dirs = package_dirs(root)
    sources = {file: file.read_text() for directory in set(dirs.values()) for file in directory.rglob("*.py")}
    names: dict[Path, set[str]] = {}
    known: set[str] = set()
    while True:  # classes deriving from a settings class of another module
        names = {file: settings_class_names(source, known) for file, source in sources.items()}
        everything = set().union(*names.values())
        if everything <= known:
            break
        known |= everything
    classes = []
    for file, defined in sorted(names.items()):
        if defined:
            module = importlib.import_module(module_name(dirs, file))
            classes += [getattr(module, name) for name in sorted(defined)]
    return classes


def _models(annotation: object) -> Iterator[type[BaseModel]]:
    """Pydantic models inside a field's annotation (``X``, ``X | None``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models(argument)


def documented_names(cls: type[BaseSettings]) -> list[str]:
    """What the page must hold for ``cls``: its environment variables, and the backticked
    field names of the models it takes as JSON."""
    prefix = str(cls.model_config.get("env_prefix") or "")
    delimiter = cls.model_config.get("env_nested_delimiter")
    names: list[str] = []

    def visit(variable: str, annotation: object) -> None:
        names.append(variable)
        for model in _models(annotation):
            for field_name, field in model.model_fields.items():
                if delimiter:
                    visit(f"{variable}{delimiter}{field_name.upper()}", field.annotation)
                else:
                    names.append(f"`{field_name}`")

    for name, field in cls.model_fields.items():
        alias = field.validation_alias if isinstance(field.validation_alias, str) else None
        visit(alias.upper() if alias else f"{prefix}{name}".upper(), field.annotation)
    return list(dict.fromkeys(names))


def missing_from(page: str, names: list[str]) -> list[str]:
    """``names`` the page does not hold: a variable as a whole word, a backticked name as it is."""
    return [name for name in names
            if (name not in page if name.startswith("`")
                else re.search(rf"(?<![A-Z0-9_]){re.escape(name)}(?![A-Z0-9_])", page) is None)]


def test_every_settings_field_is_on_the_settings_page() -> None:
    classes = settings_classes(ROOT)
    assert NAMED_IN_THE_BRIEF <= {cls.__name__ for cls in classes}, classes
    page = PAGE.read_text()
    missing = {cls.__qualname__: gone for cls in classes if (gone := missing_from(page, documented_names(cls)))}
    assert missing == {}, f"not on {PAGE.relative_to(ROOT)}: {missing}"


class _Limits(BaseModel):
    max_items: int = 1
    nested: _Inner | None = None


class _Inner(BaseModel):
    depth_mib: int = 1


_Limits.model_rebuild()


class _Probe(BaseSettings):
    """A settings class with a nested model under a delimiter, and one given as JSON."""

    model_config = SettingsConfigDict(env_prefix="PROBE_", env_nested_delimiter="__")

    port: int = 1
    limits: _Limits = Field(default_factory=_Limits)


class _JsonProbe(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JSONPROBE_")

    profiles: dict[str, _Inner] = Field(default_factory=dict)
    renamed: str = Field("x", validation_alias="OTHER_NAME")


def test_names_cover_nested_fields_json_models_and_aliases() -> None:
    assert documented_names(_Probe) == ["PROBE_PORT", "PROBE_LIMITS", "PROBE_LIMITS__MAX_ITEMS", "PROBE_LIMITS__NESTED",
                                        "PROBE_LIMITS__NESTED__DEPTH_MIB"]
    assert documented_names(_JsonProbe) == ["JSONPROBE_PROFILES", "`depth_mib`", "OTHER_NAME"]


def test_a_field_missing_from_the_page_is_reported() -> None:
    page = "| `PROBE_PORT` | 1 |\n| PROBE_LIMITS | ... |\nPROBE_LIMITS__MAX_ITEMS_TOTAL and `depth_mib_x`"
    assert missing_from(page, documented_names(_Probe)) == [
        "PROBE_LIMITS__MAX_ITEMS", "PROBE_LIMITS__NESTED", "PROBE_LIMITS__NESTED__DEPTH_MIB"]
    assert missing_from(page, ["`depth_mib`"]) == ["`depth_mib`"]


def test_settings_classes_are_found_through_their_bases() -> None:
    source = (
        "import pydantic_settings\n"
        "from pydantic_settings import BaseSettings\n"
        "class Later(Middle): pass\n"
        "class Middle(Direct): pass\n"
        "class Direct(BaseSettings): pass\n"
        "class Dotted(pydantic_settings.BaseSettings): pass\n"
        "class FromElsewhere(ApiSettings): pass\n"
        "class Model(BaseModel): pass\n"
        "def f():\n    class Local(BaseSettings): pass\n")
    assert settings_class_names(source, known={"ApiSettings"}) == {"Later", "Middle", "Direct", "Dotted",
                                                                    "FromElsewhere"}
    assert settings_class_names(source, known=set()) == {"Later", "Middle", "Direct", "Dotted"}


def test_module_names_follow_the_package_dir_mapping() -> None:
    dirs = package_dirs(ROOT)
    assert module_name(dirs, ROOT / "api" / "settings.py") == "sandpit.api.settings"
    assert module_name(dirs, ROOT / "cli" / "cli.py") == "sandpit.cli"
    assert module_name(dirs, ROOT / "api" / "db" / "__init__.py") == "sandpit.api.db"
    assert isinstance(importlib.import_module(module_name(dirs, ROOT / "synthesis" / "settings.py")), types.ModuleType)
