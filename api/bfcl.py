"""Import of the BFCL multi-turn benchmark (``multi_turn_base``) as Sandpit environments.

The Berkeley Function Calling Leaderboard ships its multi-turn tools as Python classes
(``GorillaFileSystem``, ``TradingBot``, ...) inside the ``bfcl-eval`` wheel, next to the
dataset (user turns, initial configuration per class) and the ground truth (one list of
call strings such as ``"cd(folder='document')"`` per turn). This module turns that wheel
into what Sandpit runs:

* one :class:`BfclEnvironment` per distinct combination of involved classes: a single
  Python module (``source_code``) defining ``BfclEnv``, which holds one instance of each
  involved class as a public attribute named after the class (the state) and forwards
  every public method of those classes (the tools);
* one :class:`BfclEpisode` per dataset entry: its ``init_config`` (``BfclEnv``'s
  constructor argument, ``{"_bfcl": {class name: scenario}}``) and its ground-truth turns
  as :class:`ToolCall` objects. The classes' scenarios sit under the private key ``_bfcl``
  because EnvScaler's instantiation also ``setattr``s every config key on the instance: a
  key named after a class would replace that class's instance with its raw scenario.

Trust: BFCL's Python source is untrusted. Here it is only read from the wheel as text and
parsed with :func:`ast.parse` (which executes nothing); the generated ``source_code``
embeds it as string literals and is meant to run only inside a sandbox
(:class:`sandpit.executor.pool.SandboxPool`). Ground-truth calls are parsed with ``ast``
and their arguments must be literals (:func:`ast.literal_eval` per argument node).

Errors: every failure of this module is a :class:`BfclImportError` (wheel missing or not
downloadable, a member missing or malformed, a class layout this importer does not
support, a call string that is not a plain literal call of a known tool).

``python -m sandpit.api.bfcl fetch`` caches the wheel (``scripts/setup`` runs it, so tests
never need the network).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BFCL_VERSION = "2026.3.23"
"""The ``bfcl-eval`` release this importer reads (its dataset is ``BFCL_v4``)."""
WHEEL_FILENAME = f"bfcl_eval-{BFCL_VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
"""Digest of the PyPI wheel; a cached or downloaded file that differs is refused."""
CACHE_ENV = "SANDPIT_BFCL_CACHE"
"""Environment variable overriding the wheel cache directory (default ``~/.cache/sandpit/bfcl``)."""
CLASS_NAME = "BfclEnv"
"""Name of the environment class every generated ``source_code`` defines."""
CONFIG_KEY = "_bfcl"
"""The init_config key holding the classes' scenarios (private: EnvScaler setattr-s every key)."""
ENV_PREFIX = "bfcl:"
BACKEND_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
"""Dotted package of BFCL's tool modules; the composite registers them under these names."""

DATASET_MEMBER = "bfcl_eval/data/BFCL_v4_multi_turn_base.json"
ANSWER_MEMBER = "bfcl_eval/data/possible_answer/BFCL_v4_multi_turn_base.json"
BACKEND_CONFIG_MEMBER = "bfcl_eval/constants/executable_backend_config.py"
MAX_MEMBER_BYTES = 16 * 1024 * 1024
"""Largest wheel member read (the biggest, ``long_context.py``, is about 190 KB)."""
MAX_CALL_CHARS = 100_000
"""Longest ground-truth call string accepted (the longest in the dataset is under 1 KB)."""
FETCH_TIMEOUT_S = 300.0

JsonValue = Any
"""A value that ``json.dumps`` accepts and round-trips (dict keys are strings)."""


class BfclImportError(Exception):
    """The BFCL wheel could not be fetched or read, or its content is not what this
    importer supports. The message names the file, episode id and/or call string."""


# -- public models -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToolCall:
    """One ground-truth call: ``getattr(env, name)(**arguments)``.

    ``arguments`` is a JSON object keyed by the original method's parameter names
    (positional arguments of the call string already mapped to keywords).
    """

    name: str
    arguments: dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class BfclEnvironment:
    """A registrable environment for one combination of BFCL classes.

    Attributes:
        name: ``"bfcl:" + "+".join(classes)``, e.g. ``"bfcl:GorillaFileSystem+TwitterAPI"``.
        class_name: always :data:`CLASS_NAME` (``"BfclEnv"``).
        classes: the involved BFCL class names, sorted.
        source_code: the composite module (untrusted code inside; run only in a sandbox).
        tool_names: every public method of every class, class by class in ``classes``
            order, each class's methods in definition order.
        signatures: tool name -> its parameter names in order (``self`` excluded).
        required: tool name -> the parameters without a default.
        tool_classes: tool name -> the BFCL class that implements it.
    """

    name: str
    class_name: str
    classes: tuple[str, ...]
    source_code: str
    tool_names: tuple[str, ...]
    signatures: dict[str, tuple[str, ...]]
    required: dict[str, tuple[str, ...]]
    tool_classes: dict[str, str]


