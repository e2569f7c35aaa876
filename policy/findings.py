"""Collecting findings with bounded memory (:class:`Sink`) and parsing hostile text into a
tree or a finding (:func:`parse`)."""

from __future__ import annotations

import ast
import threading

from .rules import (
    MAX_FINDINGS,
    MAX_MESSAGE_CHARS,
    MAX_SOURCE_BYTES,
    SEVERITIES,
    Finding,
    Policy,
    PolicyReport,
    position_key,
)

WARNINGS_LOCK = threading.Lock()
"""Held while a check captures Python warnings: the :mod:`warnings` filters are process-wide
state (see :func:`sandpit.policy.check_source`)."""


def utf8_size(source: str) -> int:
    """UTF-8 size of ``source``, or its length when that alone is over the limit."""
    if len(source) > MAX_SOURCE_BYTES:
        return len(source)
    return len(source.encode("utf-8", "surrogatepass"))


def parse(source: str, filename: str, sink: Sink) -> ast.Module | None:
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


class Sink:
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
            kept.sort(key=position_key)
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
            self.kept[severity].sort(key=position_key)
            chosen += self.kept[severity][: MAX_FINDINGS - len(chosen)]
        chosen.sort(key=position_key)
        total = sum(self.totals.values())
        if total > len(chosen):
            left = total - len(chosen)
            counts = ", ".join(f"{n} {sev}" for sev, n in self.totals.items() if n)
            chosen.append(Finding("too-many-findings", None, None,
                                  f"{left} more findings not listed (totals: {counts}); listed: the first "
                                  f"{MAX_FINDINGS} by severity, then position",
                                  self.policy.severity("too-many-findings")))
        return PolicyReport(self.policy.name, tuple(chosen), self.totals["error"], self.totals["warning"])
