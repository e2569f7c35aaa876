"""Tool schemas derived inside a real sandbox: ``SandboxPool.describe`` (describe-only: the
class is never instantiated) and ``Session.describe`` (a live instance's class).

The environment sources below are untrusted code: they only ever run inside sandboxes.
Every hostile case must end in its own clear error (never a runner crash, a hung host or a
leaked container), and the pool must serve the next describe and call as usual.
"""

from __future__ import annotations

import json
import re
import time
import zipfile
from pathlib import Path

import pytest
from sandpit.executor.errors import SessionError, SessionOpenError, ToolSchemaError
from sandpit.executor.pool import SandboxPool
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.settings import get_image_settings
from sandpit.sandbox_images import DEFINITION_DIR
from sandpit.sandbox_images.runner import limits

pytestmark = pytest.mark.docker

TENANT = "tests"  # the tenant of the shared pool's fast profile (conftest)

ORDER_DESK = (DEFINITION_DIR / "environments" / "order_desk.py").read_text()

INVENTORY = '''
from typing import Dict, List, Literal, Optional


class Inventory:
    def __init__(self, init_config: dict):
        self.stock: Dict[str, int] = dict(init_config.get("stock", {}))

    def restock(self, sku: str, quantity: int = 1, note: Optional[str] = None) -> dict:
        """Add units of a product.

        Args:
            sku (str): Product code.
            quantity (int): Units to add.
            note: Free text.
        """
        self.stock[sku] = self.stock.get(sku, 0) + quantity
        return {"success": True}

    def report(self, order: Literal["asc", "desc"] = "asc", skus: List[str] = []) -> list:
        """List stock levels."""
        return sorted(self.stock.items(), reverse=order == "desc")
'''

INIT_RAISES = '''
class Env:
    def __init__(self, init_config):
        raise RuntimeError("instantiated!")

    def tool(self, x: int) -> int:
        """A tool."""
        return x
'''

INIT_LOOPS = INIT_RAISES.replace('raise RuntimeError("instantiated!")', "while True:\n            pass")

BFCL_STYLE = '''
class Env:
    def __init__(self):
        self.root = None  # BFCL: state comes later, from _load_scenario

    def _load_scenario(self, scenario: dict, long_context: bool = False) -> None:
        self.root = scenario

    def cd(self, folder: str) -> dict:
        """
        Change the current working directory to the specified folder.

        Args:
            folder (str): The folder of the directory to change to.
        """
        return {}
'''


def describe(pool: SandboxPool, profile: ResourceProfile, source: str, class_name: str = "Env") -> list[dict]:
    return pool.describe(tenant=TENANT, source=source, class_name=class_name, profile=profile)


def by_name(tools: list[dict]) -> dict[str, dict]:
    return {tool["function"]["name"]: tool["function"] for tool in tools}


def assert_pool_still_works(pool: SandboxPool, profile: ResourceProfile, open_env) -> None:
    """The next describe and an ordinary episode both work after a hostile case."""
    assert list(by_name(describe(pool, profile, INVENTORY, "Inventory"))) == ["restock", "report"]
    session = open_env(source=INVENTORY, class_name="Inventory", init_config={"stock": {"A": 1}})
    result = session.call("restock", {"sku": "A", "quantity": 2})
    assert result.status == "ok", result
    assert session.state() == {"stock": {"A": 3}}
    assert all(not sandbox.sessions for sandbox in list(pool.sets.all.values()) if sandbox.handle is not session._sandbox)


# -- ordinary environments ---------------------------------------------------------------------------
def test_describe_envscaler_class(pool: SandboxPool, fast_profile: ResourceProfile) -> None:
    tools = describe(pool, fast_profile, INVENTORY, "Inventory")
    assert tools == [
        {"type": "function", "function": {
            "name": "restock", "description": "Add units of a product.",
            "parameters": {"type": "object", "properties": {
                "sku": {"type": "string", "description": "Product code."},
                "quantity": {"type": "integer", "description": "Units to add.", "default": 1},
                "note": {"type": "string", "description": "Free text.", "default": None},
            }, "required": ["sku"], "additionalProperties": False}}},
        {"type": "function", "function": {
            "name": "report", "description": "List stock levels.",
            "parameters": {"type": "object", "properties": {
                "order": {"type": "string", "enum": ["asc", "desc"], "description": "", "default": "asc"},
                "skus": {"type": "array", "items": {"type": "string"}, "description": "", "default": []},
            }, "required": [], "additionalProperties": False}}},
    ]
    desk = by_name(describe(pool, fast_profile, ORDER_DESK, "OrderDesk"))
    assert list(desk) == ["search_products", "get_product", "add_to_cart", "checkout", "cancel_order"]
    assert desk["add_to_cart"]["parameters"]["required"] == ["customer_id", "product_id"]