@dataclass(frozen=True, slots=True)
class BfclEpisode:
    """One dataset entry with its ground truth.

    Attributes:
        id: BFCL's id, e.g. ``"multi_turn_base_0"``.
        environment_name: the :class:`BfclEnvironment` it runs in.
        init_config: ``{"_bfcl": {class name: that class's scenario}}`` for every
            involved class (``{}`` where the dataset gives none); ``BfclEnv(init_config)``.
        turns: per user turn, the ground-truth calls in order (a turn may be empty).
        questions: per user turn, BFCL's messages (``{"role": ..., "content": ...}``).
        excluded_functions: BFCL's ``excluded_function`` list (tools withheld from the
            model in that entry; BFCL's own code does not use it in this release).
    """

    id: str
    environment_name: str
    init_config: dict[str, JsonValue]
    turns: tuple[tuple[ToolCall, ...], ...]
    questions: tuple[tuple[dict[str, JsonValue], ...], ...]
    excluded_functions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BfclSuite:
    """Everything :func:`load_suite` extracts from one wheel.

    Attributes:
        version: the ``bfcl-eval`` release (:data:`BFCL_VERSION`).
        environments: environment name -> environment, sorted by name.
        episodes: in dataset order.
    """

    version: str
    environments: dict[str, BfclEnvironment]
    episodes: tuple[BfclEpisode, ...]


# -- fetching ------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """``$SANDPIT_BFCL_CACHE`` if set, else ``~/.cache/sandpit/bfcl``."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "sandpit" / "bfcl"


def cached_wheel(cache_dir: Path | None = None) -> Path | None:
    """The cached wheel's path, or None when it is not there (never downloads).

    Raises:
        BfclImportError: a file is there but does not have :data:`WHEEL_SHA256`.
    """
    target = (cache_dir if cache_dir is not None else default_cache_dir()) / WHEEL_FILENAME
    if not target.is_file():
        return None
    _check_digest(target)
    return target


