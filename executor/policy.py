"""Static policy for untrusted Python source: a filter and a synthesis signal, never the
security boundary (the sandbox container is).

Nothing here executes the checked code. The host only calls :func:`ast.parse` and
RestrictedPython's ``compile_restricted_exec`` (which transforms and compiles the tree into
a code object that is thrown away, never run). :func:`check_source` returns a
:class:`PolicyReport`; it raises only for bad *arguments* (a non-``str`` source, an
unknown policy name), never because of what the source contains.

Rules and their severity per named policy (``get_policy(name)``)::

    rule                          strict   standard  audit    what
    syntax-error                  error    error     warning  does not parse or compile (incl. NUL, surrogates)
    too-large                     error    error     warning  source above MAX_SOURCE_BYTES (not parsed)
    too-complex                   error    error     warning  nesting too deep for the parser (Recursion/MemoryError)
    import-not-allowed            error    warning   warning  module outside the allow-list, relative import
    dunder-access                 error    error     warning  x.__globals__, f_back, gi_frame, "__builtins__" literal...
    dunder-dict                   error    warning   warning  x.__dict__
    dynamic-eval                  error    warning   warning  eval / exec / compile / breakpoint
    eval-globals                  warning  info      info     {"__builtins__": ...} in a dict display (a restricted
                                                            globals dict for eval/exec, e.g. tau-bench's calculate)
    dynamic-import                error    error     warning  __import__, importlib.import_module (but below)
    import-call                   error    warning   warning  __import__('m') / importlib.import_module('m'): one
                                                            constant name the allow-list allows
    open-call                     error    warning   warning  open(), io.open(), os.open(), codecs.open()
    dynamic-getattr               error    warning   warning  getattr/setattr/delattr/hasattr with a non-literal name
    builtins-write                error    error     warning  global <builtin>, builtins.x = ..., __builtins__[...] = ...
    restricted-python-error       error    error     warning  a RestrictedPython error not calibrated away (below)
    restricted-python-warning     warning  info      info     a RestrictedPython warning
    restricted-python-calibrated  info     info      info     RestrictedPython errors that are ordinary env code
    restricted-python-incomplete  error    warning   warning  RestrictedPython gave up (RecursionError, ~300 levels)
    python-warning                info     info      info     SyntaxWarning/DeprecationWarning from the parser/compiler
    too-many-findings             info     info      info     the report was cut at MAX_FINDINGS
    init-config-replaces-attribute warning warning   warning  (registration, from the sandbox, not the text) a
                                                            sample init_config key replaces an attribute
                                                            __init__ set to a value of another type

``audit`` is ``standard`` with every error lowered to a warning: it reports, it never fails.

``standard`` refuses only what cannot be legitimate in an environment class (escape chains
through introspection attributes, rebinding builtins, dynamic imports, code that does not
parse); what real third-party environments do (``eval``/``exec`` with restricted globals
in tau-bench's ``calculate``, ``open``, imports outside the allow-list) is a warning. The
code runs in the sandbox either way: the policy is a filter and a synthesis signal.

Decisions:

* Allow-list (:data:`DEFAULT_ALLOWED_IMPORTS`): the brief's pure-computation modules plus
  ``abc`` (LLM-written envs subclass ``ABC``) and ``typing_extensions`` (typing backports;
  whether the sandbox image has it is a separate matter). ``__future__`` is always allowed,
  even with a custom list: it is a compiler directive. A module is allowed when it, or a
  package it is inside, is listed (``collections`` allows ``collections.abc``).
* ``__import__("time")`` (and ``importlib.import_module("time")``) whose one argument is a
  string constant naming a module the allow-list allows, at level 0, is ``import-call`` (a
  warning in ``standard``): it imports what an ``import`` statement could (a released
  EnvScaler environment calls ``__import__('time').time()``). A computed name, a module
  outside the allow-list, a relative level, or a bare ``__import__`` that is not called stay
  ``dynamic-import``.
* ``__class__`` is not flagged: ``self.__class__.__name__`` is common and harmless; the
  escape chain ``().__class__.__bases__[0].__subclasses__()`` is caught on ``__bases__`` and
  ``__subclasses__``. Other dunders outside :data:`DANGEROUS_ATTRIBUTES` (``__name__``,
  ``__init__``, ``__doc__``...) are not flagged either. ``__dict__`` is its own rule
  (``dunder-dict``, a warning in ``standard``): env code uses ``vars(self)``/``__dict__``
  for state dumps, but a module's ``__dict__`` reaches its globals.
* A string constant *equal* to a dangerous name is ``dunder-access`` wherever it stands
  (``getattr(x, "__globals__")``, ``vars(m)["__builtins__"]``, ``attrgetter("f_back")``);
  longer strings such as docstrings that mention one are not.
* A bare ``eval``/``exec``/``compile``/``breakpoint``/``__import__`` is flagged even when it
  is not called (``run = eval``); attributes such as ``re.compile`` are not.
  ``x.import_module`` is ``dynamic-import`` whatever ``x`` is (aliases of ``importlib``).

RestrictedPython calibration. RestrictedPython was designed for Zope's through-the-web
scripts and rejects much ordinary Python; measured on EnvScaler-style classes and BFCL's
multi-turn tool modules it reports hundreds of "errors" per file. Each of these is kept as
one aggregated ``restricted-python-calibrated`` finding per kind (first line, count) instead
of an error, and does not stop RestrictedPython from compiling the rest:

* names and attributes starting with ``_`` (``_helper``, ``self._x``, ``__str__``): private
  helpers and state are ordinary; the dangerous dunders are ``dunder-access`` above;
* names ending in ``__roles__``: Zope security declarations, meaningless here;
* annotated assignments (dataclass fields, ``self.x: int = 0``), which RestrictedPython 9
  does not model at all;
* augmented assignment to attributes and items (``self.count += 1``, ``d[k] += 1``): plain
  state mutation, refused only because RestrictedPython's write guards do not cover it;
* ``match``, ``try/except*`` and ``nonlocal``: standard syntax RestrictedPython has no
  runtime guard for, harmless without that runtime;
* ``metaclass=`` keywords (``class Tool(metaclass=ABCMeta)``).

Not calibrated (they stay ``restricted-python-error``): async functions (a coroutine is
useless as an EnvScaler tool result), ``*`` imports, the reserved names ``print``,
``printed`` and ``builtins`` when bound or read (``import builtins``), and anything
RestrictedPython reports that is not listed above. RestrictedPython's own ``exec``/``eval``
and frame-attribute errors duplicate ``dynamic-eval``/``dunder-access`` and are dropped
when that rule already reported the same line. Its warnings (``print`` without reading
``printed``) are ``restricted-python-warning`` (info in ``standard``). Patterns of ``case``
clauses are left as written (RestrictedPython's rewrites would not compile there); the
policy's own rules still see them. RestrictedPython's compile step is what finds
compile-time-only errors (``return`` outside a function, a misplaced ``from __future__``),
so those show up as ``syntax-error`` only when no uncalibrated RestrictedPython error
stops it from compiling.

RestrictedPython's visitor is recursive and gives up around 300 nested levels (e.g. a
300-term ``a + b + ...``): that is ``restricted-python-incomplete``, a warning in
``standard`` because the policy's own rules are iterative and always cover the whole tree.

Bounds: sources above :data:`MAX_SOURCE_BYTES` (UTF-8) are not parsed; parser and
RestrictedPython failures on hostile input (``RecursionError``, ``MemoryError``, NUL
bytes, lone surrogates) become findings; at most :data:`MAX_FINDINGS` findings are listed
(errors first, then warnings, then info, each by position) plus one ``too-many-findings``.
Python warnings raised while parsing and compiling are captured under a process-wide lock
(the :mod:`warnings` filters are global state; the work is CPU-bound under the GIL anyway,
so checks running one at a time cost no throughput) and become ``python-warning`` findings.
Cost: roughly 3-5 s per MiB of source (ast + RestrictedPython), so 2 MiB stays under ~10 s.
"""

