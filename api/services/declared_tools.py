"""Declared tools: tool schemas given at registration (an EnvScaler release's ``tools``)
that the agent is shown instead of the schemas derived from the class.

EnvScaler's ``reset()`` hands the agent the environment record's own ``tools``; Sandpit
derives schemas by introspecting the class in a sandbox (``child_schemas.py``). The two
differ in predictable ways (EnvScaler's descriptions are whole docstrings, its
``required`` lists defaulted parameters, ``Optional[str]`` is ``["string", "null"]``),
so registration keeps both and lists the differences:

* :func:`agent_tools`: what the agent is shown (declared when given, else derived);
* :func:`tool_differences`: a pure comparison of the two JSON schemas on the host (data
  only: no code of the environment runs here);
* :data:`PROBE`: the script that asks a sandbox whether declared names that are not
  public methods are callable attributes of the instance (EnvScaler's validity is
  ``hasattr``), and :func:`read_probe` to read its answer as data.

Argument checking (:class:`~sandpit.api.envs.actions.ToolSet`) keeps using the derived schemas: they say
what the class accepts.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

MAX_DIFFERENCES = 4096
"""Most differences kept per environment; then one ``truncated`` entry."""
MAX_DIFFERENCE_TEXT = 500
"""Descriptions in a difference are cut to this many characters."""
PROBE_MARK = "sandpit-probe:"
"""Prefix of the probe's answer line on stdout."""

PROBE = '''
import json, sys, types

request = json.loads(sys.stdin.read())
with open("environment.py", encoding="utf-8") as handle:
    source = handle.read()
module = types.ModuleType("environment")
exec(compile(source, "environment.py", "exec"), module.__dict__)
cls = getattr(module, request["class_name"])
config = request["config"]
try:
    try:
        instance = cls(dict(config))
    except TypeError:
        instance = cls()
    for key, value in config.items():
        setattr(instance, key, value)
    target, built = instance, True
except Exception:
    target, built = cls, False
answer = {}
for name in request["names"]:
    try:
        found = hasattr(target, name)
        answer[name] = "callable" if found and callable(getattr(target, name)) else (
            "not_callable" if found else "missing")
    except Exception as exc:
        answer[name] = "error: " + type(exc).__name__
print()
print("''' + PROBE_MARK + '''" + json.dumps({"instance": built, "names": answer}))
'''
"""Script run with ``/v1/execute`` semantics in a sandbox: ``environment.py`` holds the
code, stdin ``{"class_name", "config", "names"}``. It instantiates the class as EnvScaler
does (``cls(init_config)``, ``cls()`` on TypeError, then ``setattr`` of every key; the
class itself when that fails) and prints ``sandpit-probe:{"instance": bool, "names":
{name: "callable" | "not_callable" | "missing" | "error: <Type>"}}``."""


class _Named(Protocol):
    tools: list[dict[str, Any]]
    declared_tools: list[dict[str, Any]] | None


def agent_tools(environment: _Named) -> list[dict[str, Any]]:
    """The tools the agent is shown: the declared ones when the environment has them,
    else the derived ones (a new list; the stored one is not shared)."""
    declared = environment.declared_tools
    return list(declared if declared is not None else environment.tools)


def read_probe(stdout: str, names: list[str]) -> dict[str, str]:
    """The probe's verdict per name from its stdout (the last answer line; JSON read as
    data). A name the answer lacks, or an answer that is not there, is ``"unknown"``."""
    answer: Any = None
    for line in reversed(stdout.splitlines()):
        if line.startswith(PROBE_MARK):
            try:
                answer = json.loads(line[len(PROBE_MARK):])
            except ValueError:
                answer = None
            break
    verdicts = answer.get("names") if isinstance(answer, dict) else None
    if not isinstance(verdicts, dict):
        verdicts = {}
    return {name: str(verdicts[name])[:100] if name in verdicts else "unknown" for name in names}


def _function(tool: Any) -> dict[str, Any]:
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    return function if isinstance(function, dict) else {}


def _properties(function: dict[str, Any]) -> tuple[dict[str, Any], set[str], bool]:
    """``(properties, required, takes_more)`` of a function schema's ``parameters``."""
    parameters = function.get("parameters")
    if not isinstance(parameters, dict):
        return {}, set(), False
    properties = parameters.get("properties")
    required = parameters.get("required")
    return (properties if isinstance(properties, dict) else {},
            {r for r in required if isinstance(r, str)} if isinstance(required, list) else set(),
            parameters.get("additionalProperties") is True)


