"""The static policy as the API uses it (:mod:`sandpit.policy`): check code, summarize a
report in one line for error messages, and word the sandbox's findings of a registration
(:func:`retyped_findings`)."""

from __future__ import annotations

import ast

from sandpit.policy import PolicyReport, check_source

__all__ = ["check_source", "policy_summary", "retyped_findings"]


def policy_summary(report: PolicyReport, limit: int = 5) -> str:
    """``"2 error(s): line 3:4 dunder-access: ...; ..."`` (first ``limit`` errors)."""
    errors = [f for f in report.findings if f.severity == "error"]
    parts = [f"line {f.line}:{f.col} {f.rule}: {f.message}" for f in errors[:limit]]
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return f"{len(errors)} error(s): " + "; ".join(parts) + more


def retyped_findings(source_code: str, class_name: str,
                     retyped: list[dict[str, str]]) -> list[tuple[int | None, int | None, str]]:
    """``(line, col, message)`` per config key the sandbox reported as replacing an
    attribute ``__init__`` set to a value of another type (``[{"key", "constructed",
    "config"}]``, ``child_instance.retyped_attributes``), for
    ``PolicyReport.extended("init-config-replaces-attribute", ...)``. The position is the
    first ``self.<key> = ...`` in ``class_name``'s ``__init__`` (found with
    :func:`ast.parse`; nothing is executed), else unknown (None)."""
    if not retyped:
        return []
    lines = _init_assignments(source_code, class_name)
    found: list[tuple[int | None, int | None, str]] = []
    for entry in retyped:
        key, constructed, config = entry["key"], entry["constructed"], entry["config"]
        line, col = lines.get(key, (None, None))
        found.append((line, col, f"sample_init_config key {key!r} replaces self.{key}, which __init__ set to a "
                                 f"{constructed}, with a {config}: EnvScaler sets every init_config key over what "
                                 f"the constructor made, so tools get the {config} (keep the converted value under "
                                 "another name, or give the key in its constructed form)"))
    return found


def _init_assignments(source_code: str, class_name: str) -> dict[str, tuple[int, int]]:
    """Attribute name -> (1-based line, 0-based character column) of its first
    ``self.<name> = ...`` (plain, annotated, augmented or in a tuple target) in
    ``class_name.__init__``; ``{}`` when the source does not parse or has no such class or
    method."""
    try:
        tree = ast.parse(source_code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    inits = [n for c in classes[-1:] for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    if not inits or not inits[-1].args.args:
        return {}
    init = inits[-1]
    me = init.args.args[0].arg
    lines = source_code.split("\n")
    found: dict[str, tuple[int, int]] = {}
    for node in ast.walk(init):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets.extend(target.elts)
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == me:
                where = (target.lineno, _char_col(lines, target.lineno, target.col_offset))
                if target.attr not in found or where < found[target.attr]:
                    found[target.attr] = where
    return found


def _char_col(lines: list[str], line: int, byte_col: int) -> int:
    """ast's UTF-8 byte offset in ``line`` (1-based) as a character offset."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    if text.isascii():
        return byte_col
    return len(text.encode("utf-8", "surrogatepass")[:byte_col].decode("utf-8", "replace"))