def fetch_wheel(cache_dir: Path | None = None) -> Path:
    """Return the path of the cached ``bfcl-eval`` wheel, downloading it when missing.

    Downloads with ``<this python> -m pip download --no-deps --only-binary=:all:
    bfcl-eval==<BFCL_VERSION>`` (a wheel only: building an sdist would run its code on
    this host) into a temporary directory under the cache, checks the digest, then moves
    it into place.

    Args:
        cache_dir: where the wheel lives; default :func:`default_cache_dir`.

    Returns:
        ``<cache_dir>/bfcl_eval-<version>-py3-none-any.whl``.

    Raises:
        BfclImportError: pip failed (no network, no such release), produced no wheel,
            or the cached or downloaded file does not have :data:`WHEEL_SHA256`.
    """
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    target = cache / WHEEL_FILENAME
    if cached_wheel(cache) is not None:
        return target
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    except OSError as exc:
        raise BfclImportError(f"cannot create the BFCL cache directory {cache}: {exc}") from exc
    try:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--quiet", f"bfcl-eval=={BFCL_VERSION}", "-d", str(staging)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BfclImportError(f"could not run pip to download bfcl-eval=={BFCL_VERSION}: {exc}") from exc
        downloaded = staging / WHEEL_FILENAME
        if done.returncode != 0 or not downloaded.is_file():
            detail = (done.stderr or done.stdout).strip()[-2000:]
            raise BfclImportError(
                f"could not download bfcl-eval=={BFCL_VERSION} into {cache} (pip exit {done.returncode}): "
                f"{detail or 'no wheel produced'}; run scripts/setup where PyPI is reachable, or put "
                f"{WHEEL_FILENAME} there (or in ${CACHE_ENV})")
        _check_digest(downloaded)
        os.replace(downloaded, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _check_digest(path: Path) -> None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise BfclImportError(f"cannot read {path}: {exc}") from exc
    if digest.hexdigest() != WHEEL_SHA256:
        raise BfclImportError(f"{path} has sha256 {digest.hexdigest()}, expected {WHEEL_SHA256} "
                              f"(bfcl-eval=={BFCL_VERSION} from PyPI); delete it and fetch again")


# -- loading ---------------------------------------------------------------------------------
def load_suite(wheel: Path) -> BfclSuite:
    """Read the multi-turn base dataset, its ground truth and the tool classes from the
    wheel (as a zip; nothing in it is imported or executed) and build the suite.

    Args:
        wheel: path of the ``bfcl-eval`` wheel (see :func:`fetch_wheel`).

    Returns:
        A :class:`BfclSuite`: one environment per distinct ``involved_classes``
        combination, one episode per dataset entry (200 in this release).

    Raises:
        BfclImportError: the wheel is not a readable zip or lacks a member; a dataset line
            is not the expected JSON; an entry has no ground truth (or the turn counts
            differ); a class is unknown to BFCL's class -> module mapping, or its source
            uses something the composite cannot reproduce (see :func:`build_environment`);
            any ground-truth call fails :func:`parse_call`.
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            reader = _WheelReader(archive)
            entries = _json_lines(reader.text(DATASET_MEMBER), DATASET_MEMBER)
            answers = _json_lines(reader.text(ANSWER_MEMBER), ANSWER_MEMBER)
            class_modules, stateless = _backend_config(reader.text(BACKEND_CONFIG_MEMBER))
            truth = _ground_truth_by_id(answers)
            combos = sorted({_involved(entry) for entry in entries})
            index = _ModuleIndex(reader.module_source)
            environments: dict[str, BfclEnvironment] = {}
            for classes in combos:
                env = _build(classes, class_modules, stateless, index)
                environments[env.name] = env
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, OSError) as exc:
        raise BfclImportError(f"{wheel} is not a readable wheel: {exc}") from exc
    episodes = tuple(_episode(entry, truth, environments) for entry in entries)
    return BfclSuite(version=BFCL_VERSION, environments=environments, episodes=episodes)


class _WheelReader:
    """Bounded, cached text reads of wheel members."""

    def __init__(self, archive: zipfile.ZipFile) -> None:
        self.archive = archive
        self.cache: dict[str, str] = {}

    def text(self, member: str) -> str:
        if member not in self.cache:
            try:
                info = self.archive.getinfo(member)
            except KeyError as exc:
                raise BfclImportError(f"the wheel has no {member}") from exc
            if info.file_size > MAX_MEMBER_BYTES:
                raise BfclImportError(f"{member} is {info.file_size} bytes, over the {MAX_MEMBER_BYTES}-byte limit")
            data = self.archive.read(info)[: MAX_MEMBER_BYTES + 1]
            if len(data) > MAX_MEMBER_BYTES:
                raise BfclImportError(f"{member} inflates past the {MAX_MEMBER_BYTES}-byte limit")
            try:
                self.cache[member] = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BfclImportError(f"{member} is not UTF-8: {exc}") from exc
        return self.cache[member]

    def module_source(self, dotted: str) -> str:
        return self.text(dotted.replace(".", "/") + ".py")


def _json_lines(text: str, member: str) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise BfclImportError(f"{member} line {number} is not JSON: {exc}") from exc
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise BfclImportError(f"{member} line {number} is not an object with a string id")
        rows.append(row)
    return rows


def _involved(entry: dict[str, Any]) -> tuple[str, ...]:
    classes = entry.get("involved_classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise BfclImportError(f"episode {entry['id']}: involved_classes is not a non-empty list of names")
    return tuple(sorted(set(classes)))


def _ground_truth_by_id(answers: list[dict[str, Any]]) -> dict[str, list[list[str]]]:
    truth: dict[str, list[list[str]]] = {}
    for row in answers:
        turns = row.get("ground_truth")
        if not isinstance(turns, list) or not all(
                isinstance(turn, list) and all(isinstance(call, str) for call in turn) for turn in turns):
            raise BfclImportError(f"episode {row['id']}: ground_truth is not a list of lists of call strings")
        truth[row["id"]] = turns
    return truth


def _episode(entry: dict[str, Any], truth: dict[str, list[list[str]]],
             environments: dict[str, BfclEnvironment]) -> BfclEpisode:
    episode_id = entry["id"]
    classes = _involved(entry)
    env = environments[environment_name(classes)]
    if episode_id not in truth:
        raise BfclImportError(f"episode {episode_id} has no ground truth")
    questions = entry.get("question")
    if not isinstance(questions, list) or not all(isinstance(turn, list) for turn in questions):
        raise BfclImportError(f"episode {episode_id}: question is not a list of turns")
    if len(questions) != len(truth[episode_id]):
        raise BfclImportError(f"episode {episode_id}: {len(questions)} user turns but "
                              f"{len(truth[episode_id])} ground-truth turns")
    initial = entry.get("initial_config") or {}
    if not isinstance(initial, dict) or not all(isinstance(initial.get(c, {}), dict) for c in classes):
        raise BfclImportError(f"episode {episode_id}: initial_config is not an object of objects")
    excluded = entry.get("excluded_function") or []
    if not isinstance(excluded, list) or not all(isinstance(name, str) for name in excluded):
        raise BfclImportError(f"episode {episode_id}: excluded_function is not a list of names")
    turns = tuple(tuple(parse_call(call, env.signatures, episode_id=episode_id) for call in turn)
                  for turn in truth[episode_id])
    return BfclEpisode(
        id=episode_id, environment_name=env.name,
        init_config={CONFIG_KEY: {name: initial.get(name, {}) for name in classes}},
        turns=turns, questions=tuple(tuple(turn) for turn in questions),
        excluded_functions=tuple(excluded))


def environment_name(classes: Iterable[str]) -> str:
    """``"bfcl:" + "+".join(sorted(set(classes)))``."""
    return ENV_PREFIX + "+".join(sorted(set(classes)))


# -- BFCL's class -> module mapping, read with ast ---------------------------------------------
def _backend_config(source: str) -> tuple[dict[str, str], frozenset[str]]:
    """``CLASS_FILE_PATH_MAPPING`` and ``STATELESS_CLASSES`` from BFCL's
    ``executable_backend_config.py``, evaluated as string constants and f-strings over
    earlier string assignments (no code run)."""
    try:
        tree = ast.parse(source, filename=BACKEND_CONFIG_MEMBER)
    except (SyntaxError, ValueError) as exc:
        raise BfclImportError(f"{BACKEND_CONFIG_MEMBER} does not parse: {exc}") from exc
    strings: dict[str, str] = {}
    mapping: dict[str, str] | None = None
    stateless: frozenset[str] | None = None
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name, value = node.targets[0].id, node.value
        if name == "CLASS_FILE_PATH_MAPPING" and isinstance(value, ast.Dict):
            mapping = {}
            for key, item in zip(value.keys, value.values, strict=True):
                class_name, module = _static_str(key, strings), _static_str(item, strings)
                if class_name is None or module is None:
                    raise BfclImportError(f"{BACKEND_CONFIG_MEMBER}: CLASS_FILE_PATH_MAPPING is not a static mapping")
                mapping[class_name] = module
        elif name == "STATELESS_CLASSES" and isinstance(value, ast.List):
            items = [_static_str(item, strings) for item in value.elts]
            if any(item is None for item in items):
                raise BfclImportError(f"{BACKEND_CONFIG_MEMBER}: STATELESS_CLASSES is not a list of names")
            stateless = frozenset(item for item in items if item is not None)
        else:
            text = _static_str(value, strings)
            if text is not None:
                strings[name] = text
    if mapping is None or stateless is None:
        raise BfclImportError(f"{BACKEND_CONFIG_MEMBER} lacks CLASS_FILE_PATH_MAPPING or STATELESS_CLASSES")
    return mapping, stateless


def _static_str(node: ast.expr | None, strings: Mapping[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                parts.append(part.value)
            elif (isinstance(part, ast.FormattedValue) and part.conversion == -1 and part.format_spec is None
                  and isinstance(part.value, ast.Name) and part.value.id in strings):
                parts.append(strings[part.value.id])
            else:
                return None
        return "".join(parts)
    return None


# -- composite environment --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Method:
    name: str
    params: tuple[str, ...]
    required: tuple[str, ...]
    header: str  # "name(self, a: int = 1) -> Dict[str, int]"
    doc: str | None


@dataclass(frozen=True, slots=True)
class _BfclClass:
    name: str
    module: str  # dotted
    methods: tuple[_Method, ...]
    has_load_scenario: bool


STAND_INS = frozenset({"mpmath"})
"""Third-party modules BFCL's tools import; the sandbox image provides them (Debian's
``python3-mpmath``, see ``sandbox_images/base.json``)."""


def build_environment(classes: Sequence[str], class_modules: Mapping[str, str], stateless: Iterable[str],
                      read_module: Callable[[str], str]) -> BfclEnvironment:
    """Build the composite environment for ``classes`` (statically, with ``ast``).

    Args:
        classes: BFCL class names (order and duplicates ignored).
        class_modules: BFCL's ``CLASS_FILE_PATH_MAPPING`` (class -> dotted module).
        stateless: BFCL's ``STATELESS_CLASSES`` (no ``_load_scenario`` call).
        read_module: ``read_module(dotted_name) -> source text`` (from the wheel).

    Returns:
        A :class:`BfclEnvironment` whose ``source_code`` defines :data:`CLASS_NAME`.

    Raises:
        BfclImportError: a class is unknown or outside :data:`BACKEND_PACKAGE`; a module
            does not parse, imports a third-party package other than those in
            :data:`STAND_INS`, imports BFCL code outside the backend package, or has an
            import cycle; a class has base classes or decorated/async public methods, a
            public method has ``*args``/keyword-only/positional-only parameters or a
            non-literal default; a stateful class lacks ``_load_scenario``; two classes
            share a tool name, or a tool name equals a class name.
    """
    return _build(tuple(sorted(set(classes))), class_modules, frozenset(stateless), _ModuleIndex(read_module))


class _ModuleIndex:
    """BFCL module sources, syntax trees and imports, each computed once (``load_suite``
    shares one index across all combinations; ``long_context.py`` alone is 190 KB)."""

    def __init__(self, read_module: Callable[[str], str]) -> None:
        self.read_module = read_module
        self.sources: dict[str, str] = {}
        self.trees: dict[str, ast.Module] = {}
        self.imported: dict[str, list[tuple[str, int]]] = {}

    def source(self, dotted: str) -> str:
        if dotted not in self.sources:
            self.sources[dotted] = self.read_module(dotted)
        return self.sources[dotted]

    def tree(self, dotted: str) -> ast.Module:
        if dotted not in self.trees:
            try:
                self.trees[dotted] = ast.parse(self.source(dotted), filename=dotted)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                raise BfclImportError(f"BFCL module {dotted} does not parse: {exc}") from exc
        return self.trees[dotted]

    def imports(self, dotted: str) -> list[tuple[str, int]]:
        if dotted not in self.imported:
            self.imported[dotted] = list(_imports(dotted, self.tree(dotted)))
        return self.imported[dotted]


def _build(names: tuple[str, ...], class_modules: Mapping[str, str], stateless: frozenset[str],
           index: _ModuleIndex) -> BfclEnvironment:
    parsed: list[_BfclClass] = []
    for class_name in names:
        module = class_modules.get(class_name)
        if module is None:
            raise BfclImportError(f"BFCL has no module for class {class_name!r}")
        if not module.startswith(BACKEND_PACKAGE + "."):
            raise BfclImportError(f"class {class_name} lives in {module}, outside {BACKEND_PACKAGE}")
        parsed.append(_parse_class(class_name, module, index.tree(module), class_name not in stateless))
    order = _module_order([cls.module for cls in parsed], index)
    owners: dict[str, str] = {}
    for cls in parsed:
        for method in cls.methods:
            if method.name in owners:
                raise BfclImportError(f"tool {method.name!r} is defined by both {owners[method.name]} and "
                                      f"{cls.name}; they cannot share one environment")
            if method.name in names:
                raise BfclImportError(f"tool {method.name!r} of {cls.name} has the name of a class")
            owners[method.name] = cls.name
    stand_ins = sorted({name for dotted in order for name in _third_party(dotted, index)})
    source = _render(names, parsed, [(dotted, index.source(dotted)) for dotted in order], stand_ins, stateless)
    return BfclEnvironment(
        name=environment_name(names), class_name=CLASS_NAME, classes=names, source_code=source,
        tool_names=tuple(m.name for cls in parsed for m in cls.methods),
        signatures={m.name: m.params for cls in parsed for m in cls.methods},
        required={m.name: m.required for cls in parsed for m in cls.methods},
        tool_classes=dict(owners))


def _parse_class(class_name: str, module: str, tree: ast.Module, stateful: bool) -> _BfclClass:
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    if len(found) != 1:
        raise BfclImportError(f"{module} does not define class {class_name} exactly once")
    node = found[0]
    if node.bases or node.keywords or node.decorator_list:
        raise BfclImportError(f"class {class_name} has bases or decorators; inherited tools are not supported")
    methods = []
    has_load = False
    for item in node.body:
        if isinstance(item, ast.AsyncFunctionDef) and not item.name.startswith("_"):
            raise BfclImportError(f"{class_name}.{item.name} is async; not supported")
        if not isinstance(item, ast.FunctionDef):
            continue
        if item.name == "_load_scenario":
            has_load = True
        if item.name.startswith("_"):
            continue
        methods.append(_parse_method(class_name, item))
    if stateful and not has_load:
        raise BfclImportError(f"stateful class {class_name} has no _load_scenario method")
    return _BfclClass(name=class_name, module=module, methods=tuple(methods), has_load_scenario=has_load)


def _parse_method(class_name: str, node: ast.FunctionDef) -> _Method:
    where = f"{class_name}.{node.name}"
    args = node.args
    if node.decorator_list:
        raise BfclImportError(f"{where} is decorated; only plain methods are supported")
    if args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg:
        raise BfclImportError(f"{where} has positional-only, keyword-only or variadic parameters")
    if not args.args or args.args[0].arg != "self":
        raise BfclImportError(f"{where} does not take self first")
    params = args.args[1:]
    first_default = len(params) - len(args.defaults)
    parts = ["self"]
    for index, param in enumerate(params):
        text = param.arg
        if param.annotation is not None:
            text += ": " + ast.unparse(param.annotation)
        if index >= first_default:
            default = args.defaults[index - first_default]
            try:
                ast.literal_eval(default)
            except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
                raise BfclImportError(f"{where}: default of {param.arg!r} is not a literal") from exc
            text += (" = " if param.annotation is not None else "=") + ast.unparse(default)
        parts.append(text)
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    names = tuple(param.arg for param in params)
    return _Method(name=node.name, params=names, required=names[:first_default],
                   header=f"{node.name}({', '.join(parts)}){returns}",
                   doc=ast.get_docstring(node, clean=False))


def _imports(dotted: str, tree: ast.Module) -> Iterable[tuple[str, int]]:
    """``(absolute module name, line)`` for every import anywhere in the module."""
    package = dotted.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    raise BfclImportError(f"{dotted} line {node.lineno}: relative import beyond the top package")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == BACKEND_PACKAGE:  # "from <package> import long_context"
                for alias in node.names:
                    yield f"{target}.{alias.name}", node.lineno
            else:
                yield target, node.lineno


def _internal_deps(dotted: str, index: _ModuleIndex) -> list[str]:
    deps = []
    for target, line in index.imports(dotted):
        top = target.partition(".")[0]
        if top != "bfcl_eval":
            continue
        if not target.startswith(BACKEND_PACKAGE + "."):
            raise BfclImportError(f"{dotted} line {line} imports {target}, outside {BACKEND_PACKAGE}; not supported")
        deps.append(target)
    return deps


def _third_party(dotted: str, index: _ModuleIndex) -> list[str]:
    found = []
    for target, line in index.imports(dotted):
        top = target.partition(".")[0]
        if top == "bfcl_eval" or top in sys.stdlib_module_names:
            continue
        if top not in STAND_INS:
            raise BfclImportError(f"{dotted} line {line} imports {target}, a third-party package the sandbox lacks")
        found.append(top)
    return found


def _module_order(roots: Sequence[str], index: _ModuleIndex) -> list[str]:
    """Dependency order (imported modules first) of ``roots`` and what they import."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(dotted: str, chain: tuple[str, ...]) -> None:
        if state.get(dotted) == "done":
            return
        if state.get(dotted) == "active":
            raise BfclImportError(f"import cycle between BFCL modules: {' -> '.join(chain + (dotted,))}")
        state[dotted] = "active"
        for dep in _internal_deps(dotted, index):
            visit(dep, chain + (dotted,))
        state[dotted] = "done"
        order.append(dotted)

    for root in roots:
        visit(root, ())
    return order