def test_session_describe_uses_the_live_instance_class(open_env, probe) -> None:
    session = open_env(init_config={"counter": 5})
    tools = by_name(session.describe())
    assert list(tools) == ["bump", "run"]
    assert tools["bump"]["parameters"]["properties"] == {"by": {"description": "", "default": 1}}
    # a tool added to the class at run time is a tool of the live instance
    probe.ok(session, "type(self).double = lambda self, x: 2 * x\nresult = 'ok'")
    assert list(by_name(session.describe())) == ["bump", "run", "double"]
    assert session.state() == {"counter": 5, "log": []}  # describe never touches the state
    assert session.call("bump", {"by": 1}).observation == "6"


@pytest.mark.parametrize("source", [INIT_RAISES, INIT_LOOPS, BFCL_STYLE], ids=["raises", "loops", "bfcl"])
def test_describe_only_never_instantiates(pool: SandboxPool, fast_profile: ResourceProfile, source: str) -> None:
    started = time.monotonic()
    tools = by_name(describe(pool, fast_profile, source))
    assert time.monotonic() - started < fast_profile.call_timeout_s  # an __init__ that loops never ran
    assert list(tools) in (["tool"], ["cd"])
    if "cd" in tools:
        assert tools["cd"]["parameters"]["properties"]["folder"] == {
            "type": "string", "description": "The folder of the directory to change to."}


def test_describe_leaves_no_session_behind(pool: SandboxPool, fast_profile: ResourceProfile) -> None:
    describe(pool, fast_profile, INVENTORY, "Inventory")
    assert all(not sandbox.sessions for sandbox in list(pool.sets.all.values()))
    assert pool.stats()["sessions"] == 0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"tenant": ""}, "tenant"), ({"class_name": "not an identifier"}, "class_name"),
    ({"source": "x" * (5 * 1024 * 1024)}, "source"),
])
def test_bad_arguments(pool: SandboxPool, kwargs: dict, match: str) -> None:
    arguments = {"tenant": TENANT, "source": INVENTORY, "class_name": "Inventory", **kwargs}
    with pytest.raises(ValueError, match=match):
        pool.describe(**arguments)


# -- environment code that fails ---------------------------------------------------------------------
@pytest.mark.parametrize(("source", "class_name", "status", "observation"), [
    ("raise RuntimeError('boom at import')\n", "Env", "error", "Error: RuntimeError: boom at import"),
    ("def broken(:\n", "Env", "error", "Error: SyntaxError"),
    (INVENTORY, "Missing", "error", "Error: LookupError: class 'Missing' is not defined by the environment code"),
    ("Env = 3\n", "Env", "error", "Error: TypeError: 'Env' is not a class (the environment code binds it to a int)"),
    ("def Env(self):\n    pass\n", "Env", "error", "Error: TypeError: 'Env' is not a class"),
    ("import os\nos._exit(3)\n", "Env", "crashed", "Error: session process died"),
    ("x = bytearray(10**10)\n", "Env", "oom", "Error:"),
])
def test_module_and_class_errors(pool: SandboxPool, fast_profile: ResourceProfile, open_env, source: str,
                                 class_name: str, status: str, observation: str) -> None:
    with pytest.raises(SessionOpenError) as caught:
        describe(pool, fast_profile, source, class_name)
    assert not isinstance(caught.value, ToolSchemaError)
    assert caught.value.status == status
    assert caught.value.observation.startswith(observation), caught.value.observation
    if status == "error" and "LookupError" not in observation:
        assert caught.value.traceback
    assert_pool_still_works(pool, fast_profile, open_env)


def test_module_that_loops_forever_times_out(pool: SandboxPool, fast_profile: ResourceProfile, open_env) -> None:
    started = time.monotonic()
    with pytest.raises(SessionOpenError) as caught:
        describe(pool, fast_profile, "while True:\n    pass\n")
    assert time.monotonic() - started <= fast_profile.call_timeout_s + 1.5
    assert caught.value.status == "timeout"
    assert "time limit" in caught.value.observation
    assert_pool_still_works(pool, fast_profile, open_env)


