"""The summary and the documented parameters of a docstring (tool schemas, child side).

Stdlib only. Runs where ``child_schemas.py`` runs (a session process describing its
environment's class): it reads docstrings, never calls anything of the class.

Styles: Google (``Args:``/``Arguments:``/``Parameters:``/``Keyword Args:`` sections,
``name (type): text`` or ``name: text``, indented continuation lines; BFCL's docstrings are
of this kind, and their leading ``[Optional]`` marker is dropped), reST (``:param [type]
name: text``, ``:type name: type``) and NumPy (``Parameters`` underlined by dashes, ``name
: type`` then indented text). At most MAX_DOC_SCAN_CHARS characters of a docstring are
read, and no regular expression runs on a long line (parsing stays linear).
"""

from __future__ import annotations

import builtins
import inspect
import re

from .limits import MAX_DESCRIPTION_CHARS, MAX_DOC_SCAN_CHARS

__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


_GOOGLE_SECTION = re.compile(
    r"(args|arguments|parameters|params|keyword args|keyword arguments|other parameters|kwargs|"
    r"returns?|yields?|raises?|except(?:ions?)?|examples?|notes?|attributes|see also|warnings?|"
    r"todo|references?|response|side effects?)\s*:\s*", re.I)
_PARAM_SECTIONS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments",
                   "other parameters", "kwargs"}
_NUMPY_SECTION = re.compile(
    r"(parameters|other parameters|returns?|yields?|raises?|examples?|notes?|attributes|see also|"
    r"warnings?|references?)\s*", re.I)
_DASHES = re.compile(r"-{3,}\s*")
# Item heads (the part before the first colon) are matched only when at most _HEAD_CHARS
# long, so no regex ever runs on a long line: parsing stays linear in the docstring.
_HEAD_CHARS = 256
_GOOGLE_HEAD = re.compile(r"\*{0,2}(\w+)(?:\s*\((.*)\))?\s*")
_NUMPY_HEAD = re.compile(r"\*{0,2}(\w+)")
_REST_PARAM_FIELDS = {"param", "parameter", "arg", "argument", "key", "keyword"}
_OPTIONAL_MARK = re.compile(r"^\[optional\]\s*", re.I)


class DocParam:
    """One documented parameter: its docstring type (text or None) and description lines."""

    __slots__ = ("type", "lines", "chars")

    def __init__(self, type_text: str | None) -> None:
        self.type = type_text
        self.lines: list[str] = []
        self.chars = 0

    def start(self, text: str | None) -> None:
        """(Re)start the description with its first line (``None``: empty so far)."""
        self.lines, self.chars = [], 0
        if text:
            self.append(text)

    def append(self, text: str) -> None:
        """Add a continuation line; beyond MAX_DESCRIPTION_CHARS lines are dropped (O(1))."""
        if self.chars <= MAX_DESCRIPTION_CHARS:
            self.lines.append(text)
            self.chars += len(text) + 1

    @property
    def description(self) -> str:
        """Whitespace-normalized text, without BFCL's leading ``[Optional]`` marker
        (optionality is what ``required`` says)."""
        return _OPTIONAL_MARK.sub("", _normalize(" ".join(self.lines)), count=1)


def _google_item(text: str) -> tuple[str, str | None, str] | None:
    """``name (type): text`` / ``name: text`` -> ``(name, type or None, text)``."""
    colon = text.find(":", 0, _HEAD_CHARS)
    if colon < 0:
        return None
    match = _GOOGLE_HEAD.fullmatch(text[:colon])
    rest = text[colon + 1:]
    if match is None or (rest and not rest[0].isspace()):  # "http://..." is not an item
        return None
    return match.group(1), match.group(2), rest.strip()


def _numpy_item(text: str) -> tuple[str, str | None] | None:
    """``name : type`` / ``name`` -> ``(name, type or None)``."""
    head, _, type_text = text.partition(":")
    head = head.strip()
    match = _NUMPY_HEAD.fullmatch(head) if len(head) <= _HEAD_CHARS else None
    return (match.group(1), type_text.strip() or None) if match else None


