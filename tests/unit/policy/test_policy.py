"""Static policy (``sandpit.policy``): every rule, the three policies, the
RestrictedPython calibration, hostile sources and BFCL's tool modules. Sources here are only
parsed by the policy (``ast`` + RestrictedPython's compile), never executed."""

from __future__ import annotations

import json
import os
import textwrap
from collections import Counter

import pytest
from sandpit.importers import bfcl
from sandpit.policy import (
    DEFAULT_ALLOWED_IMPORTS,
    MAX_FINDINGS,
    MAX_SOURCE_BYTES,
    POLICY_NAMES,
    RULES,
    Finding,
    Policy,
    PolicyReport,
    check_source,
    get_policy,
)
from sandpit.sandbox_images import DEFINITION_DIR


def rules(source: str, policy: str | Policy = "standard") -> Counter[str]:
    return Counter(f.rule for f in check_source(textwrap.dedent(source), policy).findings)


def severities(source: str, policy: str | Policy = "standard") -> dict[str, str]:
    return {f.rule: f.severity for f in check_source(textwrap.dedent(source), policy).findings}


# -- every rule: a positive and a negative example -------------------------------------------
POSITIVE = [
    ("import-not-allowed", "import os"),
    ("import-not-allowed", "from subprocess import run"),
    ("import-not-allowed", "import os.path as p"),
    ("import-not-allowed", "from . import sibling"),
    ("dunder-access", "x = ().__class__.__bases__[0].__subclasses__()"),
    ("dunder-access", "g = f.__globals__"),
    ("dunder-access", "c = f.__code__.co_consts"),
    ("dunder-access", "s = print.__self__"),
    ("dunder-access", "m = type(x).__mro__"),
    ("dunder-access", "frame = gen.gi_frame.f_back.f_globals"),
    ("dunder-access", "tb = exc.__traceback__.tb_frame"),
    ("dunder-access", "b = __builtins__"),
    ("dunder-access", 'g = getattr(f, "__globals__")'),
    ("dunder-access", 'e = vars(m)["__builtins__"]'),
    ("dunder-dict", "d = obj.__dict__"),
    ("dynamic-eval", 'eval("1 + 1")'),
    ("dynamic-eval", 'exec("x = 1")'),
    ("dynamic-eval", 'code = compile("1", "<s>", "eval")'),
    ("dynamic-eval", "breakpoint()"),
    ("dynamic-eval", "run = eval"),
    ("dynamic-eval", "from builtins import exec as run"),
    ("eval-globals", 'value = eval(expression, {"__builtins__": None}, {})'),
    ("dynamic-import", 'os = __import__("os")'),
    ("dynamic-import", 'import importlib\nm = importlib.import_module("os")'),
    ("dynamic-import", "from importlib import import_module"),
    ("dynamic-import", "m = __import__(name)"),
    ("dynamic-import", 'm = __import__("time", level=1)'),
    ("dynamic-import", "load = __import__"),
    ("import-call", 'now = __import__("time").time()'),
    ("import-call", 'import importlib\nm = importlib.import_module("json")'),
    ("import-call", 'abc = __import__("collections", globals(), None, ["abc"], 0)'),
    ("open-call", 'data = open("/etc/passwd").read()'),
    ("open-call", 'import io\nf = io.open("x")'),
    ("dynamic-getattr", "v = getattr(obj, name)"),
    ("dynamic-getattr", "setattr(obj, name, 1)"),
    ("dynamic-getattr", "delattr(obj, key)"),
    ("dynamic-getattr", "ok = hasattr(obj, attr)"),
    ("dynamic-getattr", "v = getattr(*args)"),
    ("dynamic-getattr", "v = object.__getattribute__(obj, name)"),
    ("builtins-write", "def f():\n    global print\n    print = None"),
    ("builtins-write", "import builtins\nbuiltins.len = None"),
    ("builtins-write", "import builtins as b\nb.len = None"),
    ("builtins-write", '__builtins__["len"] = None'),
    ("builtins-write", "__builtins__ = {}"),
    ("builtins-write", 'import builtins\nvars(builtins)["len"] = None'),
    ("builtins-write", 'import builtins\nsetattr(builtins, "len", None)'),
    ("builtins-write", "import builtins\ndel builtins.len"),
    ("restricted-python-error", "async def tool():\n    return 1"),
    ("restricted-python-error", "from typing import *"),
    ("restricted-python-warning", 'print("hello")'),
    ("restricted-python-calibrated", "class A:\n    def _helper(self):\n        return self._x"),
    ("python-warning", 'pattern = "\\d+"'),
    ("syntax-error", "def f(:\n    pass"),
    ("syntax-error", "return 1"),  # only the compiler knows: RestrictedPython's compile
]

