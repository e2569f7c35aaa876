"""Reading EnvScaler's released files, one record at a time (no API, no sandbox).

Shapes accepted (the release on HuggingFace: ``EnvScaler-191-Env``,
``EnvScaler-RL-Scenario``, ``EnvScaler-SFT-Scenario``; and EnvScaler's own repository):

* a file is a JSON **list** of records, a JSON **object** keyed by id (the key is the
  record's id: ``env_id -> record``, as EnvScaler's loaders index ``env_items[env_id]``),
  or, when its name ends in ``.jsonl``, **JSON Lines** (one record per line);
* an environment record: ``env_id`` (list and JSON Lines forms; the list index when
  absent), ``env_class_name``, ``env_class_code``, ``environment_introduction``,
  ``constraints_rules`` (a list of strings), ``tools`` (a list of OpenAI tool schemas);
  other fields (``env_func_details``, ``env_structure``, ...) are read past and dropped;
* a scenario record: ``env_id``, ``env_class_name``, ``task_id``, ``task``,
  ``init_config`` (an object), ``checklist`` (strings) and, in RL scenario files,
  ``checklist_with_func`` (``[{"check_item", "check_func"}]``); SFT scenario files have
  no ``checklist_with_func`` (EnvScaler's SFT environments compute no reward);
* ``tools``, ``init_config``, ``checklist``, ``checklist_with_func`` and
  ``constraints_rules`` may be JSON values or JSON *text* (how loaders of the published
  dataset hand them over): text is decoded, and text that is not JSON, or decodes to the
  wrong type, refuses that record with the reason.

Streaming: records are built one at a time from ``ijson``'s ``basic_parse`` events (its
C backend, yajl2_c), so a file of tens of MB is parsed once and never held whole; only
the record being read is in memory. ``ijson`` is a small, long-maintained library with
binary wheels; the standard ``json`` module can only load a whole document (a 50 MB
scenario file with its ``init_config`` objects decoded takes ~330 MB that way). Records
are built here rather than with ``ijson.items``, whose prefix strings make memory grow
with the square of the nesting depth (a 20,000-deep list took 1 GB): nesting beyond
:data:`MAX_DEPTH` refuses the record and the rest of the file is read on.

Errors: :class:`EnvScalerFileError` for a file that cannot be read as one of the shapes
(missing, not JSON, a top level that is neither a list nor an object); it is raised
before the first record, or, for malformed JSON later in the file, when the reader gets
there (records before it were already handed out).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson

MAX_DEPTH = 256
"""Deepest nesting of a record (its own level counts as 1); deeper records are refused."""
CHUNK_BYTES = 64 * 1024
"""Bytes read from a file at a time."""
TEXT_FIELDS = ("tools", "init_config", "checklist", "checklist_with_func", "constraints_rules")
"""Fields that may come as JSON text."""
ENVIRONMENT_FIELDS = ("env_id", "env_class_name", "env_class_code", "environment_introduction",
                      "constraints_rules", "tools")
"""The fields of an environment record the importer uses (others are dropped when read)."""


class EnvScalerFileError(ValueError):
    """A file is missing, not JSON, or not in one of the accepted shapes."""


@dataclass
class RawRecord:
    """One record as read: ``index`` (0-based position in the file), ``key`` (its key in
    the object form, else None), ``value`` (any JSON value; None when refused) and
    ``problem`` (why it could not be read, e.g. too deep)."""

    index: int
    key: str | None
    value: Any
    problem: str | None = None


class _Counting:
    """A binary file that reports how many bytes were read so far."""

    def __init__(self, handle: IO[bytes], on_bytes: Callable[[int], None] | None) -> None:
        self.handle = handle
        self.on_bytes = on_bytes
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.read_bytes += len(data)
        if self.on_bytes is not None and data:
            self.on_bytes(len(data))
        return data


_SCALARS = frozenset({"null", "boolean", "number", "integer", "double", "string"})


def _records(events: Iterator[tuple[str, Any]], top: str) -> Iterator[tuple[str | None, Any, str | None]]:
    """``(key, value, problem)`` for each record under the top level (``list``:
    elements; ``object``: values with their keys; ``lines``: each top-level value),
    built from ``basic_parse`` events with nesting capped at :data:`MAX_DEPTH`."""
    stack: list[Any] = []
    keys: list[str | None] = []
    key: str | None = None
    record_key: str | None = None
    skipping = False  # True while reading past a record that is too deep
    base = 0 if top == "lines" else 1  # depth of the records' own level
    depth = 0
    for event, value in events:
        if skipping:
            if event in ("start_map", "start_array"):
                depth += 1
            elif event in ("end_map", "end_array"):
                depth -= 1
                if depth == base:
                    skipping = False
                    yield record_key, None, f"nested deeper than {MAX_DEPTH} levels"
            continue
        if event == "map_key":
            if depth == base and top == "object":
                record_key = value
            else:
                key = value
            continue
        if event in ("start_map", "start_array"):
            depth += 1
            if depth <= base:
                continue
            if depth - base > MAX_DEPTH:
                skipping = True
                stack.clear()
                keys.clear()
                continue
            keys.append(key)
            stack.append({} if event == "start_map" else [])
            continue
        if event in ("end_map", "end_array"):
            depth -= 1
            if depth < base:
                continue
            done = stack.pop()
            parent_key = keys.pop()
            if not stack:
                yield record_key, done, None
                continue
            _attach(stack[-1], parent_key, done)
            key = None
            continue
        if event in _SCALARS:
            if depth == base:
                yield record_key, value, None
            else:
                _attach(stack[-1], key, value)
            continue


def _attach(container: Any, key: str | None, value: Any) -> None:
    if isinstance(container, list):
        container.append(value)
    else:
        container[key] = value


def _top_level(handle: IO[bytes], path: Path) -> tuple[str, int]:
    """The first byte that is not white space (or a UTF-8 BOM) and its offset."""
    offset = 0
    while True:
        chunk = handle.read(4096)
        if not chunk:
            raise EnvScalerFileError(f"{path}: empty file; expected a JSON list or object")
        if offset == 0 and chunk.startswith(b"\xef\xbb\xbf"):
            chunk, offset = chunk[3:], 3
        stripped = chunk.lstrip(b" \t\r\n")
        if stripped:
            return chr(stripped[0]), offset + len(chunk) - len(stripped)
        offset += len(chunk)


def read_records(path: Path, on_bytes: Callable[[int], None] | None = None) -> tuple[str, Iterator[RawRecord]]:
    """Open ``path`` and return its shape (``"list"``, ``"object"`` or ``"lines"``) and an
    iterator of its records, read as the iterator is consumed (the file is closed when it
    ends). ``on_bytes(n)`` is told of every ``n`` bytes read (a progress bar's feed).

    Raises:
        EnvScalerFileError: the file cannot be opened, is empty, or its top level is not
            a list or an object (raised here); malformed JSON further on (raised by the
            iterator when it gets there, naming the byte offset).
    """
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise EnvScalerFileError(f"{path}: {exc.strerror or exc}") from None
    try:
        first, offset = _top_level(handle, path)
        lines = path.name.endswith(".jsonl")
        if not lines and first not in "[{":
            raise EnvScalerFileError(f"{path}: expected a JSON list of records or an object keyed by id; "
                                     f"the file starts with {first!r}")
        handle.seek(offset)
    except BaseException:
        handle.close()
        raise
    shape = "lines" if lines else ("list" if first == "[" else "object")
    return shape, _iterate(handle, path, shape, on_bytes, offset)


def _iterate(handle: IO[bytes], path: Path, shape: str, on_bytes: Callable[[int], None] | None,
             offset: int) -> Iterator[RawRecord]:
    counting = _Counting(handle, on_bytes)
    if on_bytes is not None and offset:
        on_bytes(offset)
    try:
        events = ijson.basic_parse(counting, use_float=True, multiple_values=shape == "lines",
                                   buf_size=CHUNK_BYTES)
        for index, (key, value, problem) in enumerate(_records(events, shape)):
            yield RawRecord(index, key, value, problem)
    except ijson.JSONError as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EnvScalerFileError(f"{path}: not JSON (in the first {offset + counting.read_bytes} bytes): "
                                 f"{detail[:200]}") from None
    finally:
        handle.close()


# -- fields ----------------------------------------------------------------------------------
def json_field(record: dict[str, Any], name: str) -> tuple[Any, str | None]:
    """``record[name]`` with JSON text decoded: ``(value, problem)``. A missing field is
    ``(None, None)``; text that is not JSON is ``(None, "<name> is text that is not
    JSON: ...")``. Only the fields in :data:`TEXT_FIELDS` are decoded."""
    value = record.get(name)
    if name in TEXT_FIELDS and isinstance(value, str):
        try:
            return json.loads(value), None
        except (ValueError, RecursionError) as exc:
            return None, f"{name} is text that is not JSON ({str(exc)[:120]})"
    return value, None


def _typed(record: dict[str, Any], name: str, want: type, what: str, problems: list[str]) -> Any:
    value, problem = json_field(record, name)
    if problem is not None:
        problems.append(problem)
        return None
    if value is not None and not isinstance(value, want):
        problems.append(f"{name} must be {what}, got {type(value).__name__}")
        return None
    return value


def _strings(value: Any, name: str, problems: list[str]) -> list[str] | None:
    if value is None:
        return None
    if not all(isinstance(v, str) for v in value):
        problems.append(f"{name} must be a list of strings")
        return None
    return list(value)


def _id(value: Any) -> str | None:
    """An id as text (EnvScaler's are strings; numbers are accepted as their digits)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | str):
        text = str(value).strip()
        return text or None
    return None


def wrapped_tool(tool: Any) -> Any:
    """An OpenAI tool schema in the wrapped form ``{"type": "function", "function": {...}}``
    as the API stores it (a bare ``{name, ...}`` or flat ``{"type": "function", "name",
    ...}`` object wrapped; anything else returned as it is, for the API to judge)."""
    if not isinstance(tool, dict):
        return tool
    if isinstance(tool.get("function"), dict) and set(tool) <= {"type", "function"}:
        return {"type": "function", "function": tool["function"]} if tool.get("type", "function") == "function" \
            else tool
    if "function" not in tool and "name" in tool:
        if "type" not in tool:
            return {"type": "function", "function": tool}
        if tool["type"] == "function":
            return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
    return tool


@dataclass
class EnvironmentRecord:
    """An environment record as the importer uses it (``problems`` empty when usable)."""

    index: int
    env_id: str
    class_name: str = ""
    code: str = ""
    introduction: str | None = None
    rules: list[str] = field(default_factory=list)
    tools: list[Any] | None = None
    """Declared tools in the wrapped form (None: the record has none)."""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _unreadable(raw: RawRecord) -> str | None:
    """Why a record cannot be read as one at all (the file's problem with it, or it is not
    a JSON object); None when it can."""
    if raw.problem is not None:
        return raw.problem
    if not isinstance(raw.value, dict):
        return f"the record is not a JSON object (a {type(raw.value).__name__})"
    return None


def environment_record(raw: RawRecord) -> EnvironmentRecord:
    """Read one environment record (never raises: what is wrong goes to ``problems``).
    Its id is the object form's key, else its ``env_id``, else its index."""
    value = raw.value
    env_id = raw.key if raw.key is not None else (_id(value.get("env_id")) if isinstance(value, dict) else None)
    record = EnvironmentRecord(raw.index, env_id if env_id is not None else str(raw.index))
    unreadable = _unreadable(raw)
    if unreadable is not None:
        record.problems.append(unreadable)
        return record
    problems = record.problems
    if raw.key is None and env_id is None:
        record.notes.append(f"no env_id: known by its index {raw.index}")
    code, class_name = value.get("env_class_code"), value.get("env_class_name")
    if not isinstance(code, str) or not code.strip():
        problems.append("env_class_code must be non-empty text")
    if not isinstance(class_name, str) or not class_name.strip():
        problems.append("env_class_name must be non-empty text")
    introduction = value.get("environment_introduction")
    if introduction is not None and not isinstance(introduction, str):
        problems.append(f"environment_introduction must be text, got {type(introduction).__name__}")
    rules = _strings(_typed(value, "constraints_rules", list, "a list of strings", problems),
                     "constraints_rules", problems)
    tools = _typed(value, "tools", list, "a list of tool schemas", problems)
    if problems:
        return record
    record.class_name, record.code = str(class_name), str(code)
    record.introduction = introduction
    record.rules = rules or []
    if tools is None:
        record.notes.append("no tools in the record: the agent is shown the schemas derived from the class")
    else:
        record.tools = [wrapped_tool(t) for t in tools]
    return record


@dataclass
class ScenarioRecord:
    """A scenario record as the importer uses it (``problems`` empty when usable)."""

    index: int
    env_ref: Any = None
    """The record's ``env_id`` as given (resolved against the environment file later)."""
    task_id: str | None = None
    class_name: str | None = None
    task: str = ""
    init_config: dict[str, Any] = field(default_factory=dict)
    checklist: list[str] = field(default_factory=list)
    checklist_with_func: list[dict[str, str]] = field(default_factory=list)
    kind: str = "rl"
    """``rl`` (it has ``checklist_with_func``) or ``sft`` (it has none)."""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def scenario_record(raw: RawRecord) -> ScenarioRecord:
    """Read one scenario record (never raises: what is wrong goes to ``problems``).
    In the object form, a record without ``task_id`` takes its key."""
    record = ScenarioRecord(raw.index)
    value = raw.value
    unreadable = _unreadable(raw)
    if unreadable is not None:
        record.problems.append(unreadable)
        return record
    problems = record.problems
    record.env_ref = value.get("env_id")
    if record.env_ref is None:
        problems.append("no env_id")
    record.task_id = _id(value.get("task_id")) or raw.key
    class_name = value.get("env_class_name")
    if class_name is not None and not isinstance(class_name, str):
        problems.append(f"env_class_name must be text, got {type(class_name).__name__}")
    record.class_name = class_name
    task = value.get("task")
    if not isinstance(task, str):
        problems.append("task must be text" if "task" in value else "no task")
    else:
        record.task = task
    if "init_config" not in value:
        problems.append("no init_config (EnvScaler instantiates the class with it)")
    init_config = _typed(value, "init_config", dict, "an object", problems)
    record.init_config = init_config or {}
    checks = _typed(value, "checklist_with_func", list, "a list of {check_item, check_func}", problems)
    if "checklist_with_func" not in value:
        record.kind = "sft"
        record.notes.append("no checklist_with_func (an SFT scenario): no check functions, no reward from checks")
    for number, check in enumerate(checks or []):
        if not isinstance(check, dict):
            problems.append(f"checklist_with_func.{number} is not an object")
            continue
        func, item = check.get("check_func"), check.get("check_item", "")
        if not isinstance(func, str) or not func.strip():
            problems.append(f"checklist_with_func.{number} has no check_func")
            continue
        record.checklist_with_func.append({"check_item": item if isinstance(item, str) else str(item),
                                           "check_func": func})
    checklist = _strings(_typed(value, "checklist", list, "a list of strings", problems), "checklist", problems)
    record.checklist = checklist if checklist is not None else [c["check_item"] for c in record.checklist_with_func]
    return record
