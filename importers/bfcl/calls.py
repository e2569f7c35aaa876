"""BFCL's ground-truth call strings (``"cd(folder='document')"``) read as tool calls, with
``ast`` only: the string must be one call of a known tool whose arguments are literals
(:func:`ast.literal_eval` per argument node); nothing is evaluated otherwise."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import BfclImportError

__all__ = ["MAX_CALL_CHARS", "ToolCall", "parse_call"]

MAX_CALL_CHARS = 100_000
"""Longest ground-truth call string accepted (the longest in the dataset is under 1 KB)."""

JsonValue = Any
"""A value that ``json.dumps`` accepts and round-trips (dict keys are strings)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One ground-truth call: ``getattr(env, name)(**arguments)``.

    ``arguments`` is a JSON object keyed by the original method's parameter names
    (positional arguments of the call string already mapped to keywords).
    """

    name: str
    arguments: dict[str, JsonValue]



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