def _render(names: tuple[str, ...], parsed: list[_BfclClass], modules: list[tuple[str, str]],
            stand_ins: list[str], stateless: frozenset[str]) -> str:
    """The composite module's text (see the module docstring it carries)."""
    by_name = {cls.name: cls for cls in parsed}
    lines = [
        f'"""BFCL multi-turn environment {"+".join(names)} (bfcl-eval=={BFCL_VERSION}), generated by',
        "sandpit.api.bfcl. Run only inside a Sandpit sandbox: it executes BFCL's tool modules.",
        "",
        "BFCL's modules are embedded as text and created as real modules, registered in sys.modules",
        "under their own names (with their parent packages):",
        f"{BACKEND_PACKAGE}.<module>.",
        "So their imports resolve and pickle finds their classes. BfclEnv holds one instance of each",
        "involved class as a public attribute named after the class (the state) and forwards every",
        'public method of those classes (the tools)."""',
        "",
        "from __future__ import annotations",
        "",
        "import copy as _copy",
        "import importlib.machinery as _machinery",
        "import linecache as _linecache",
        "import sys as _sys",
        "import types as _types",
        "",
        "",
        "def _package(name):",
        "    module = _sys.modules.get(name)",
        "    if module is None:",
        "        module = _types.ModuleType(name)",
        "        module.__path__ = []",
        "        module.__package__ = name",
        "        module.__spec__ = _machinery.ModuleSpec(name, None, is_package=True)",
        "        _sys.modules[name] = module",
        "        parent, _, leaf = name.rpartition('.')",
        "        if parent:",
        "            setattr(_package(parent), leaf, module)",
        "    return module",
        "",
        "",
        "def _install(name, source):",
        "    parent, _, leaf = name.rpartition('.')",
        "    filename = '<bfcl>/' + name.replace('.', '/') + '.py'",
        "    module = _types.ModuleType(name)",
        "    module.__file__ = filename",
        "    module.__package__ = parent",
        "    module.__spec__ = _machinery.ModuleSpec(name, None, origin=filename)",
        "    _sys.modules[name] = module",
        "    if parent:",
        "        setattr(_package(parent), leaf, module)",
        "    _linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)",
        "    try:",
        "        exec(compile(source, filename, 'exec', dont_inherit=True), module.__dict__)",
        "    except BaseException:",
        "        del _sys.modules[name]",
        "        raise",
        "    return module",
        "",
    ]
    lines += ["", "_MODULES = {}"]
    for dotted, source in modules:
        lines.append(f"_MODULES[{dotted!r}] = _install({dotted!r}, {source!r})")
    lines += ["", "_CLASSES = {"]
    for name in names:
        lines.append(f"    {name!r}: _MODULES[{by_name[name].module!r}].{name},")
    lines += ["}", f"_STATEFUL = {tuple(n for n in names if n not in stateless)!r}", "", ""]
    tools = textwrap.wrap("Tools: " + ", ".join(m.name for cls in parsed for m in cls.methods) + ".",
                          width=88, initial_indent="    ", subsequent_indent="        ")
    lines += [
        f"class {CLASS_NAME}:",
        f'    """BFCL tools of {", ".join(names)}.',
        "",
        f"    State: {', '.join(f'self.{n}' for n in names)} (the BFCL instances).",
        *tools,
        '    """',
        "",
        "    def __init__(self, init_config):",
        f"        config = (init_config or {{}}).get({CONFIG_KEY!r}) or {{}}",
    ]
    for name in names:
        lines.append(f"        self.{name} = _new({name!r}, config)")
    for cls in parsed:
        for method in cls.methods:
            lines += ["", f"    def {method.header}:"]
            if method.doc is not None:
                lines.append(f"        {_docstring_literal(method.doc)}")
            forwarded = ", ".join(f"{p}={p}" for p in method.params)
            lines.append(f"        return self.{cls.name}.{method.name}({forwarded})")
    lines += [
        "",
        "",
        "def _new(name, config):",
        "    instance = _CLASSES[name]()",
        "    if name in _STATEFUL:",
        "        instance._load_scenario(_copy.deepcopy(config.get(name) or {}), long_context=False)",
        "    return instance",
        "",
        "",
        "# Real annotations on the forwarders (the text above is kept as strings):",
        "for _name, _cls in _CLASSES.items():",
        "    for _tool, _function in list(vars(_cls).items()):",
        f"        if not _tool.startswith('_') and callable(_function) and _tool in vars({CLASS_NAME}):",
        f"            vars({CLASS_NAME})[_tool].__annotations__ = dict(getattr(_function, '__annotations__', {{}}))",
        "",
    ]
    return "\n".join(lines)