from __future__ import annotations

import ast
import builtins
import re
import threading
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from RestrictedPython.compile import compile_restricted_exec
from RestrictedPython.transformer import RestrictingNodeTransformer

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")

MAX_SOURCE_BYTES = 2 * 1024 * 1024
"""Sources larger than this (UTF-8 bytes) get one ``too-large`` finding and are not parsed."""
MAX_FINDINGS = 500
"""At most this many findings are listed; a ``too-many-findings`` finding says how many more."""
MAX_MESSAGE_CHARS = 300
"""Messages are cut to this length (names in hostile sources can be megabytes long)."""

RULES: Mapping[str, str] = MappingProxyType({
    "syntax-error": "the source does not parse or compile",
    "too-large": f"the source is above {MAX_SOURCE_BYTES} bytes and was not parsed",
    "too-complex": "the source nests too deeply to be analysed",
    "import-not-allowed": "an import outside the policy's allow-list (or a relative import)",
    "dunder-access": "access to an introspection attribute that leads out of the object model",
    "dunder-dict": "access to __dict__",
    "dynamic-eval": "eval, exec, compile or breakpoint",
    "eval-globals": "a dict display with a '__builtins__' key (restricted globals for eval/exec)",
    "dynamic-import": "__import__ or importlib.import_module",
    "open-call": "opening a file",
    "dynamic-getattr": "getattr/setattr/delattr/hasattr with a computed attribute name",
    "builtins-write": "rebinding or mutating builtins",
    "restricted-python-error": "an error reported by RestrictedPython",
    "restricted-python-warning": "a warning reported by RestrictedPython",
    "restricted-python-calibrated": "RestrictedPython errors that are ordinary environment code",
    "restricted-python-incomplete": "RestrictedPython gave up (nesting too deep for its recursive visitor)",
    "python-warning": "a SyntaxWarning or DeprecationWarning from the parser or compiler",
    "too-many-findings": f"more than {MAX_FINDINGS} findings; the rest are counted, not listed",
    "import-call": "__import__ or importlib.import_module of one constant module name the allow-list allows",
    "init-config-replaces-attribute": "a sample init_config key replaces an attribute the constructor set to a "
                                      "value of another type (found at registration, in the sandbox)",
})
"""Every rule id -> what it means. Rule ids are stable."""