def _rest_field(text: str) -> tuple[list[str], str] | None:
    """``:word [word...]: text`` -> ``(words, text)``."""
    end = text.find(":", 1, _HEAD_CHARS)
    words = text[1:end].split() if end > 1 and not text[1].isspace() else []
    if not words or not words[0].isidentifier():
        return None
    return words, text[end + 1:].strip()


def _normalize(text: str) -> str:
    text = " ".join(text.split())
    return text[:MAX_DESCRIPTION_CHARS]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_docstring(doc: str | None) -> tuple[str, dict[str, DocParam]]:
    """Split a docstring into ``(summary, {param name: DocParam})``.

    The summary is the text before the first section (Google ``Args:``/``Returns:``/...,
    a reST ``:field:`` line, a NumPy underlined header), whitespace-normalized and cut at
    MAX_DESCRIPTION_CHARS. Only the first MAX_DOC_SCAN_CHARS characters are read.
    """
    if not isinstance(doc, str) or not doc:
        return "", {}
    lines = inspect.cleandoc(doc[:MAX_DOC_SCAN_CHARS]).splitlines()
    summary: list[str] = []
    params: dict[str, DocParam] = {}
    mode = "summary"  # summary | google | numpy | rest | other
    section_indent = 0
    item_indent: int | None = None
    current: DocParam | None = None
    summary_chars = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = _indent(line)
        i += 1
        nxt = lines[i] if i < len(lines) else ""
        if not stripped:
            if mode == "summary":
                summary.append("")
            continue
        # structure that starts a section, wherever we are
        if (_NUMPY_SECTION.fullmatch(stripped) and _DASHES.fullmatch(nxt.strip())
                and (mode == "summary" or indent <= section_indent)):
            name = stripped.lower()
            mode = "numpy" if name in ("parameters", "other parameters") else "other"
            section_indent, item_indent, current = indent, None, None
            i += 1  # the dashes
            continue
        if _GOOGLE_SECTION.fullmatch(stripped) and (mode in ("summary", "rest") or indent <= section_indent):
            name = stripped.rstrip(":").strip().lower()
            mode = "google" if name in _PARAM_SECTIONS else "other"
            section_indent, item_indent, current = indent, None, None
            continue
        field = _rest_field(stripped) if stripped.startswith(":") else None
        if field is not None:
            mode, section_indent, current = "rest", indent, None
            words, text = field
            name = words[-1].lstrip("*")
            if len(words) >= 2 and name.isidentifier():
                if words[0] in _REST_PARAM_FIELDS:
                    current = params.setdefault(name, DocParam(None))
                    if len(words) > 2:
                        current.type = " ".join(words[1:-1])
                    current.start(text)
                elif words[0] == "type" and len(words) == 2:
                    params.setdefault(name, DocParam(None)).type = text or None
            continue
        if mode == "summary":
            if summary_chars <= MAX_DESCRIPTION_CHARS:
                summary.append(stripped)
                summary_chars += len(stripped) + 1
            continue
        if mode == "rest":
            if current is not None and indent > section_indent:
                current.append(stripped)
            else:
                current = None
            continue
        if indent <= section_indent and mode in ("google", "other") and mode != "numpy":
            mode, current = "other", None  # text after the section, at its level: not ours
            continue
        if mode == "google":
            if item_indent is None:
                item_indent = indent
            if indent <= item_indent:
                item = _google_item(stripped) if indent == item_indent else None
                if item is not None:
                    name, type_text, text = item
                    current = params.setdefault(name, DocParam(None))
                    if type_text:
                        current.type = type_text
                    current.start(text)
                else:
                    current = None
            elif current is not None:
                current.append(stripped)
            continue
        if mode == "numpy":
            if indent <= section_indent:
                numpy_item = _numpy_item(stripped)
                if numpy_item is not None:
                    name, type_text = numpy_item
                    current = params.setdefault(name, DocParam(None))
                    current.type = type_text
                    current.start(None)
                else:
                    current = None
            elif current is not None:
                current.append(stripped)
            continue
    return _normalize(" ".join(summary)), params