def _docstring_literal(doc: str) -> str:
    """``doc`` as a triple-quoted literal when that reads back identically, else its repr."""
    if '"""' in doc or "\\" in doc or doc.endswith('"') or any(c < " " and c not in "\n\t" for c in doc):
        return repr(doc)
    return f'"""{doc}"""'


# -- ground-truth calls -------------------------------------------------------------------------
def parse_call(call: str, signatures: Mapping[str, Sequence[str]], *, episode_id: str = "?") -> ToolCall:
    """Parse one ground-truth call string, e.g. ``"sort('final_report.pdf')"``, with ``ast``.

    The string must be exactly one call ``name(args)`` of a tool in ``signatures`` whose
    arguments are literals (numbers, incl. negative; strings; ``True``/``False``/``None``;
    lists, tuples (become lists) and dicts with string keys, of those). Positional
    arguments are mapped to keywords by the tool's parameter order.

    Args:
        call: the call string.
        signatures: tool name -> parameter names in order (``BfclEnvironment.signatures``).
        episode_id: named in error messages.

    Returns:
        ``ToolCall(name, arguments)`` with JSON arguments.

    Raises:
        BfclImportError: (naming the episode and the call) not a single call expression,
            a syntax error, the callee is not a bare name (``a.b()``, ``f()()``), unknown
            tool, ``*args``/``**kwargs``, a non-literal argument (names, calls, ...), a
            value JSON cannot carry (sets, bytes, complex, NaN/inf, non-string dict
            keys), too many positional arguments, an unknown or repeated parameter.
    """
    def fail(reason: str) -> BfclImportError:
        return BfclImportError(f"episode {episode_id}: ground-truth call {call[:200]!r}: {reason}")

    if not isinstance(call, str):
        raise fail("not a string")
    if len(call) > MAX_CALL_CHARS:
        raise fail(f"longer than {MAX_CALL_CHARS} characters")
    try:
        tree = ast.parse(call.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise fail(f"does not parse ({type(exc).__name__}: {exc})") from exc
    node = tree.body
    if not isinstance(node, ast.Call):
        raise fail("not a call expression")
    if not isinstance(node.func, ast.Name):
        raise fail("the callee must be a bare tool name")
    name = node.func.id
    if name not in signatures:
        raise fail(f"{name!r} is not a tool of this episode's classes")
    params = list(signatures[name])
    arguments: dict[str, JsonValue] = {}
    for index, arg in enumerate(node.args):
        if isinstance(arg, ast.Starred):
            raise fail("*args is not allowed")
        if index >= len(params):
            raise fail(f"{name} takes {len(params)} arguments, {len(node.args)} positional given")
        arguments[params[index]] = _literal(arg, fail)
    for keyword in node.keywords:
        if keyword.arg is None:
            raise fail("**kwargs is not allowed")
        if keyword.arg not in params:
            raise fail(f"{name} has no parameter {keyword.arg!r}")
        if keyword.arg in arguments:
            raise fail(f"parameter {keyword.arg!r} given twice")
        arguments[keyword.arg] = _literal(keyword.value, fail)
    return ToolCall(name=name, arguments=arguments)


def _literal(node: ast.expr, fail: Callable[[str], BfclImportError]) -> JsonValue:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise fail(f"argument {ast.unparse(node)[:100]!r} is not a literal") from exc
    return _json(value, fail)


def _json(value: object, fail: Callable[[str], BfclImportError]) -> JsonValue:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise fail("NaN and infinite numbers are not JSON")
        return value
    if isinstance(value, (list, tuple)):
        return [_json(item, fail) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise fail("dict keys must be strings")
        return {key: _json(item, fail) for key, item in value.items()}
    raise fail(f"a {type(value).__name__} value is not JSON")


def embedded_modules(composite: str) -> dict[str, str]:
    """The BFCL module sources a composite environment embeds (its ``_install(name,
    source)`` string literals), read with ``ast`` only: dotted name -> source. These are
    what the static policy judges; the composite wrapper around them is Sandpit's own
    generated glue (it must ``exec`` them inside the sandbox)."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(composite)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_install"
                and len(node.args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                                for a in node.args)):
            found[node.args[0].value] = node.args[1].value
    return found


# -- command line ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sandpit.api.bfcl fetch [--cache DIR]``: cache the wheel, print its path.

    Returns the exit status: 0 on success, 1 with the reason on stderr otherwise.
    """
    parser = argparse.ArgumentParser(prog="python -m sandpit.api.bfcl", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help=f"download bfcl-eval=={BFCL_VERSION} into the cache if missing")
    fetch.add_argument("--cache", type=Path, default=None, help=f"cache directory (default: ${CACHE_ENV} or ~/.cache/sandpit/bfcl)")
    args = parser.parse_args(argv)
    try:
        print(fetch_wheel(args.cache))
    except BfclImportError as exc:
        print(f"bfcl: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