DEFAULT_ALLOWED_IMPORTS: frozenset[str] = frozenset({
    "typing", "dataclasses", "datetime", "time", "uuid", "re", "math", "random", "json", "copy",
    "collections", "itertools", "functools", "enum", "decimal", "string", "hashlib", "statistics",
    "abc", "typing_extensions",
})
"""Modules an environment may import (with their submodules); ``__future__`` is always allowed."""

DANGEROUS_ATTRIBUTES: frozenset[str] = frozenset({
    "__subclasses__", "__globals__", "__builtins__", "__code__", "__closure__", "__func__",
    "__self__", "__bases__", "__mro__", "__base__", "__import__", "__loader__", "__spec__",
    "f_globals", "f_locals", "f_back", "f_builtins", "f_code", "gi_frame", "gi_code", "cr_frame",
    "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next",
})
"""Attribute names that are ``dunder-access`` (as attributes and as exact string constants)."""

_STANDARD: dict[str, Severity] = {
    "syntax-error": "error", "too-large": "error", "too-complex": "error",
    "import-not-allowed": "warning", "dunder-access": "error", "dunder-dict": "warning",
    "dynamic-eval": "warning", "eval-globals": "info", "dynamic-import": "error", "open-call": "warning",
    "dynamic-getattr": "warning", "builtins-write": "error",
    "restricted-python-error": "error", "restricted-python-warning": "info",
    "restricted-python-calibrated": "info", "restricted-python-incomplete": "warning",
    "python-warning": "info", "too-many-findings": "info",
    "import-call": "warning", "init-config-replaces-attribute": "warning",
}
_STRICT: dict[str, Severity] = _STANDARD | {
    "dynamic-eval": "error", "eval-globals": "warning", "import-call": "error",
    "import-not-allowed": "error", "dunder-dict": "error", "open-call": "error",
    "dynamic-getattr": "error", "restricted-python-warning": "warning", "restricted-python-incomplete": "error",
}
_AUDIT: dict[str, Severity] = {rule: "warning" if sev == "error" else sev for rule, sev in _STANDARD.items()}
_TABLES: dict[str, dict[str, Severity]] = {"strict": _STRICT, "standard": _STANDARD, "audit": _AUDIT}
POLICY_NAMES: tuple[str, ...] = tuple(_TABLES)

_EVAL_NAMES = frozenset({"eval", "exec", "compile", "breakpoint"})
_GETATTR_NAMES = frozenset({"getattr", "setattr", "delattr", "hasattr"})
_OPEN_MODULES = frozenset({"io", "os", "codecs", "builtins"})
_BUILTIN_NAMES = frozenset(dir(builtins))
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


# -- results ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Finding:
    """One policy finding.

    Attributes:
        rule: a stable rule id, one of :data:`RULES`.
        line: 1-based line, or None when unknown (e.g. ``too-large``).
        col: 0-based column in characters (not ast's UTF-8 byte offset), or None.
        message: what was found, at most :data:`MAX_MESSAGE_CHARS` characters.
        severity: ``"error"``, ``"warning"`` or ``"info"``, as the policy maps ``rule``.
    """

    rule: str
    line: int | None
    col: int | None
    message: str
    severity: Severity

    def to_dict(self) -> dict[str, Any]:
        """``{"rule", "line", "col", "message", "severity"}`` (JSON-able)."""
        return {"rule": self.rule, "line": self.line, "col": self.col, "message": self.message,
                "severity": self.severity}


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """The result of :func:`check_source`.

    Attributes:
        policy: the policy's name (``"standard"``...).
        findings: sorted by (line, col), unknown positions last; at most
            :data:`MAX_FINDINGS` plus a final ``too-many-findings`` finding.
        errors: number of error-severity findings, counting those beyond the cap.
        warnings: number of warning-severity findings, counting those beyond the cap.
    """

    policy: str
    findings: tuple[Finding, ...]
    errors: int
    warnings: int

    @property
    def passed(self) -> bool:
        """True when there is no error-severity finding."""
        return self.errors == 0

    def extended(self, rule: str, found: Iterable[tuple[int | None, int | None, str]]) -> PolicyReport:
        """A copy with one finding of ``rule`` per ``(line, col, message)`` of ``found``:
        for findings made elsewhere than in the text (``init-config-replaces-attribute``:
        at registration, reported by the sandbox). Severity as the named policy maps
        ``rule`` (``standard``'s when ``policy`` names no built-in policy); messages cut to
        :data:`MAX_MESSAGE_CHARS`; findings sorted by position as :func:`check_source`
        sorts them (``too-many-findings`` stays last). Raises KeyError for a rule not in
        :data:`RULES`."""
        table = _TABLES.get(self.policy, _STANDARD)
        severity = table[rule]
        added = tuple(Finding(rule, line, col, message if len(message) <= MAX_MESSAGE_CHARS
                              else message[: MAX_MESSAGE_CHARS - 3] + "...", severity)
                      for line, col, message in found)
        if not added:
            return self
        findings = sorted(self.findings + added, key=lambda f: (f.rule == "too-many-findings", _position_key(f)))
        return PolicyReport(self.policy, tuple(findings), self.errors + len(added) * (severity == "error"),
                            self.warnings + len(added) * (severity == "warning"))

    def to_dict(self) -> dict[str, Any]:
        """``{"policy", "passed", "errors", "warnings", "findings": [Finding.to_dict()...]}``."""
        return {"policy": self.policy, "passed": self.passed, "errors": self.errors,
                "warnings": self.warnings, "findings": [f.to_dict() for f in self.findings]}