NEGATIVE = [
    ("import-not-allowed", "import typing\nfrom collections.abc import Mapping\nfrom __future__ import annotations"),
    ("import-not-allowed", "import datetime as dt, json, re, uuid, math, random, copy, itertools, functools"),
    ("dunder-access", "name = self.__class__.__name__\ndoc = f.__doc__\nsuper().__init__()"),
    ("dunder-access", 'text = "see __globals__ in the docs"'),
    ("dunder-access", "f_back = 1"),  # a variable that happens to share a frame attribute's name
    ("dunder-dict", "d = vars(self)"),
    ("dynamic-eval", 'import re\npattern = re.compile("a+")\nresult = self.evaluate(x)'),
    ("eval-globals", 'd = {"builtins": 1, "__name__": 2}'),
    ("dynamic-import", "import json"),
    ("dynamic-import", 'now = __import__("time").time()\nm = __import__("collections.abc")'),
    ("import-call", 'os = __import__("os")\nm = __import__(name)\nt = __import__("time", level=1)\n'
                    'f = __import__("__future__")\nk = __import__("time", **kw)\nimport importlib\n'
                    'j = importlib.import_module("json", "pkg")'),
    ("open-call", "self.door.open()\nself.store.open_account()"),
    ("dynamic-getattr", 'v = getattr(obj, "name", None)\nok = hasattr(obj, "x")\nsetattr(obj, "y", 1)'),
    ("builtins-write", "def f():\n    global counter\n    counter = 1\nprint_ = print"),
    ("restricted-python-error", "class A:\n    count: int = 0\n    def bump(self):\n        self.count += 1"),
    ("restricted-python-warning", "x = 1"),
    ("restricted-python-calibrated", "class A:\n    def tool(self, x):\n        return x"),
    ("python-warning", 'pattern = r"\\d+"'),
    ("syntax-error", "def f():\n    return 1"),
]


@pytest.mark.parametrize(("rule", "source"), POSITIVE)
def test_rule_fires(rule: str, source: str) -> None:
    assert rules(source)[rule] >= 1, check_source(source).findings


@pytest.mark.parametrize(("rule", "source"), NEGATIVE)
def test_rule_stays_quiet(rule: str, source: str) -> None:
    assert rules(source)[rule] == 0, check_source(source).findings


def test_every_rule_has_examples() -> None:
    untestable_by_example = {"too-large", "too-complex", "too-many-findings", "restricted-python-incomplete",
                             "init-config-replaces-attribute"}  # made at registration, from the sandbox
    assert set(RULES) - untestable_by_example == {rule for rule, _ in POSITIVE}
    assert {rule for rule, _ in POSITIVE} == {rule for rule, _ in NEGATIVE}


def test_positions_are_one_based_lines_and_character_columns() -> None:
    report = check_source('x = "ééé"; y = eval("1")\nz = obj.__globals__\n')
    by_rule = {f.rule: f for f in report.findings}
    assert (by_rule["dynamic-eval"].line, by_rule["dynamic-eval"].col) == (1, 15)  # characters, not bytes
    assert (by_rule["dunder-access"].line, by_rule["dunder-access"].col) == (2, 8)  # at the attribute