# -- hostile classes ------------------------------------------------------------------------------------
HOSTILE_CLASS = '''
class Meta(type):
    def __getattribute__(cls, name):
        raise SystemExit("metaclass __getattribute__ called")

    def __getattr__(cls, name):
        while True:
            pass

    def __dir__(cls):
        return ["x%d" % i for i in range(10**7)]


class Env(metaclass=Meta):
    __signature__ = "s" * 10_000_000
    __doc__ = "d" * 10_000_000

    @property
    def exploding(self):
        raise RuntimeError("a getter ran")

    @property
    def spinning(self):
        while True:
            pass

    def tool(self, a: int) -> int:
        """Still described."""
        return a

    def forged(self, b: str) -> str:
        return b

    forged.__signature__ = "f" * 10_000_000
'''

HUGE_DOCSTRING = '''
class Env:
    def tool(self, a: int) -> int:
        return a

    tool.__doc__ = "word " * 2_000_000 + "\\n\\nArgs:\\n    a: never read\\n"  # 10 MB
'''

MANY_METHODS = '''
Env = type("Env", (), {"tool_%d" % i: (lambda self, x=i: x) for i in range(COUNT)})
'''


def test_hostile_metaclass_huge_class_attributes_and_raising_properties(
        pool: SandboxPool, fast_profile: ResourceProfile, open_env) -> None:
    tools = by_name(describe(pool, fast_profile, HOSTILE_CLASS))
    assert list(tools) == ["tool", "forged"]
    assert tools["tool"]["description"] == "Still described."
    assert tools["forged"]["parameters"] == {"type": "object", "properties": {}, "required": [],
                                             "additionalProperties": True}
    assert_pool_still_works(pool, fast_profile, open_env)


def test_huge_docstring_is_capped(pool: SandboxPool, fast_profile: ResourceProfile) -> None:
    tool = by_name(describe(pool, fast_profile, HUGE_DOCSTRING))["tool"]
    assert len(tool["description"]) == limits.MAX_DESCRIPTION_CHARS
    assert tool["parameters"]["properties"]["a"] == {"type": "integer", "description": ""}


def test_too_many_methods_is_rejected_clearly(pool: SandboxPool, fast_profile: ResourceProfile, open_env) -> None:
    with pytest.raises(ToolSchemaError) as caught:
        describe(pool, fast_profile, MANY_METHODS.replace("COUNT", "10_000"))
    assert caught.value.status == "rejected"
    assert f"more than {limits.MAX_TOOLS} public methods" in caught.value.observation
    assert len(describe(pool, fast_profile, MANY_METHODS.replace("COUNT", str(limits.MAX_TOOLS)))) == limits.MAX_TOOLS
    assert_pool_still_works(pool, fast_profile, open_env)


INTROSPECTION = '''
import os, sys


def spin():
    while True:
        pass


def hog():
    return bytearray(10**10)


class Env:
    def tool(self, a: "EXPRESSION") -> None:
        pass
'''
"""``typing.get_type_hints`` evaluates string annotations: EXPRESSION runs during describe."""


@pytest.mark.parametrize(("expression", "status"), [
    ("spin()", "timeout"), ("os._exit(3)", "crashed"), ("hog()", "oom"),
    ("sys.exit(0)", "error"), ("exec('raise KeyboardInterrupt')", "error"),
])
def test_introspection_that_runs_hostile_code(pool: SandboxPool, fast_profile: ResourceProfile, open_env,
                                              expression: str, status: str) -> None:
    started = time.monotonic()
    with pytest.raises(ToolSchemaError) as caught:
        describe(pool, fast_profile, INTROSPECTION.replace("EXPRESSION", expression))
    assert time.monotonic() - started <= fast_profile.call_timeout_s + 1.5
    assert caught.value.status == status, caught.value.observation
    assert caught.value.observation.startswith("Error")
    assert_pool_still_works(pool, fast_profile, open_env)


FORGER = '''
import json, os, struct, sys


def forge():
    """Called while the session child evaluates annotations: answer describe with TOOLS."""
    frame = sys._getframe()
    while frame.f_code.co_name != "serve":
        frame = frame.f_back
    body = json.dumps({"id": frame.f_locals["request_id"], "status": "ok", "tools": TOOLS,
                       "notes": []}).encode()
    os.write(3, struct.pack(">I", len(body)) + body)
    return int


class Env:
    def tool(self, a: "forge()") -> None:
        pass
'''