# -- policies -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    """A named mapping rule -> severity plus an import allow-list.

    Attributes:
        name: reported as ``PolicyReport.policy``.
        severities: every rule of :data:`RULES` -> its severity (read-only after creation).
        allowed_imports: dotted module names allowed with their submodules.

    Raises:
        ValueError: (on creation) a rule of :data:`RULES` is missing or unknown, a severity
            is not one of :data:`SEVERITIES`, or an allowed module is not a dotted name.
    """

    name: str
    severities: Mapping[str, Severity] = field(hash=False)
    allowed_imports: frozenset[str] = DEFAULT_ALLOWED_IMPORTS

    def __post_init__(self) -> None:
        missing, unknown = set(RULES) - set(self.severities), set(self.severities) - set(RULES)
        if missing or unknown:
            raise ValueError(f"policy {self.name!r}: missing rules {sorted(missing)}, unknown rules {sorted(unknown)}")
        bad = {rule: sev for rule, sev in self.severities.items() if sev not in SEVERITIES}
        if bad:
            raise ValueError(f"policy {self.name!r}: severities must be one of {SEVERITIES}, got {bad}")
        modules = frozenset(self.allowed_imports)
        invalid = sorted(m for m in modules if not isinstance(m, str) or not _MODULE_NAME.match(m))
        if invalid:
            raise ValueError(f"policy {self.name!r}: not dotted module names: {invalid!r}")
        object.__setattr__(self, "severities", MappingProxyType(dict(self.severities)))
        object.__setattr__(self, "allowed_imports", modules)

    def severity(self, rule: str) -> Severity:
        """The severity of ``rule``. Raises KeyError for a rule not in :data:`RULES`."""
        return self.severities[rule]

    def allows_import(self, module: str) -> bool:
        """True when ``module`` (dotted) or a package containing it is allowed, or it is
        ``__future__``."""
        parts = module.split(".")
        return module == "__future__" or any(".".join(parts[:i]) in self.allowed_imports
                                             for i in range(1, len(parts) + 1))

    def with_allowed_imports(self, modules: Iterable[str]) -> Policy:
        """A copy whose allow-list is exactly ``modules`` (extend with
        ``policy.allowed_imports | {...}``). Raises ValueError for a non-dotted name."""
        return Policy(self.name, self.severities, frozenset(modules))


def get_policy(name: str, *, allowed_imports: Iterable[str] | None = None) -> Policy:
    """The named policy (``"strict"``, ``"standard"`` or ``"audit"``), with
    :data:`DEFAULT_ALLOWED_IMPORTS` unless ``allowed_imports`` replaces it.

    Raises:
        ValueError: unknown name (the message lists the valid ones), or an allowed module
            that is not a dotted name.
    """
    if name not in _TABLES:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    modules = DEFAULT_ALLOWED_IMPORTS if allowed_imports is None else frozenset(allowed_imports)
    return Policy(name, _TABLES[name], modules)


# -- entry point --------------------------------------------------------------------------
def check_source(source: str, policy: str | Policy = "standard", *, filename: str = "<environment>") -> PolicyReport:
    """Check untrusted Python ``source`` statically (it is parsed, never executed).

    Args:
        source: the module text.
        policy: a policy name (see :func:`get_policy`) or a :class:`Policy`.
        filename: shown in RestrictedPython's compile and in captured warnings only.

    Returns:
        A :class:`PolicyReport`; ``passed`` is False when any finding is an error.
        Hostile input (oversized, too deeply nested, NUL bytes, lone surrogates, floods of
        findings) yields findings, never an exception.

    Raises:
        TypeError: ``source`` is not a ``str`` or ``policy`` is neither a name nor a Policy.
        ValueError: ``policy`` names no known policy.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be str, not {type(source).__name__}")
    if isinstance(policy, str):
        policy = get_policy(policy)
    elif not isinstance(policy, Policy):
        raise TypeError(f"policy must be a name or a Policy, not {type(policy).__name__}")
    sink = _Sink(policy, source)
    size = _utf8_size(source)
    if size > MAX_SOURCE_BYTES:
        sink.add("too-large", None, None, f"source is {size} bytes or more, over the {MAX_SOURCE_BYTES}-byte limit; not parsed")
        return sink.report()
    with _WARNINGS_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = _parse(source, filename, sink)
        if tree is not None:
            _AstChecker(policy, sink).check(tree)
            _restricted_python(tree, filename, sink)
    for warning in caught:
        if warning.filename == filename and issubclass(warning.category, (SyntaxWarning, DeprecationWarning)):
            sink.add("python-warning", warning.lineno, None, f"{warning.category.__name__}: {warning.message}")
        else:  # another thread's warning caught in our window: hand it back
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return sink.report()