def schema_type(schema: Any, depth: int = 0) -> str | list[str] | None:
    """The JSON Schema type(s) a parameter schema allows, for comparison: a type name,
    a sorted list of names, or None for any value (no ``type``, a boolean schema, or a
    union with an unconstrained branch). ``anyOf``/``oneOf`` branches are merged; arrays
    with a typed ``items`` read ``array[<items>]`` (three levels deep at most)."""
    if not isinstance(schema, dict):
        return None
    names: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        names.add(declared)
    elif isinstance(declared, list):
        names.update(t for t in declared if isinstance(t, str))
    else:
        branches = schema.get("anyOf", schema.get("oneOf"))
        if not isinstance(branches, list) or not branches:
            return None
        for branch in branches:
            found = schema_type(branch, depth + 1)
            if found is None:
                return None
            names.update([found] if isinstance(found, str) else found)
    if not names:
        return None
    items = schema.get("items")
    if "array" in names and depth < 3 and isinstance(items, dict):
        inner = schema_type(items, depth + 1)
        if inner is not None:
            names.discard("array")
            names.add(f"array[{inner if isinstance(inner, str) else '|'.join(inner)}]")
    ordered = sorted(names)
    return ordered[0] if len(ordered) == 1 else ordered


def _text(value: Any) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


def tool_differences(declared: list[Any], derived: list[Any],
                     not_methods: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Where ``declared`` differs from ``derived`` (both lists of OpenAI tool schemas),
    as ``ToolDifference`` dicts ``{"tool", "kind", "severity", "parameter"?, "declared"?,
    "derived"?}`` in declared order, then the undeclared public methods. ``not_methods``
    are declared names that are callable on the instance but not public methods (a
    ``not_a_method`` warning each; nothing to compare them with). Descriptions are
    compared with whitespace normalized, types by :func:`schema_type`. At most
    :data:`MAX_DIFFERENCES` entries, then one ``truncated`` entry. Pure: no I/O."""
    out: list[dict[str, Any]] = []
    derived_by_name = {_function(t).get("name"): _function(t) for t in derived}
    declared_names = set()

    def add(tool: str, kind: str, severity: str, **fields: Any) -> None:
        out.append({"tool": tool, "kind": kind, "severity": severity, **fields})

    for tool in declared:
        function = _function(tool)
        name = function.get("name")
        if not isinstance(name, str):
            continue
        declared_names.add(name)
        mine = derived_by_name.get(name)
        if mine is None:
            if name in not_methods:
                add(name, "not_a_method", "warning")
            continue
        if _text(function.get("description")) != _text(mine.get("description")):
            add(name, "description", "info", declared=str(function.get("description") or "")[:MAX_DIFFERENCE_TEXT],
                derived=str(mine.get("description") or "")[:MAX_DIFFERENCE_TEXT])
        theirs_props, theirs_required, _ = _properties(function)
        mine_props, mine_required, takes_more = _properties(mine)
        for parameter, schema in theirs_props.items():
            if parameter not in mine_props:
                add(name, "parameter_extra", "info" if takes_more else "warning", parameter=parameter)
                continue
            if (parameter in theirs_required) != (parameter in mine_required):
                add(name, "required", "info", parameter=parameter, declared=parameter in theirs_required,
                    derived=parameter in mine_required)
            theirs_type, mine_type = schema_type(schema), schema_type(mine_props[parameter])
            if theirs_type != mine_type:
                add(name, "type", "info", parameter=parameter, declared=theirs_type or "any",
                    derived=mine_type or "any")
        for parameter in mine_props:
            if parameter not in theirs_props:
                add(name, "parameter_missing", "info", parameter=parameter,
                    derived=parameter in mine_required)
    for name in derived_by_name:
        if isinstance(name, str) and name not in declared_names:
            add(name, "undeclared", "warning")
    if len(out) > MAX_DIFFERENCES:
        dropped = len(out) - MAX_DIFFERENCES
        out = out[:MAX_DIFFERENCES]
        add("", "truncated", "info", declared=dropped)
    return out
