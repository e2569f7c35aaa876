"""The policy's vocabulary: rule ids and what they mean, the three named severity tables,
and the result types (:class:`Finding`, :class:`PolicyReport`, :class:`Policy`).
Nothing here looks at source text; :func:`sandpit.policy.check_source` does."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

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

MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
"""A dotted module name (what an allow-list entry and a constant import name must be)."""


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
        findings = sorted(self.findings + added, key=lambda f: (f.rule == "too-many-findings", position_key(f)))
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
        invalid = sorted(m for m in modules if not isinstance(m, str) or not MODULE_NAME.match(m))
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


def position_key(finding: Finding) -> tuple[bool, int, int]:
    """Sort key of findings: by (line, col), unknown positions last."""
    return (finding.line is None, finding.line or 0, finding.col or 0)