_WARNINGS_LOCK = threading.Lock()


def _utf8_size(source: str) -> int:
    """UTF-8 size of ``source``, or its length when that alone is over the limit."""
    if len(source) > MAX_SOURCE_BYTES:
        return len(source)
    return len(source.encode("utf-8", "surrogatepass"))


def _parse(source: str, filename: str, sink: _Sink) -> ast.Module | None:
    """``ast.parse``, with every way it can fail on hostile text turned into a finding."""
    line: int | None
    col: int | None
    try:
        return ast.parse(source, filename=filename)
    except SyntaxError as exc:
        if "\x00" in source:
            line, col = sink.position_of(source.index("\x00"))
            sink.add("syntax-error", line, col, "source contains a NUL byte")
        else:
            col = exc.offset - 1 if exc.offset else None
            sink.add("syntax-error", exc.lineno, col, f"{type(exc).__name__}: {exc.msg}")
    except UnicodeError as exc:  # lone surrogates cannot be encoded to UTF-8
        start = getattr(exc, "start", None)
        line, col = sink.position_of(start) if isinstance(start, int) else (None, None)
        sink.add("syntax-error", line, col, "source is not valid Unicode text (lone surrogate)")
    except ValueError as exc:  # older Pythons: "source code string cannot contain null bytes"
        sink.add("syntax-error", None, None, f"source does not parse: {exc}")
    except (RecursionError, MemoryError) as exc:
        sink.add("too-complex", None, None, f"source nests too deeply to parse ({type(exc).__name__})")
    return None


# -- collecting findings ------------------------------------------------------------------
_RANK: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


def _position_key(finding: Finding) -> tuple[bool, int, int]:
    return (finding.line is None, finding.line or 0, finding.col or 0)


class _Sink:
    """Findings with bounded memory: per severity, only the first MAX_FINDINGS by position
    are kept (re-trimmed whenever a list doubles); the totals count everything."""

    def __init__(self, policy: Policy, source: str) -> None:
        self.policy = policy
        self.source = source
        self.kept: dict[str, list[Finding]] = {sev: [] for sev in SEVERITIES}
        self.totals: dict[str, int] = dict.fromkeys(SEVERITIES, 0)
        self.lines_by_rule: dict[str, set[int | None]] = {}
        self._lines: list[str] | None = None

    def add(self, rule: str, line: int | None, col: int | None, message: str) -> None:
        severity = self.policy.severity(rule)
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        self.totals[severity] += 1
        self.lines_by_rule.setdefault(rule, set()).add(line)
        kept = self.kept[severity]
        kept.append(Finding(rule, line, col, message, severity))
        if len(kept) >= 2 * MAX_FINDINGS:
            kept.sort(key=_position_key)
            del kept[MAX_FINDINGS:]

    def add_node(self, rule: str, node: ast.AST, message: str) -> None:
        """A finding at ``node``; for ``x.attr``, at ``attr`` itself (where the chain is)."""
        line: int | None
        col: int | None
        if isinstance(node, ast.Attribute) and node.end_lineno is not None and node.end_col_offset is not None:
            line, col = node.end_lineno, node.end_col_offset - len(node.attr.encode("utf-8", "surrogatepass"))
        else:
            line, col = getattr(node, "lineno", None), getattr(node, "col_offset", None)
        self.add(rule, line, self.char_col(line, col), message)

    def char_col(self, line: int | None, byte_col: int | None) -> int | None:
        """ast's UTF-8 byte offset -> a character offset in that line."""
        if line is None or byte_col is None:
            return byte_col
        if self._lines is None:
            self._lines = self.source.split("\n")
        if not 0 < line <= len(self._lines) or self._lines[line - 1].isascii():
            return byte_col
        encoded = self._lines[line - 1].encode("utf-8", "surrogatepass")
        return len(encoded[:byte_col].decode("utf-8", "replace"))

    def position_of(self, index: int) -> tuple[int, int]:
        """(1-based line, 0-based col) of the character at ``index`` of the source."""
        line = self.source.count("\n", 0, index) + 1
        return line, index - (self.source.rfind("\n", 0, index) + 1)

    def report(self) -> PolicyReport:
        chosen: list[Finding] = []
        for severity in SEVERITIES:
            self.kept[severity].sort(key=_position_key)
            chosen += self.kept[severity][: MAX_FINDINGS - len(chosen)]
        chosen.sort(key=_position_key)
        total = sum(self.totals.values())
        if total > len(chosen):
            left = total - len(chosen)
            counts = ", ".join(f"{n} {sev}" for sev, n in self.totals.items() if n)
            chosen.append(Finding("too-many-findings", None, None,
                                  f"{left} more findings not listed (totals: {counts}); listed: the first "
                                  f"{MAX_FINDINGS} by severity, then position",
                                  self.policy.severity("too-many-findings")))
        return PolicyReport(self.policy.name, tuple(chosen), self.totals["error"], self.totals["warning"])