@pytest.mark.parametrize(("tools", "error", "match"), [
    ('[{"type": "function", "function": {"name": "__import__"}}]', SessionError, "malformed tool schemas"),
    ('[{"type": "function", "function": {"name": "t", "description": "", "parameters": {"type": "object", '
     '"properties": {"a": {"description": "", "type": "exec"}}, "required": [], "additionalProperties": False}}}]',
     SessionError, "unknown type"),
    ('["x" * 1000] * 5000', ToolSchemaError, "exceed"),
    ('"not a list"', ToolSchemaError, "malformed describe reply"),
    ('[{"type": "function", "function": {"name": "t", "description": "\\ud800", "parameters": {"type": '
     '"object", "properties": {}, "required": [], "additionalProperties": False}}}]', None, None),
])
def test_forged_describe_replies_are_validated(pool: SandboxPool, fast_profile: ResourceProfile, open_env,
                                               tools: str, error: type | None, match: str | None) -> None:
    if error is None:  # a lone surrogate (a valid JSON escape, not UTF-8) must not stop the runner
        assert describe(pool, fast_profile, FORGER.replace("TOOLS", tools))[0]["function"]["description"] == "?"
    else:
        with pytest.raises(error, match=match) as caught:
            describe(pool, fast_profile, FORGER.replace("TOOLS", tools))
        if error is ToolSchemaError:
            assert caught.value.status == "error"
    assert_pool_still_works(pool, fast_profile, open_env)


def test_lone_surrogates_in_observations_and_errors_do_not_crash(open_env, probe) -> None:
    session = open_env(init_config={"counter": 1})
    result = probe.run(session, "result = 'bad \\ud800 text'")
    assert (result.status, result.observation) == ("ok", "bad ? text")
    result = probe.run(session, "raise ValueError('\\udcff')")
    assert (result.status, result.observation) == ("error", "Error: ValueError: ?")
    assert session.call("bump", {"by": 1}).observation == "2"


# -- BFCL's own classes against BFCL's own function docs ------------------------------------------------
BFCL_CLASSES = {"gorilla_file_system": "GorillaFileSystem", "message_api": "MessageAPI",
                "posting_api": "TwitterAPI", "ticket_api": "TicketAPI", "trading_bot": "TradingBot",
                "travel_booking": "TravelAPI", "vehicle_control": "VehicleControlAPI"}
BFCL_TYPES = {"dict": "object", "float": "number", "integer": "integer", "string": "string", "array": "array",
              "boolean": "boolean", "tuple": "array"}
SOURCES = "bfcl_eval/eval_checker/multi_turn_eval/func_source_code/"
LONG_CONTEXT_IMPORT = re.compile(
    r"from bfcl_eval\.eval_checker\.multi_turn_eval\.func_source_code\.long_context import \([^)]*\)\n")


def _bfcl_wheel() -> Path | None:
    found = sorted((get_image_settings().cache_dir / "bfcl").glob("bfcl_eval-*.whl"))
    return found[-1] if found else None


@pytest.mark.skipif(_bfcl_wheel() is None, reason="no bfcl_eval wheel in the sandpit cache")
@pytest.mark.parametrize("module", list(BFCL_CLASSES))
def test_bfcl_classes_match_bfcl_function_docs(pool: SandboxPool, fast_profile: ResourceProfile, module: str) -> None:
    """BFCL's multi-turn classes (read from the wheel as text, run only in the sandbox; the
    long_context constants they import are inlined) against the function docs BFCL compiles
    from them: same tools, parameters, required lists, types and descriptions."""
    with zipfile.ZipFile(_bfcl_wheel()) as wheel:  # type: ignore[arg-type]
        source = wheel.read(f"{SOURCES}{module}.py").decode()
        if LONG_CONTEXT_IMPORT.search(source):
            source = wheel.read(f"{SOURCES}long_context.py").decode() + "\n" + LONG_CONTEXT_IMPORT.sub("", source)
        reference = [json.loads(line) for line in
                     wheel.read(f"bfcl_eval/data/multi_turn_func_doc/{module}.json").decode().splitlines()]
    ours = by_name(describe(pool, fast_profile, source, BFCL_CLASSES[module]))
    theirs = {doc["name"]: doc for doc in reference}
    assert sorted(ours) == sorted(theirs)
    for name, doc in theirs.items():
        mine = ours[name]
        assert mine["description"] == " ".join(doc["description"].split("Tool description: ", 1)[1].split())
        assert sorted(mine["parameters"]["required"]) == sorted(doc["parameters"].get("required", []))
        assert mine["parameters"]["properties"].keys() == doc["parameters"]["properties"].keys()
        for param, expected in doc["parameters"]["properties"].items():
            got = mine["parameters"]["properties"][param]
            assert got.get("type") == BFCL_TYPES[expected["type"]], (name, param, got, expected)
            assert got["description"].startswith(" ".join(expected["description"].split())), (name, param)
            if "items" in expected:
                assert got["items"].get("type") == BFCL_TYPES[expected["items"]["type"]], (name, param)
