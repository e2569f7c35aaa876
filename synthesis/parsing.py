"""Reading model output: fenced code blocks, JSON, and the shape of generated Python.

Nothing here executes generated code: Python is only *parsed* (:func:`ast.parse`), never
compiled to run, imported or evaluated. Every failure is a :class:`MalformedOutput` whose
message is written for the model (it is sent back as feedback when the step is retried).
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from typing import Any

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


class MalformedOutput(ValueError):
    """The model's answer is not what the prompt asked for (no code block, not JSON, a
    syntax error, the wrong class name...). ``str(exc)`` is the feedback for the model."""


def code_blocks(text: str, language: str | None = None) -> list[str]:
    """Bodies of the fenced blocks in ``text`` (```` ```lang ... ``` ````), in order.

    ``language`` keeps only blocks tagged with it, plus untagged ones.
    """
    blocks = []
    for lang, body in _FENCE.findall(text or ""):
        if language is None or lang.lower() in ("", language.lower()):
            blocks.append(body)
    return blocks


def extract_code(text: str) -> str:
    """The first ```` ```python ```` (or untagged) block of ``text``.

    Raises:
        MalformedOutput: no fenced code block, or it is empty.
    """
    blocks = [b for b in code_blocks(text, "python") if b.strip()]
    if not blocks:
        raise MalformedOutput("no ```python code block found in the answer; put the code in one fenced block")
    return blocks[0].rstrip() + "\n"


def extract_json(text: str) -> Any:
    """The JSON value in ``text``: a ```` ```json ```` block, else the whole text, else the
    first balanced ``{...}`` or ``[...]`` span.

    Raises:
        MalformedOutput: nothing parses as JSON.
    """
    candidates = code_blocks(text, "json") + [text or ""]
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    for opener, closer in (("{", "}"), ("[", "]")):
        start = (text or "").find(opener)
        end = (text or "").rfind(closer)
        if 0 <= start < end:
            try:
                return json.loads(text[start:end + 1])
            except ValueError:
                continue
    raise MalformedOutput("the answer is not JSON; answer with one ```json block holding the requested value")


def json_object(text: str, required: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """:func:`extract_json` that must be an object with ``required`` keys of the given types.

    Raises:
        MalformedOutput: not JSON, not an object, a key missing or of the wrong type.
    """
    value = extract_json(text)
    if not isinstance(value, dict):
        raise MalformedOutput(f"expected a JSON object, got a JSON {type(value).__name__}")
    for key, kind in required.items():
        if key not in value:
            raise MalformedOutput(f"the JSON object lacks the key {key!r}")
        if not isinstance(value[key], kind) or (kind is int and isinstance(value[key], bool)):
            raise MalformedOutput(f"{key!r} must be of type {getattr(kind, '__name__', kind)}")
    return value


def parse_module(source: str) -> ast.Module:
    """``ast.parse`` of generated code (parsing only).

    Raises:
        MalformedOutput: a syntax error (line and message in the text).
    """
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno is not None else ""
        raise MalformedOutput(f"syntax error{where}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        raise MalformedOutput(f"the code cannot be parsed: {type(exc).__name__}") from None


def find_class(tree: ast.Module, class_name: str) -> ast.ClassDef:
    """The top-level class ``class_name`` of ``tree``.

    Raises:
        MalformedOutput: no such class (the message lists the classes found).
    """
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    for node in classes:
        if node.name == class_name:
            return node
    found = ", ".join(c.name for c in classes) or "none"
    raise MalformedOutput(f"the code must define the class {class_name!r} at top level (classes found: {found})")


def method_names(node: ast.ClassDef) -> list[str]:
    """Names of the methods defined directly in a class body, in order."""
    return [n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def extract_function(text: str, name: str) -> str:
    """The code block of ``text`` as a single function ``name`` (module level, dedented),
    e.g. a method body to splice into a class (EnvScaler SkelBuilder stage 2 step 4).

    Raises:
        MalformedOutput: no code block, a syntax error, no function ``name`` in it.
    """
    code = textwrap.dedent(extract_code(text))
    tree = parse_module(code)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    for node in functions:
        if node.name == name:
            segment = ast.get_source_segment(code, node, padded=False) or ""
            decorators = "".join(f"@{ast.get_source_segment(code, d)}\n" for d in node.decorator_list)
            return decorators + segment.rstrip() + "\n"
    found = ", ".join(f.name for f in functions) or "none"
    raise MalformedOutput(f"the code must define the function {name!r} (functions found: {found})")


def assemble_class(class_def: str, class_name: str, methods: list[str]) -> str:
    """Splice method sources (module-level ``def``s taking ``self``) into the class
    ``class_name`` of ``class_def`` (EnvScaler SkelBuilder stage 2 step 5, "concat"), and
    parse the result.

    Returns the whole module source. Raises :class:`MalformedOutput` if the class is
    missing or the result does not parse.
    """
    tree = parse_module(class_def)
    node = find_class(tree, class_name)
    lines = class_def.rstrip("\n").split("\n")
    end = node.end_lineno or len(lines)
    body = "".join("\n" + textwrap.indent(m.rstrip() + "\n", "    ") for m in methods)
    assembled = "\n".join(lines[:end]) + "\n" + body + ("\n" + "\n".join(lines[end:]) if lines[end:] else "")
    find_class(parse_module(assembled), class_name)
    return assembled.rstrip() + "\n"


def python_identifier(value: Any, what: str) -> str:
    """``value`` if it is a Python identifier usable as a class or method name.

    Raises:
        MalformedOutput: anything else.
    """
    if not isinstance(value, str) or not value.isidentifier() or value.startswith("_"):
        raise MalformedOutput(f"{what} must be a public Python identifier, got {value!r}")
    return value