# -- AST rules ----------------------------------------------------------------------------
class _AstChecker:
    """The policy's own rules. Iterative (``ast.walk``), so deep trees cannot exhaust the
    stack here."""

    def __init__(self, policy: Policy, sink: _Sink) -> None:
        self.policy = policy
        self.sink = sink
        self.builtins_aliases = {"builtins", "__builtins__"}
        self.called: set[int] = set()
        self.import_calls: set[int] = set()
        """id() of the callee of an ``import-call`` (not ``dynamic-import`` then)."""
        self.globals_keys: set[int] = set()
        """id() of ``"__builtins__"`` keys of dict displays (``eval-globals``, not ``dunder-access``)."""

    def check(self, tree: ast.Module) -> None:
        handlers = self._HANDLERS
        todo = [(handlers[type(node)], node) for node in ast.walk(tree) if type(node) in handlers]
        for _handler, node in todo:  # aliases first: `import builtins as b` may follow its use
            if isinstance(node, ast.Import):
                self.builtins_aliases.update(a.asname for a in node.names if a.name == "builtins" and a.asname)
        for handler, node in todo:
            handler(self, node)

    def _import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not self.policy.allows_import(alias.name):
                self.sink.add_node("import-not-allowed", node, f"import of {alias.name!r} (not in the allow-list)")

    def _import_from(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.sink.add_node("import-not-allowed", node, f"relative import from {'.' * node.level}{module}")
        elif not self.policy.allows_import(module):
            self.sink.add_node("import-not-allowed", node, f"import from {module!r} (not in the allow-list)")
        for alias in node.names:
            if module == "builtins" and alias.name in _EVAL_NAMES:
                self.sink.add_node("dynamic-eval", node, f"import of {alias.name} from builtins")
            elif alias.name in ("import_module", "__import__"):
                self.sink.add_node("dynamic-import", node, f"import of {alias.name} from {module}")

    def _call(self, node: ast.Call) -> None:
        func = node.func
        self.called.add(id(func))
        module = self._imported_module(node)
        if module is not None:
            self.import_calls.add(id(func))
            callee = "__import__" if isinstance(func, ast.Name) else "import_module"
            self.sink.add_node("import-call", node, f"call to {callee}({module!r}), a module the allow-list allows")
        if isinstance(func, ast.Name) and func.id in _GETATTR_NAMES:
            self._getattr_call(node, func.id, node.args[1] if len(node.args) > 1 else None)
        elif isinstance(func, ast.Attribute) and func.attr == "__getattribute__":
            self._getattr_call(node, "__getattribute__", node.args[-1] if node.args else None)
        if (isinstance(func, ast.Name) and func.id == "open") or (
                isinstance(func, ast.Attribute) and func.attr == "open" and isinstance(func.value, ast.Name)
                and (func.value.id in _OPEN_MODULES or func.value.id in self.builtins_aliases)):
            where = f"{func.value.id}." if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            self.sink.add_node("open-call", node, f"call to {where}open()")

    def _imported_module(self, node: ast.Call) -> str | None:
        """The module ``node`` imports when it is ``__import__("m", ...)`` or
        ``x.import_module("m")`` with ``m`` a string constant the allow-list allows and no
        relative level (``level`` absent or the constant 0, no ``*``/``**`` arguments that
        could hide one); else None (the call stays ``dynamic-import``)."""
        func, args = node.func, node.args
        if isinstance(func, ast.Name) and func.id == "__import__":
            extra = [k for k in node.keywords if k.arg not in ("globals", "locals", "fromlist")]
            if not 1 <= len(args) <= 5 or any(isinstance(a, ast.Starred) for a in args):
                return None
            levels = [args[4]] if len(args) == 5 else [k.value for k in extra if k.arg == "level"]
            if any(k.arg != "level" for k in extra) or not all(
                    isinstance(v, ast.Constant) and type(v.value) is int and v.value == 0 for v in levels):
                return None
        elif isinstance(func, ast.Attribute) and func.attr == "import_module":
            if len(args) != 1 or node.keywords or isinstance(args[0], ast.Starred):
                return None
        else:
            return None
        name = args[0]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and _MODULE_NAME.match(name.value)):
            return None
        return name.value if self.policy.allows_import(name.value) and name.value != "__future__" else None

    def _getattr_call(self, node: ast.Call, name: str, attr: ast.expr | None) -> None:
        if name in ("setattr", "delattr") and node.args and self._is_builtins(node.args[0]):
            self.sink.add_node("builtins-write", node, f"{name}() on the builtins module")
        if attr is None or isinstance(attr, ast.Starred) or not (
                isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
            self.sink.add_node("dynamic-getattr", node, f"{name}() with a computed attribute name")

    def _name(self, node: ast.Name) -> None:
        verb = "call to" if id(node) in self.called else "reference to"
        if isinstance(node.ctx, ast.Store) and node.id == "__builtins__":
            self.sink.add_node("builtins-write", node, "assignment to __builtins__")
        elif not isinstance(node.ctx, ast.Load):
            return
        elif node.id in _EVAL_NAMES:
            self.sink.add_node("dynamic-eval", node, f"{verb} {node.id}")
        elif node.id == "__import__":
            if id(node) not in self.import_calls:
                self.sink.add_node("dynamic-import", node, f"{verb} __import__")
        elif node.id.startswith("__") and node.id in DANGEROUS_ATTRIBUTES:
            self.sink.add_node("dunder-access", node, f"reference to {node.id}")

    def _attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr == "__import__":
            self.sink.add_node("dynamic-import", node, "access to __import__")
        elif attr in DANGEROUS_ATTRIBUTES:
            self.sink.add_node("dunder-access", node, f"access to attribute {attr}")
        elif attr == "__dict__":
            self.sink.add_node("dunder-dict", node, "access to attribute __dict__")
        elif attr == "import_module":
            if id(node) not in self.import_calls:
                self.sink.add_node("dynamic-import", node, "access to import_module")
        elif attr in _EVAL_NAMES and self._is_builtins(node.value):
            self.sink.add_node("dynamic-eval", node, f"access to builtins.{attr}")

    def _dict(self, node: ast.Dict) -> None:
        for key in node.keys:
            if isinstance(key, ast.Constant) and key.value == "__builtins__":
                self.globals_keys.add(id(key))
                self.sink.add_node("eval-globals", key, "a '__builtins__' key in a dict display (restricted "
                                                        "globals for eval/exec)")

    def _constant(self, node: ast.Constant) -> None:
        if id(node) in self.globals_keys:
            return
        if isinstance(node.value, str) and node.value in DANGEROUS_ATTRIBUTES:
            self.sink.add_node("dunder-access", node, f"string literal {node.value!r} (usable with getattr or subscripts)")

    def _global(self, node: ast.Global) -> None:
        for name in node.names:
            if name in _BUILTIN_NAMES:
                self.sink.add_node("builtins-write", node, f"global statement naming the builtin {name!r}")

    def _targets(self, node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete | ast.For | ast.withitem) -> None:
        if isinstance(node, ast.Assign | ast.Delete):
            stack = list(node.targets)
        elif isinstance(node, ast.withitem):
            stack = [node.optional_vars] if node.optional_vars is not None else []
        else:
            stack = [node.target]
        while stack:
            target = stack.pop()
            if isinstance(target, ast.Tuple | ast.List):
                stack.extend(target.elts)
            elif isinstance(target, ast.Starred):
                stack.append(target.value)
            elif isinstance(target, ast.Attribute | ast.Subscript) and self._is_builtins(target.value, chain=True):
                self.sink.add_node("builtins-write", target, "write to the builtins module or __builtins__")

    def _is_builtins(self, node: ast.expr, *, chain: bool = False) -> bool:
        """``node`` is the builtins module (by name or alias) or ``__builtins__``; with
        ``chain``, also anything reached from it (``builtins.__dict__[...]``, ``vars(builtins)``)."""
        while True:
            if isinstance(node, ast.Name):
                return node.id in self.builtins_aliases
            if not chain:
                return False
            if isinstance(node, ast.Attribute | ast.Subscript):
                node = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "vars" and node.args:
                node = node.args[0]
            else:
                return False

    _HANDLERS: Mapping[type, Any] = {
        ast.Import: _import, ast.ImportFrom: _import_from, ast.Call: _call, ast.Name: _name,
        ast.Attribute: _attribute, ast.Dict: _dict, ast.Constant: _constant, ast.Global: _global,
        ast.Assign: _targets, ast.AugAssign: _targets, ast.AnnAssign: _targets, ast.Delete: _targets,
        ast.For: _targets, ast.AsyncFor: _targets, ast.withitem: _targets,
    }


# -- RestrictedPython ---------------------------------------------------------------------
_CALIBRATED: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(pattern), kind, reason) for pattern, kind, reason in (
        (r'is an invalid (variable|attribute) name because it starts with "_"', "private-name",
         "private helpers and state are ordinary; dangerous dunders are checked by dunder-access"),
        (r'ends with "__roles__"', "zope-roles", "Zope security declarations mean nothing here"),
        (r"^AnnAssign statement", "annotated-assignment", "dataclass fields and typed assignments"),
        (r"^Augmented assignment of", "augmented-assignment", "in-place state updates such as self.n += 1"),
        (r"^(Match|TryStar|Nonlocal) statement", "unmodelled-syntax",
         "match, except* and nonlocal are standard syntax RestrictedPython has no guards for"),
        (r'keyword argument "metaclass"', "metaclass", "class X(metaclass=ABCMeta)"),
    ))
