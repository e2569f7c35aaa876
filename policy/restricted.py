"""RestrictedPython's transform and compile over the tree (the code object is discarded,
never run), with the errors that are ordinary environment code calibrated into notes:
:func:`restricted_python`."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from RestrictedPython.compile import compile_restricted_exec
from RestrictedPython.transformer import RestrictingNodeTransformer

from .findings import Sink

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


def restricted_python(tree: ast.Module, filename: str, sink: Sink) -> None:
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