def test_attribute_chains_report_each_link() -> None:
    found = [(f.rule, f.col) for f in check_source("x = ().__class__.__bases__[0].__subclasses__()").findings
             if f.rule == "dunder-access"]
    assert found == [("dunder-access", 17), ("dunder-access", 30)]


def test_exec_and_frame_errors_of_restricted_python_are_not_duplicated() -> None:
    assert rules('exec("x")\ny = g.gi_frame') == Counter({"dynamic-eval": 1, "dunder-access": 1})


def test_restricted_python_still_compiles_around_calibrated_findings() -> None:
    # 'return' outside a function is found by compiling, which needs no remaining error
    found = rules("class A:\n    _x: int = 0\n    def m(self):\n        self._x += 1\nreturn 1")
    assert found["syntax-error"] == 1


# -- policies -----------------------------------------------------------------------------------
def test_named_policies_and_default() -> None:
    assert POLICY_NAMES == ("strict", "standard", "audit")
    assert check_source("x = 1").policy == "standard"
    for name in POLICY_NAMES:
        policy = get_policy(name)
        assert policy.name == name and set(policy.severities) == set(RULES)
        assert check_source("x = 1", policy).policy == name


def test_unknown_policy_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="strict, standard, audit"):
        get_policy("lenient")
    with pytest.raises(ValueError, match="unknown policy"):
        check_source("x = 1", "lenient")
    with pytest.raises(TypeError):
        check_source("x = 1", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        check_source(b"x = 1")  # type: ignore[arg-type]


@pytest.mark.parametrize(("source", "rule", "strict", "standard", "audit"), [
    ("import os", "import-not-allowed", "error", "warning", "warning"),
    ('open("f")', "open-call", "error", "warning", "warning"),
    ("getattr(o, n)", "dynamic-getattr", "error", "warning", "warning"),
    ("d = o.__dict__", "dunder-dict", "error", "warning", "warning"),
    ("g = f.__globals__", "dunder-access", "error", "error", "warning"),
    ('eval("1")', "dynamic-eval", "error", "warning", "warning"),
    ('eval(e, {"__builtins__": None}, {})', "eval-globals", "warning", "info", "info"),
    ('__import__("os")', "dynamic-import", "error", "error", "warning"),
    ('__import__("time")', "import-call", "error", "warning", "warning"),
    ("__builtins__ = {}", "builtins-write", "error", "error", "warning"),
    ("async def f():\n    pass", "restricted-python-error", "error", "error", "warning"),
    ('print("x")', "restricted-python-warning", "warning", "info", "info"),
    ("def f(:", "syntax-error", "error", "error", "warning"),
    ("self._x = 1", "restricted-python-calibrated", "info", "info", "info"),
])
def test_severity_per_policy(source: str, rule: str, strict: str, standard: str, audit: str) -> None:
    assert [severities(source, name)[rule] for name in POLICY_NAMES] == [strict, standard, audit]


def test_audit_never_fails_and_strict_fails_on_imports() -> None:
    hostile = 'import os\nx = ().__class__.__bases__[0].__subclasses__()\neval("1")\nopen("f")\n'
    assert not check_source(hostile, "standard").passed
    audit = check_source(hostile, "audit")
    assert audit.passed and audit.errors == 0 and audit.warnings >= 5
    assert all(sev != "error" for sev in get_policy("audit").severities.values())
    assert check_source("import os", "standard").passed
    assert not check_source("import os", "strict").passed


def test_custom_import_allow_list() -> None:
    extended = get_policy("strict", allowed_imports=DEFAULT_ALLOWED_IMPORTS | {"heapq", "xml"})
    assert check_source("import heapq\nfrom xml.etree import ElementTree", extended).passed
    only_json = get_policy("strict").with_allowed_imports({"json"})
    assert only_json.name == "strict"
    assert rules("from __future__ import annotations\nimport json\nimport typing", only_json) == Counter(
        {"import-not-allowed": 1})
    assert only_json.allows_import("json.decoder") and not only_json.allows_import("jsonschema")
    with pytest.raises(ValueError, match="dotted module names"):
        get_policy("standard", allowed_imports={"os; rm"})


def test_policy_validates_its_table() -> None:
    table = dict(get_policy("standard").severities)
    with pytest.raises(ValueError, match="missing rules"):
        Policy("mine", {k: v for k, v in table.items() if k != "open-call"})
    with pytest.raises(ValueError, match="severities must be"):
        Policy("mine", table | {"open-call": "fatal"})  # type: ignore[dict-item]
    mine = Policy("mine", table | {"open-call": "info"})
    assert severities('open("f")', mine)["open-call"] == "info"
    with pytest.raises(TypeError):
        mine.severities["open-call"] = "error"  # type: ignore[index]
    assert hash(mine) == hash(Policy("mine", table | {"open-call": "info"}))


# -- calibration: ordinary environment code ------------------------------------------------------
ENVSCALER_STYLE = '''\
from __future__ import annotations

import copy
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Dict, List, Optional


class Status(Enum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass
class Ticket:
    ticket_id: str
    title: str
    status: Status = Status.OPEN
    tags: List[str] = field(default_factory=list)


class HelpDesk:
    """A help desk: tickets and agents."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        config = init_config or {}
        self.tickets: Dict[str, Ticket] = {}
        self.counts = defaultdict(int)
        self._next = 1
        self.__secret = "not a dunder"
        for item in config.get("tickets", []):
            self._add(Ticket(**item))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({len(self.tickets)} tickets)"

    def __str__(self) -> str:
        return repr(self)

    def _add(self, ticket: Ticket) -> None:
        self.tickets[ticket.ticket_id] = ticket
        self.counts[ticket.status.value] += 1
        self._next += 1

    def _require(self, ticket_id: str) -> Ticket:
        if ticket_id not in self.tickets:
            raise KeyError(f"unknown ticket {ticket_id!r}")
        return self.tickets[ticket_id]

    def create_ticket(self, title: str, tags: Optional[List[str]] = None) -> Dict[str, Any]:
        """Open a ticket; returns its id."""
        ticket = Ticket(ticket_id=str(uuid.uuid4())[:8], title=title, tags=list(tags or []))
        self._add(ticket)
        return {"success": True, "ticket_id": ticket.ticket_id}

    def close_ticket(self, ticket_id: str) -> Dict[str, Any]:
        try:
            ticket = self._require(ticket_id)
        except KeyError as exc:
            return {"success": False, "error": str(exc)}
        else:
            ticket.status = Status.CLOSED
            return {"success": True}
        finally:
            self.counts["calls"] += 1

    def search(self, query: str, limit: int = 10) -> List[Dict[str, Any]]:
        words = {w.lower() for w in query.split()}
        hits = [t for t in self.tickets.values() if words & {w.lower() for w in t.title.split()}]
        by_status = {s.value: sum(1 for t in hits if t.status is s) for s in Status}
        _unused, *rest = [by_status] + hits
        return [{"id": t.ticket_id, "title": t.title, "stamp": datetime(2024, 1, 1).isoformat()}
                for t in sorted(hits, key=lambda t: t.title)[:limit]]

    def snapshot(self) -> Mapping[str, Any]:
        return copy.deepcopy({"tickets": {k: vars(v) for k, v in self.tickets.items()}})

    def classify(self, value: Any) -> str:
        match value:
            case {"kind": kind}:
                return str(kind)
            case [first, *_]:
                return str(first)
            case _:
                return "other"

    def counter(self):
        total = 0

        def bump():
            nonlocal total
            total += 1
            return total

        return bump
'''


def test_ordinary_environment_class_has_no_errors_or_warnings() -> None:
    for name in ("standard", "strict"):
        report = check_source(ENVSCALER_STYLE, name)
        assert report.passed and report.errors == 0 and report.warnings == 0, report.findings
        assert {f.rule for f in report.findings} <= {"restricted-python-calibrated"}
    kinds = {f.message.split(" (")[0] for f in check_source(ENVSCALER_STYLE).findings}
    assert kinds == {f"RestrictedPython {k}" for k in
                     ("private-name", "annotated-assignment", "augmented-assignment", "unmodelled-syntax")}


def test_calibrated_findings_are_aggregated_per_kind() -> None:
    source = "class A:\n" + "".join(f"    def _m{i}(self):\n        return self._v{i}\n" for i in range(50))
    (finding,) = check_source(source).findings
    assert finding.rule == "restricted-python-calibrated" and finding.line == 2
    assert "100x" in finding.message and "private-name" in finding.message


def test_metaclass_and_try_star_are_calibrated() -> None:
    source = ("from abc import ABCMeta, abstractmethod\n"
              "class Tool(metaclass=ABCMeta):\n    @abstractmethod\n    def run(self): ...\n"
              "try:\n    pass\nexcept* ValueError:\n    pass\n")
    assert rules(source) == Counter({"restricted-python-calibrated": 2})


def test_bundled_order_desk_passes_standard_cleanly() -> None:
    report = check_source((DEFINITION_DIR / "environments" / "order_desk.py").read_text())
    assert report.passed and report.warnings == 0, report.findings


# -- hostile sources ----------------------------------------------------------------------------
@pytest.mark.parametrize(("source", "rule"), [
    ("x = " + "(" * 100_000 + "1" + ")" * 100_000, "syntax-error"),  # the tokenizer's nesting limit
    ("x = " + "[" * 100_000 + "]" * 100_000, "syntax-error"),
    ("x = " + "-" * 100_000 + "1", "too-complex"),  # MemoryError in the parser
    ("x = " + "+".join(["1"] * 100_000), "too-complex"),  # RecursionError building the AST
    ("x = a" + ".b" * 100_000, "too-complex"),
    ("x = 1\ny = 2\x00", "syntax-error"),
    ("x = 1\ny = '\ud800'", "syntax-error"),
    ("#" + "x" * MAX_SOURCE_BYTES, "too-large"),
    ("#" + "é" * (MAX_SOURCE_BYTES // 2), "too-large"),  # counted in UTF-8 bytes, not characters
])
def test_hostile_sources_become_one_finding(source: str, rule: str) -> None:
    report = check_source(source)
    assert [f.rule for f in report.findings] == [rule]
    assert not report.passed
    json.dumps(report.to_dict())


def test_nul_byte_and_surrogate_positions() -> None:
    (nul,) = check_source("x = 1\ny = 2\x00").findings
    assert (nul.line, nul.col) == (2, 5)
    (bad,) = check_source("x = 1\ny = '\ud800'").findings
    assert (bad.line, bad.col) == (2, 5) and "surrogate" in bad.message


def test_restricted_python_giving_up_is_a_warning_in_standard() -> None:
    report = check_source("x = " + "+".join(["1"] * 900))  # parses; too deep for a recursive visitor
    assert [f.rule for f in report.findings] == ["restricted-python-incomplete"]
    assert report.passed and report.warnings == 1
    assert not check_source("x = " + "+".join(["1"] * 900), "strict").passed


def test_findings_are_capped_with_totals_kept() -> None:
    source = "import os\n" + "eval(x)\n" * 100_000 + "self._x = 1\n"
    report = check_source(source, "strict")
    assert report.errors == 100_001 and report.warnings == 0 and not report.passed
    assert len(report.findings) == MAX_FINDINGS + 1
    listed, last = report.findings[:-1], report.findings[-1]
    assert last.rule == "too-many-findings" and last.severity == "info" and last.line is None
    assert str(100_000 + 2 - MAX_FINDINGS) in last.message
    # errors first, then by position: the import and the earliest 499 evals; the info is cut
    assert {f.rule for f in listed} == {"dynamic-eval", "import-not-allowed"}
    assert [f.line for f in listed] == list(range(1, MAX_FINDINGS + 1))


def test_cap_keeps_errors_buried_among_many_warnings() -> None:
    source = "getattr(a, b)\n" * 2_000 + "__import__(x)\n"
    report = check_source(source)
    assert report.errors == 1 and report.warnings == 2_000
    assert any(f.rule == "dynamic-import" and f.line == 2_001 for f in report.findings)


def test_findings_are_sorted_and_unknown_positions_last() -> None:
    report = check_source('print("x")\nimport os\ng = f.__globals__\nopen("a")\n')
    known = [(f.line, f.col or 0) for f in report.findings if f.line is not None]
    assert known == sorted(known) and len(known) >= 4
    assert report.findings[-1].line is None  # RestrictedPython's module-level print warning


def test_report_is_json_able() -> None:
    report = check_source('import os\nx = f.__globals__\n"\\d"\nprint(1)\n')
    assert isinstance(report, PolicyReport) and all(isinstance(f, Finding) for f in report.findings)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["policy"] == "standard" and data["passed"] is False
    assert data["errors"] == report.errors and data["warnings"] == report.warnings
    assert data["findings"][0] == {"rule": "import-not-allowed", "line": 1, "col": 0,
                                   "message": "import of 'os' (not in the allow-list)", "severity": "warning"}
    assert {f["severity"] for f in data["findings"]} == {"error", "warning", "info"}


def test_messages_are_bounded() -> None:
    name = "x" * 100_000
    report = check_source(f"import {name}\nv = getattr(o, {name})\n")
    assert report.findings and all(len(f.message) <= 300 for f in report.findings)


# -- BFCL's multi-turn tool modules --------------------------------------------------------------
@pytest.fixture(scope="module")
def bfcl_modules() -> dict[str, str]:
    wheel = bfcl.cached_wheel()
    if wheel is None:
        reason = (f"{bfcl.WHEEL_FILENAME} is not cached in {bfcl.default_cache_dir()}; run scripts/setup "
                  "(it runs `sandpit bfcl fetch`)")
        if os.environ.get("SANDPIT_REQUIRE_DOCKER"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    suite = bfcl.load_suite(wheel)
    modules: dict[str, str] = {}
    for env in suite.environments.values():
        embedded = bfcl.embedded_modules(env.source_code)
        assert embedded, f"{env.name}: no embedded module found (composite format changed?)"
        modules.update(embedded)
    wrapper = check_source(min(suite.environments.values(), key=lambda env: len(env.source_code)).source_code)
    assert {"dynamic-eval", "dunder-dict"} <= {f.rule for f in wrapper.findings}  # exec(compile(...))
    return modules


def test_bfcl_tool_modules_pass_standard_with_warnings_only(bfcl_modules: dict[str, str]) -> None:
    totals: Counter[tuple[str, str]] = Counter()
    for dotted, source in sorted(bfcl_modules.items()):
        report = check_source(source, "standard", filename=dotted)
        assert report.passed, (dotted, [f for f in report.findings if f.severity == "error"])
        totals.update((f.rule, f.severity) for f in report.findings)
    assert len(bfcl_modules) >= 9  # 8 tool classes + long_context
    assert {rule for rule, _ in totals} <= {"import-not-allowed", "dynamic-getattr", "open-call",
                                             "restricted-python-calibrated", "restricted-python-warning"}
    assert any(not check_source(source, "strict").passed for source in bfcl_modules.values())


def test_findings_made_elsewhere_extend_a_report_at_the_policy_severity() -> None:
    report = check_source("x = 1\neval('2')\n", "standard")
    found = [(3, 4, "replaced"), (None, None, "m" * 1000)]
    extended = report.extended("init-config-replaces-attribute", found)
    assert extended.passed and extended.warnings == report.warnings + 2 and extended.errors == report.errors
    added = [f for f in extended.findings if f.rule == "init-config-replaces-attribute"]
    assert [(f.line, f.severity) for f in added] == [(3, "warning"), (None, "warning")]
    assert len(added[1].message) == 300
    assert [f.line for f in extended.findings] == sorted(f.line for f in extended.findings if f.line) + [None]
    assert report.extended("init-config-replaces-attribute", []) is report
    with pytest.raises(KeyError):
        report.extended("no-such-rule", found)