_COVERED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(Exec|Eval) calls are not allowed"), "dynamic-eval"),
    (re.compile(r'^"breakpoint" is a reserved name'), "dynamic-eval"),
    (re.compile(r"is a restricted name, that is forbidden to access"), "dunder-access"),
)


@dataclass
class _Calibrated:
    """Occurrences of one calibrated kind: how many, on which lines, the earliest message."""

    count: int = 0
    lines: set[int] = field(default_factory=set)
    first: tuple[int, str] | None = None


@dataclass
class _Notes:
    """What the transformer reported: errors and warnings as (line, byte col, message)."""

    errors: list[tuple[int | None, int | None, str]] = field(default_factory=list)
    warnings: list[tuple[int | None, int | None, str]] = field(default_factory=list)
    calibrated: dict[str, _Calibrated] = field(default_factory=dict)


class _CalibratedTransformer(RestrictingNodeTransformer):
    """RestrictedPython's transformer whose calibrated errors are recorded as notes instead
    of errors (so the rest still compiles), and which walks syntax it does not model
    instead of deleting it. A per-call subclass (:func:`_transformer_for`) sets ``notes``."""

    notes: _Notes

    def error(self, node: ast.AST, info: str) -> None:
        line, col = getattr(node, "lineno", None), getattr(node, "col_offset", None)
        for pattern, kind, _reason in _CALIBRATED:
            if pattern.search(info):
                seen = self.notes.calibrated.setdefault(kind, _Calibrated())
                seen.count += 1
                if line is not None:
                    seen.lines.add(line)
                    if seen.first is None or line < seen.first[0]:
                        seen.first = (line, info)
                return
        self.notes.errors.append((line, col, info))
        super().error(node, info)

    def warn(self, node: ast.AST, info: str) -> None:
        self.notes.warnings.append((getattr(node, "lineno", None), getattr(node, "col_offset", None), info))
        super().warn(node, info)

    def generic_visit(self, node: ast.AST) -> Any:
        if isinstance(node, ast.AnnAssign):
            self.error(node, "AnnAssign statements are not allowed.")
            return self.node_contents_visit(node)
        if isinstance(node, ast.pattern):
            return node  # left as written: rewriting names in patterns would not compile
        return super().generic_visit(node)

    def visit_Match(self, node: ast.Match) -> Any:
        self.error(node, "Match statements are not allowed.")
        node.subject = self.visit(node.subject)
        for case in node.cases:  # the guard and the body, around the pattern
            pattern, case.pattern = case.pattern, ast.MatchAs()
            self.node_contents_visit(case)
            case.pattern = pattern
        return node

    def visit_TryStar(self, node: ast.AST) -> Any:
        self.error(node, "TryStar statements are not allowed.")
        return self.node_contents_visit(node)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> Any:
        self.error(node, "Nonlocal statements are not allowed.")
        return node


