"""BFCL multi-turn importer: wheel handling, suite shape, ground-truth parsing and the
composite source, all static. BFCL's code is only ever parsed here (``ast``), never run;
the cached wheel comes from ``scripts/setup`` and nothing here touches the network."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from sandpit.cli import app
from sandpit.importers import bfcl
from sandpit.importers.bfcl import BfclImportError, ToolCall, parse_call
from sandpit.importers.bfcl import wheel as bfcl_wheel
from typer.testing import CliRunner

BFCL_CLASSES = {"GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot",
                "TravelAPI", "VehicleControlAPI"}


def cached_wheel_or_skip() -> Path:
    """The cached wheel; fails under SANDPIT_REQUIRE_DOCKER (CI), skips otherwise."""
    wheel = bfcl.cached_wheel()
    if wheel is None:
        reason = (f"{bfcl.WHEEL_FILENAME} is not cached in {bfcl.default_cache_dir()}; "
                  "run scripts/setup (it runs `sandpit bfcl fetch`)")
        if os.environ.get("SANDPIT_REQUIRE_DOCKER"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return wheel


@pytest.fixture(scope="module")
def wheel() -> Path:
    return cached_wheel_or_skip()


@pytest.fixture(scope="module")
def suite(wheel: Path) -> bfcl.BfclSuite:
    return bfcl.load_suite(wheel)


@pytest.fixture(scope="module")
def gorilla(suite: bfcl.BfclSuite) -> bfcl.BfclEnvironment:
    return suite.environments["bfcl:GorillaFileSystem"]


# -- suite shape ---------------------------------------------------------------------------
def test_suite_has_every_episode_and_one_environment_per_combination(suite: bfcl.BfclSuite) -> None:
    assert suite.version == bfcl.BFCL_VERSION
    assert len(suite.episodes) == 200
    assert len({episode.id for episode in suite.episodes}) == 200
    assert [e.id for e in suite.episodes[:2]] == ["multi_turn_base_0", "multi_turn_base_1"]
    used = Counter(episode.environment_name for episode in suite.episodes)
    assert set(used) == set(suite.environments)  # no environment without an episode
    assert len(suite.environments) == 20
    assert list(suite.environments) == sorted(suite.environments)
    assert used["bfcl:TradingBot"] == 20 and used["bfcl:GorillaFileSystem+TwitterAPI"] == 12
    assert set().union(*(env.classes for env in suite.environments.values())) == BFCL_CLASSES
    for name, env in suite.environments.items():
        assert name == "bfcl:" + "+".join(env.classes) and list(env.classes) == sorted(env.classes)
        assert env.class_name == "BfclEnv"
        assert len(env.tool_names) == len(set(env.tool_names)) == len(env.signatures)
        assert set(env.tool_names) == set(env.signatures) == set(env.required) == set(env.tool_classes)
        assert set(env.tool_classes.values()) == set(env.classes)


def test_tool_names_and_signatures_come_from_the_class_source(suite: bfcl.BfclSuite) -> None:
    env = suite.environments["bfcl:GorillaFileSystem+TwitterAPI"]
    assert env.tool_names[:4] == ("pwd", "ls", "cd", "mkdir")  # definition order, class by class
    assert len(env.tool_names) == 18 + 14
    assert env.signatures["sort"] == ("file_name",)
    assert env.signatures["find"] == ("path", "name") and env.required["find"] == ()
    assert env.signatures["post_tweet"] == ("content", "tags", "mentions")
    assert env.required["post_tweet"] == ("content",)
    assert env.tool_classes["post_tweet"] == "TwitterAPI" and env.tool_classes["cd"] == "GorillaFileSystem"
    assert "_load_scenario" not in env.signatures and "__init__" not in env.signatures
    vehicle = suite.environments["bfcl:VehicleControlAPI"]
    assert vehicle.signatures["lockDoors"] == ("unlock", "door")
    assert vehicle.signatures["adjustClimateControl"] == ("temperature", "unit", "fanSpeed", "mode")


def test_episode_init_config_and_turns(suite: bfcl.BfclSuite) -> None:
    by_id = {episode.id: episode for episode in suite.episodes}
    first = by_id["multi_turn_base_0"]
    assert first.environment_name == "bfcl:GorillaFileSystem+TwitterAPI"
    assert set(first.init_config) == {bfcl.CONFIG_KEY}  # a private key: EnvScaler setattr-s every key
    scenarios = first.init_config[bfcl.CONFIG_KEY]
    assert set(scenarios) == {"GorillaFileSystem", "TwitterAPI"}
    assert scenarios["GorillaFileSystem"]["root"]["workspace"]["type"] == "directory"
    assert first.turns[0] == (ToolCall("cd", {"folder": "document"}), ToolCall("mkdir", {"dir_name": "temp"}),
                              ToolCall("mv", {"source": "final_report.pdf", "destination": "temp"}))
    assert len(first.turns) == len(first.questions) == 4
    assert first.questions[0][0]["role"] == "user"
    assert first.excluded_functions == ("cp",)
    # a class the dataset gives no configuration gets {} (MathAPI is stateless in BFCL)
    math = by_id["multi_turn_base_32"]
    assert math.init_config[bfcl.CONFIG_KEY]["MathAPI"] == {}
    # positional ground-truth arguments are mapped by the original signature
    assert by_id["multi_turn_base_57"].turns[0][0] == ToolCall("get_zipcode_based_on_city", {"city": "Crescent Hollow"})
    # a class configured but not involved is not part of the environment's config
    assert set(by_id["multi_turn_base_96"].init_config[bfcl.CONFIG_KEY]) == set(
        suite.environments[by_id["multi_turn_base_96"].environment_name].classes)
    assert sum(len(turn) for episode in suite.episodes for turn in episode.turns) == 1142


def test_every_ground_truth_call_is_a_valid_call_of_its_environment(suite: bfcl.BfclSuite) -> None:
    for episode in suite.episodes:
        env = suite.environments[episode.environment_name]
        assert set(episode.init_config[bfcl.CONFIG_KEY]) == set(env.classes), episode.id
        json.dumps(episode.init_config, allow_nan=False)
        for turn in episode.turns:
            for call in turn:
                assert call.name in env.signatures, (episode.id, call)
                assert set(call.arguments) <= set(env.signatures[call.name]), (episode.id, call)
                assert set(env.required[call.name]) <= set(call.arguments), (episode.id, call)
                assert json.loads(json.dumps(call.arguments, allow_nan=False)) == call.arguments


# -- ground-truth call parsing --------------------------------------------------------------
def test_positional_arguments_are_mapped_to_parameter_names(gorilla: bfcl.BfclEnvironment) -> None:
    sigs = gorilla.signatures
    assert parse_call("sort('final_report.pdf')", sigs) == ToolCall("sort", {"file_name": "final_report.pdf"})
    assert parse_call("tail('log.txt', lines=-3)", sigs) == ToolCall("tail", {"file_name": "log.txt", "lines": -3})
    assert parse_call("  ls(a=True) ", sigs) == ToolCall("ls", {"a": True})
    assert parse_call("pwd()", sigs) == ToolCall("pwd", {})
    assert parse_call("find(name=None)", sigs) == ToolCall("find", {"name": None})


def test_literal_values_become_json() -> None:
    sigs = {"f": ["a", "b", "c"]}
    call = parse_call("f((1, -2.5), {'k': [None, False]}, c=[('x',)])", sigs)
    assert call.arguments == {"a": [1, -2.5], "b": {"k": [None, False]}, "c": [["x"]]}


HOSTILE = [
    ("__import__('os').system('x')", "bare tool name"),
    ("cd(folder=open('/etc/passwd').read())", "not a literal"),
    ("cd(*args)", r"\*args"),
    ("cd(*['a'])", r"\*args"),
    ("cd(**{'folder': 'x'})", r"\*\*kwargs"),
    ("a.b()", "bare tool name"),
    ("cd(folder=cd(folder='x'))", "not a literal"),
    ("pwd()()", "bare tool name"),
    ("'cd'", "not a call"),
    ("cd", "not a call"),
    ("cd(folder='x'", "does not parse"),
    ("cd(folder='x'); pwd()", "does not parse"),
    ("import os", "does not parse"),
    ("lambda: cd(folder='x')", "not a call"),
    ("cd(folder=x)", "not a literal"),
    ("cd(folder=f'{x}')", "not a literal"),
    ("cd(folder=1 + 2j)", "not a literal|not JSON"),
    ("cd(folder={1, 2})", "not JSON"),
    ("cd(folder=b'x')", "not JSON"),
    ("cd(folder=1e999)", "not JSON"),
    ("cd(folder={1: 'a'})", "keys must be strings"),
    ("cd(folder=...)", "not JSON"),
    ("rm_rf(folder='x')", "not a tool"),
    ("cd('a', 'b')", "1 arguments, 2 positional"),
    ("cd('a', folder='b')", "given twice"),
    ("cd(path='a')", "no parameter 'path'"),
    ("cd(folder=[" * 200 + "]" * 200 + ")", "."),
    ("cd(folder='" + "x" * (bfcl.MAX_CALL_CHARS + 1) + "')", "longer than"),
]


@pytest.mark.parametrize(("call", "reason"), HOSTILE, ids=[c[:40] for c, _ in HOSTILE])
def test_hostile_or_malformed_calls_are_rejected(gorilla: bfcl.BfclEnvironment, call: str, reason: str) -> None:
    with pytest.raises(BfclImportError, match=reason) as caught:
        parse_call(call, gorilla.signatures, episode_id="multi_turn_base_7")
    assert "episode multi_turn_base_7" in str(caught.value)
    assert repr(call[:200])[:60] in str(caught.value)


def test_deep_nesting_does_not_crash_the_parser(gorilla: bfcl.BfclEnvironment) -> None:
    deep = "cd(folder=" + "[" * 45_000 + "]" * 45_000 + ")"
    assert len(deep) < bfcl.MAX_CALL_CHARS
    with pytest.raises(BfclImportError):
        parse_call(deep, gorilla.signatures)
    with pytest.raises(BfclImportError):
        parse_call("cd(folder=" + "-" * 50_000 + "1)", gorilla.signatures)


# -- composite source (inspected with ast; it only ever runs in a sandbox) -----------------------
def _functions(tree: ast.Module, class_name: str) -> dict[str, ast.FunctionDef]:
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_composite_forwards_every_tool_with_the_original_signature_and_docstring(
        suite: bfcl.BfclSuite, wheel: Path) -> None:
    env = suite.environments["bfcl:GorillaFileSystem+MathAPI"]
    tree = ast.parse(env.source_code)
    assert isinstance(tree.body[1], ast.ImportFrom) and tree.body[1].module == "__future__"
    methods = _functions(tree, "BfclEnv")
    assert list(methods) == ["__init__", *env.tool_names]
    with zipfile.ZipFile(wheel) as archive:
        original_tree = ast.parse(archive.read(
            "bfcl_eval/eval_checker/multi_turn_eval/func_source_code/gorilla_file_system.py").decode())
    originals = _functions(original_tree, "GorillaFileSystem")
    for name, original in originals.items():
        if name.startswith("_"):
            continue
        forwarder = methods[name]
        assert ast.dump(forwarder.args) == ast.dump(original.args), name  # names, annotations, defaults
        assert ast.dump(forwarder.returns) == ast.dump(original.returns) if original.returns else not forwarder.returns
        assert ast.get_docstring(forwarder, clean=False) == ast.get_docstring(original, clean=False), name
        body = forwarder.body[-1]
        assert isinstance(body, ast.Return)
        assert ast.unparse(body.value) == "self.GorillaFileSystem.{}({})".format(
            name, ", ".join(f"{p}={p}" for p in env.signatures[name]))
    assert ast.unparse(methods["find"].args) == "self, path: str='.', name: Optional[str]=None"
    assert ast.unparse(methods["logarithm"].body[-1]) == (
        "return self.MathAPI.logarithm(value=value, base=base, precision=precision)")


def test_composite_embeds_the_wheel_modules_verbatim_under_their_own_names(
        suite: bfcl.BfclSuite, wheel: Path) -> None:
    env = suite.environments["bfcl:TradingBot+TwitterAPI"]
    tree = ast.parse(env.source_code)
    installs = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_install"
                and all(isinstance(a, ast.Constant) for a in node.args)):
            installs[node.args[0].value] = node.args[1].value
    package = bfcl.BACKEND_PACKAGE
    # dependencies first: long_context before the modules that import it
    assert list(installs) == [f"{package}.long_context", f"{package}.trading_bot", f"{package}.posting_api"]
    with zipfile.ZipFile(wheel) as archive:
        for dotted, text in installs.items():
            assert text == archive.read(dotted.replace(".", "/") + ".py").decode()
    math_env = suite.environments["bfcl:MathAPI+TradingBot"]
    assert "_install('mpmath'," not in math_env.source_code  # the image's mpmath, no stand-in
    assert "_STATEFUL = ('TradingBot',)" in math_env.source_code  # MathAPI is stateless in BFCL


def test_source_size_fits_the_executor_limit(suite: bfcl.BfclSuite) -> None:
    from sandpit.sandbox_images.runner.limits import MAX_SOURCE_BYTES

    largest = max(len(env.source_code.encode()) for env in suite.environments.values())
    assert largest < MAX_SOURCE_BYTES


# -- build_environment on synthetic modules (our own text; parsed, never executed) ---------------
PKG = bfcl.BACKEND_PACKAGE


def _build(sources: dict[str, str], classes: list[str], mapping: dict[str, str] | None = None,
           stateless: tuple[str, ...] = ()) -> bfcl.BfclEnvironment:
    mapping = mapping or {name: f"{PKG}.{name.lower()}" for name in classes}
    return bfcl.build_environment(classes, mapping, stateless, lambda dotted: sources[dotted])


PLAIN = "class {name}:\n    def _load_scenario(self, s, long_context=False):\n        pass\n{methods}"


def _module(name: str, *methods: str, header: str = "") -> str:
    return header + PLAIN.format(name=name, methods="".join(f"    def {m}:\n        return 1\n" for m in methods))


def test_build_rejects_colliding_tool_names() -> None:
    sources = {f"{PKG}.a": _module("A", "go(self)"), f"{PKG}.b": _module("B", "go(self, x)")}
    with pytest.raises(BfclImportError, match="'go' is defined by both A and B"):
        _build(sources, ["A", "B"])


def test_build_rejects_a_tool_named_like_a_class() -> None:
    sources = {f"{PKG}.a": _module("A", "B(self)"), f"{PKG}.b": _module("B")}
    with pytest.raises(BfclImportError, match="has the name of a class"):
        _build(sources, ["A", "B"])


@pytest.mark.parametrize(("source", "reason"), [
    (_module("A", "go(self)", header="import numpy\n"), "third-party package"),
    (_module("A", "go(self)", header="from bfcl_eval.utils import x\n"), "outside"),
    (_module("A", "go(self, *args)"), "variadic"),
    (_module("A", "go(self, *, key)"), "keyword-only"),
    (_module("A", "go(self, x=len)"), "not a literal"),
    (_module("A", "go(x)"), "self first"),
    ("class A(dict):\n    pass\n", "bases"),
    ("class A:\n    def go(self):\n        pass\n", "no _load_scenario"),
    ("class A:\n    @property\n    def go(self):\n        pass\n    def _load_scenario(self, s):\n        pass\n",
     "decorated"),
    ("def A(:\n", "does not parse"),
    ("x = 1\n", "does not define class A"),
], ids=["numpy", "bfcl-utils", "varargs", "kwonly", "default", "no-self", "bases", "no-load", "property",
        "syntax", "missing"])
def test_build_rejects_what_the_composite_cannot_reproduce(source: str, reason: str) -> None:
    with pytest.raises(BfclImportError, match=reason):
        _build({f"{PKG}.a": source}, ["A"])


def test_build_rejects_unknown_classes_and_import_cycles() -> None:
    with pytest.raises(BfclImportError, match="no module for class 'Nope'"):
        bfcl.build_environment(["Nope"], {}, (), lambda dotted: "")
    with pytest.raises(BfclImportError, match="outside"):
        bfcl.build_environment(["A"], {"A": "elsewhere.a"}, (), lambda dotted: "")
    cyclic = {f"{PKG}.a": _module("A", "go(self)", header="from .b import y\n"),
              f"{PKG}.b": "from .a import x\n"}
    with pytest.raises(BfclImportError, match="import cycle"):
        _build(cyclic, ["A"])


def test_build_resolves_relative_imports_and_stateless_classes() -> None:
    sources = {f"{PKG}.a": _module("A", "go(self, n: int = -1) -> int", header="from .helpers import K\n"),
               f"{PKG}.helpers": "K = 1\n"}
    env = _build(sources, ["A"], stateless=("A",))
    assert env.signatures == {"go": ("n",)} and env.required == {"go": ()}
    assert env.source_code.index(f"_install('{PKG}.helpers'") < env.source_code.index(f"_install('{PKG}.a'")
    assert "_STATEFUL = ()" in env.source_code
    ast.parse(env.source_code)


# -- wheel handling ------------------------------------------------------------------------------
def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(bfcl.CACHE_ENV, str(tmp_path / "c"))
    assert bfcl.default_cache_dir() == tmp_path / "c"
    assert bfcl.cached_wheel() is None
    monkeypatch.delenv(bfcl.CACHE_ENV)
    assert bfcl.default_cache_dir() == Path.home() / ".cache" / "sandpit" / "bfcl"


def test_fetch_returns_a_cached_wheel_without_downloading(
        wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(wheel, tmp_path / bfcl.WHEEL_FILENAME)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("fetch_wheel ran pip although the wheel is cached")

    monkeypatch.setattr(bfcl_wheel.subprocess, "run", no_network)
    assert bfcl.fetch_wheel(tmp_path) == tmp_path / bfcl.WHEEL_FILENAME
    fetched = CliRunner().invoke(app, ["bfcl", "fetch", "--cache", str(tmp_path)])
    assert fetched.exit_code == 0 and fetched.stdout.strip() == str(tmp_path / bfcl.WHEEL_FILENAME)


def test_fetch_refuses_a_wheel_with_another_digest(tmp_path: Path) -> None:
    (tmp_path / bfcl.WHEEL_FILENAME).write_bytes(b"not the wheel")
    with pytest.raises(BfclImportError, match="expected " + bfcl.WHEEL_SHA256):
        bfcl.fetch_wheel(tmp_path)


def test_fetch_failure_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def offline(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(bfcl_wheel.subprocess, "run", offline)
    with pytest.raises(BfclImportError, match="could not download bfcl-eval==2026.3.23.*No matching distribution"):
        bfcl.fetch_wheel(tmp_path / "cache")
    assert seen[0][1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in seen[0] and "--only-binary=:all:" in seen[0]
    assert list((tmp_path / "cache").iterdir()) == []  # the staging directory is gone
    failed = CliRunner().invoke(app, ["bfcl", "fetch", "--cache", str(tmp_path / "cache")])
    assert failed.exit_code == 1 and failed.stdout == "" and failed.stderr.startswith("bfcl: could not download")


def test_load_suite_rejects_what_is_not_the_wheel(tmp_path: Path) -> None:
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"PK\x03\x04 nope")
    with pytest.raises(BfclImportError, match="not a readable wheel"):
        bfcl.load_suite(junk)
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("other.txt", "x")
    with pytest.raises(BfclImportError, match="has no bfcl_eval/data/BFCL_v4_multi_turn_base.json"):
        bfcl.load_suite(empty)


def test_load_suite_names_the_episode_of_a_bad_ground_truth_call(wheel: Path, tmp_path: Path) -> None:
    doctored = tmp_path / "doctored.whl"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(doctored, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == bfcl.ANSWER_MEMBER:
                data = data.replace(b"\"cd(folder='document')\"", b"\"cd(folder=__import__('os'))\"", 1)
            target.writestr(info, data)
    with pytest.raises(BfclImportError, match=r"episode multi_turn_base_0: ground-truth call \"cd\(folder=__import__"):
        bfcl.load_suite(doctored)