def _transformer_for(notes: _Notes) -> type[_CalibratedTransformer]:
    # compile_restricted_exec instantiates the policy class itself: pass the notes on it.
    return type("_CallTransformer", (_CalibratedTransformer,), {"notes": notes})


def _restricted_python(tree: ast.Module, filename: str, sink: _Sink) -> None:
    """Run RestrictedPython's transform + compile over ``tree`` (mutated; the resulting
    code object is discarded) and turn its reports into findings."""
    notes = _Notes()
    try:  # the CompileResult (its code object) is dropped: never executed
        compile_restricted_exec(tree, filename=filename, policy=_transformer_for(notes))
    except SyntaxError as exc:  # compile-time only errors: 'return' outside function, ...
        sink.add("syntax-error", exc.lineno, exc.offset - 1 if exc.offset else None, f"SyntaxError: {exc.msg}")
    except (RecursionError, MemoryError) as exc:  # its visitor recurses: ~300 nested levels
        sink.add("restricted-python-incomplete", None, None,
                 f"RestrictedPython could not analyse the source ({type(exc).__name__}: nesting too deep); "
                 "the policy's own rules did")
    except Exception as exc:  # RestrictedPython failing on hostile input is a finding, not a 500
        sink.add("restricted-python-error", None, None, f"RestrictedPython failed: {type(exc).__name__}: {exc}")
    for line, col, info in notes.errors:
        covered = next((rule for pattern, rule in _COVERED if pattern.search(info)), None)
        if covered is None or line not in sink.lines_by_rule.get(covered, ()):
            sink.add("restricted-python-error", line, sink.char_col(line, col), f"RestrictedPython: {info}")
    for line, col, info in notes.warnings:
        sink.add("restricted-python-warning", line, sink.char_col(line, col), f"RestrictedPython: {info}")
    reasons = {kind: reason for _pattern, kind, reason in _CALIBRATED}
    for kind, seen in notes.calibrated.items():
        lines = sorted(seen.lines)
        shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
        first_line, first = seen.first if seen.first is not None else (None, "")
        sink.add("restricted-python-calibrated", first_line, None,
                 f"RestrictedPython {kind} ({seen.count}x, lines {shown or '?'}): allowed, {reasons[kind]}; "
                 f"first: {first}")
