"""``sandpit synth`` end to end: the real ``openai`` client against a scripted
OpenAI-compatible server (``fake_openai.ScriptedLLM``), the real API server and sandboxes.

* two seed tasks -> two environments built; LibrarySystem kept, TableBooker rejected by
  the dual-agent quality check -> a scenario with valid check functions -> registered and
  runnable (env from the scenario, step, evaluate);
* malformed answers (no code block, wrong class name, non-JSON, a syntax error, a check
  function that raises, one already true on the initial state) are retried with feedback;
* resume: the first run stops with the ScenGenerator stage partial (the model endpoint
  has no answer for checklists yet); the rerun repeats no finished model call;
* isolation: generated code whose module level, method and check function write a marker
  file on a host path runs through the API (registered, stepped, evaluated); the marker
  never appears.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fake_openai import Rule, ScriptedLLM, ToolCallScript
from sandpit.client import Client
from sandpit.synth_cli import synth_app
from typer.testing import CliRunner

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

P = "# sandpit-prompt "


def js(value: Any) -> str:
    return "```json\n" + json.dumps(value) + "\n```"


def py(code: str) -> str:
    return "```python\n" + code.strip("\n") + "\n```"


LIBRARY_DEF = '''
from typing import Dict, List


class LibrarySystem:
    """A city library: members borrow books."""

    def __init__(self, init_config: dict):
        self.books: Dict[str, dict] = init_config.get("books", {})
        self.members: Dict[str, dict] = init_config.get("members", {})
        self.loans: List[dict] = init_config.get("loans", [])
'''

GET_BOOK = '''
def get_book(self, book_id: str) -> dict:
    """Return a book's record.

    Args:
        book_id (str): the book's id.
    """
    if book_id not in self.books:
        return {"success": False, "error": "no such book"}
    return {"success": True, "data": self.books[book_id]}
'''

BORROW_BOOK = '''
def borrow_book(self, member_id: str, book_id: str) -> dict:
    """Lend a book to a member.

    Args:
        member_id (str): the member's id.
        book_id (str): the book's id.
    """
    book = self.books.get(book_id)
    if book is None or member_id not in self.members:
        return {"success": False, "error": "unknown member or book"}
    if book["available"] <= 0:
        return {"success": False, "error": "no copy available"}
    book["available"] -= 1
    self.loans.append({"member_id": member_id, "book_id": book_id})
    return {"success": True}
'''

LIBRARY_STATE = {"books": {"B1": {"title": "Dune", "available": 1}, "B2": {"title": "Emma", "available": 0}},
                 "members": {"M1": {"name": "Ada"}}, "loans": []}

BOOKER_DEF = '''
class TableBooker:
    """A restaurant's table bookings."""

    def __init__(self, init_config: dict):
        self.tables = init_config.get("tables", {})
        self.bookings = init_config.get("bookings", [])
'''

BOOK_TABLE = '''
def book_table(self, table_id: str, guests: int) -> dict:
    """Book a table.

    Args:
        table_id (str): the table's id.
        guests (int): number of guests.
    """
    return {"success": True}
'''

CHECK_LENT = '''
def check_func(final_state):
    return any(l["book_id"] == "B1" and l["member_id"] == "M1" for l in final_state["loans"])
'''
CHECK_FEWER = '''
def check_func(final_state):
    return final_state["books"]["B1"]["available"] == initial_state["books"]["B1"]["available"] - 1
'''


def library_rules() -> list[Rule]:
    c = "LibrarySystem"
    return [
        Rule(contains=[P + "judge_stateful", "Dune"], content=js({"stateful": True, "reason": "loans"})),
        Rule(contains=[P + "infer_environment", "Dune"], content=js({
            "environment_summary": "City library lending",
            "environment_introduction": "A city library with books and members; members borrow books.",
            "usefulness": 8, "modelability": 9})),
        Rule(contains=[P + "state_space", "city library"], content=js({
            "env_class_name": c, "state_space_definition": [
                {"entity_name": "Book", "attributes": [{"name": "available", "type": "int", "description": "copies"}]}],
            "constraints_rules": ["A book can only be lent when a copy is available."]})),
        # malformed twice (no code block, then the wrong class name), then right
        Rule(contains=[P + "class_definition", c], turn=0, content="Here is the class: class LibrarySystem: ..."),
        Rule(contains=[P + "class_definition", c], turn=1, content=py(LIBRARY_DEF.replace("class LibrarySystem",
                                                                                           "class Library"))),
        Rule(contains=[P + "class_definition", c], content=py(LIBRARY_DEF)),
        Rule(contains=[P + "operations", c], turn=0, content="I would offer get_book and borrow_book."),
        Rule(contains=[P + "operations", c], content=js({"operation_list": [
            {"operation_name": "get_book", "operation_type": "query", "description": "read a book"},
            {"operation_name": "borrow_book", "operation_type": "modify", "description": "lend a book"}]})),
        Rule(contains=[P + "method_code", c, "Operation: get_book"], turn=0,
             content=py("def get_book(self, book_id: str) -> dict\n    return {}")),
        Rule(contains=[P + "method_code", c, "Operation: get_book"], content=py(GET_BOOK)),
        Rule(contains=[P + "method_code", c, "Operation: borrow_book"], content=py(BORROW_BOOK)),
        Rule(contains=[P + "test_configs", c], content=js({"init_configs": [LIBRARY_STATE]})),
        Rule(contains=[P + "test_agent", c], turn=0, content='{"case_type": "positive", "thought": "read"}',
             tool_calls=[ToolCallScript(name="get_book", arguments={"book_id": "B1"})]),
        Rule(contains=[P + "test_agent", c], turn=1, content='{"case_type": "positive", "thought": "lend"}',
             tool_calls=[ToolCallScript(name="borrow_book", arguments={"member_id": "M1", "book_id": "B1"})]),
        Rule(contains=[P + "test_agent", c], turn=2, content='{"case_type": "negative", "thought": "no copy"}',
             tool_calls=[ToolCallScript(name="borrow_book", arguments={"member_id": "M1", "book_id": "B2"})]),
        Rule(contains=[P + "test_agent", c], content="DONE"),
        Rule(contains=[P + "judge_call", c], content=js({"analysis": "correct", "result": "pass",
                                                          "error_reason": "No error"})),
        Rule(contains=[P + "init_configs", c], content=js({"init_configs": [LIBRARY_STATE]})),
        Rule(contains=[P + "scenario_task", c], content=js({"task": "Ada (M1) wants to borrow Dune (B1)."})),
    ]


def library_check_rules() -> list[Rule]:
    return [
        Rule(contains=[P + "checklist", "Ada (M1)"], content=js({"checklist": [
            {"check_item": "B1 is lent to M1", "expects_change": True},
            {"check_item": "one copy fewer of B1", "expects_change": True}]})),
        # raises on any state -> invalid -> regenerated
        Rule(contains=[P + "check_function", "Check item: B1 is lent to M1"], turn=0,
             content=py("def check_func(final_state):\n    return final_state['lending_log'][0]")),
        Rule(contains=[P + "check_function", "Check item: B1 is lent to M1"], content=py(CHECK_LENT)),
        # already true on the initial state although the item expects a change -> regenerated
        Rule(contains=[P + "check_function", "Check item: one copy fewer"], turn=0,
             content=py("def check_func(final_state):\n    return final_state['books']['B1']['available'] >= 0")),
        Rule(contains=[P + "check_function", "Check item: one copy fewer"], content=py(CHECK_FEWER)),
    ]


def booker_rules() -> list[Rule]:
    c = "TableBooker"
    return [
        Rule(contains=[P + "judge_stateful", "Blue Fox"], content=js({"stateful": True})),
        Rule(contains=[P + "infer_environment", "Blue Fox"], content=js({
            "environment_summary": "Restaurant table reservations",
            "environment_introduction": "A restaurant reservation book: tables, seats and bookings per evening."})),
        Rule(contains=[P + "state_space", "reservation book"], content=js({
            "env_class_name": c, "state_space_definition": [{"entity_name": "Table", "attributes": []}],
            "constraints_rules": ["A table holds one booking per evening."]})),
        Rule(contains=[P + "class_definition", c], content=py(BOOKER_DEF)),
        Rule(contains=[P + "operations", c], content=js({"operation_list": [
            {"operation_name": "book_table", "operation_type": "modify", "description": "book a table"}]})),
        Rule(contains=[P + "method_code", c, "Operation: book_table"], content=py(BOOK_TABLE)),
        Rule(contains=[P + "test_configs", c], content=js({"init_configs": [{"tables": {"T1": {"seats": 4}},
                                                                              "bookings": []}]})),
        Rule(contains=[P + "test_agent", c], turn=0, content='{"case_type": "positive"}',
             tool_calls=[ToolCallScript(name="book_table", arguments={"table_id": "T1", "guests": 2})]),
        Rule(contains=[P + "test_agent", c], content="DONE"),
        Rule(contains=[P + "judge_call", c], content=js({"analysis": "claims success but records no booking",
                                                          "result": "fail", "error_reason": "no state change"})),
    ]


def synth_env(monkeypatch: pytest.MonkeyPatch, llm: ScriptedLLM) -> None:
    for name, value in {"BASE_URL": llm.base_url, "MODEL": "scripted", "API_KEY": "sk-test-not-a-secret",
                        "ATTEMPTS": "3", "SCENARIOS_PER_ENV": "1", "TEST_CONFIGS_PER_ENV": "1",
                        "RETRIES": "2", "RETRY_BACKOFF_S": "0.01", "MAX_CONCURRENCY": "2"}.items():
        monkeypatch.setenv(f"SANDPIT_SYNTH_{name}", value)


def by_prompt(llm: ScriptedLLM) -> Counter[str]:
    counts: Counter[str] = Counter()
    for request in llm.chat_requests():
        first = str(request["messages"][0].get("content") or "")
        counts[first.split()[2] if first.startswith(P) else "?"] += 1
    return counts


def invoke(*args: str) -> Any:
    return CliRunner().invoke(synth_app, list(args), catch_exceptions=False)


def test_two_seeds_to_registered_runnable_scenarios(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"task_id": "lib", "task": "Ada (member M1) wants to borrow Dune (B1)."}) + "\n"
                     + json.dumps({"task_id": "fox", "task": "Reserve a table for two at the Blue Fox tonight."})
                     + "\n")
    run_dir = tmp_path / "run"
    with ScriptedLLM(library_rules() + booker_rules()) as llm:
        synth_env(monkeypatch, llm)
        args = ["run", "--run-dir", str(run_dir), "--url", server.url, "--api-key", server.api_key, "--register"]
        first = invoke(*args, "--seeds", str(seeds))
        assert first.exit_code == 1, first.output  # checklists have no scripted answer yet
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["stages"]["skel_3_quality"]["status"] == "done"
        assert manifest["stages"]["scen_scenarios"]["status"] == "partial"
        before = by_prompt(llm)
        assert before["checklist"] >= 1 and before["check_function"] == 0

        llm.rules[:0] = library_check_rules()
        second = invoke(*args)
        assert second.exit_code == 0, second.output
        after = by_prompt(llm)
    # resume: nothing finished before was asked again (only checklist and check functions are new)
    repeated = {name: after[name] - before[name] for name in before if name != "checklist"}
    assert all(n == 0 for n in repeated.values()), repeated
    assert after["checklist"] == before["checklist"] + 1
    assert "sk-test-not-a-secret" not in (run_dir / "manifest.json").read_text()

    # malformed answers were retried with feedback, each a new request
    assert before["class_definition"] == 3 + 1 and before["operations"] == 2 + 1
    assert before["method_code"] == 2 + 1 + 1

    quality = json.loads((run_dir / "skel_3_quality.json").read_text())
    assert [r["key"] for r in quality["rejected"]] == ["env_fox"]
    assert quality["rejected"][0]["reason"] == "quality check"
    metadata = json.loads((run_dir / "env_metadata.json").read_text())
    assert list(metadata) == ["env_lib"]
    assert metadata["env_lib"]["env_class_name"] == "LibrarySystem"
    assert {t["function"]["name"] for t in metadata["env_lib"]["tools"]} == {"get_book", "borrow_book"}
    assert metadata["env_lib"]["func_test_result"]["summary"]["pass_count"] == 3

    scenarios = json.loads((run_dir / "env_scenarios.json").read_text())
    assert len(scenarios) == 1 and scenarios[0]["env_id"] == "env_lib"
    assert [c["check_item"] for c in scenarios[0]["checklist_with_func"]] == ["B1 is lent to M1",
                                                                              "one copy fewer of B1"]
    drafts = json.loads((run_dir / "scen_scenarios.json").read_text())["items"]
    attempts = {c["check_item"]: (c["attempts"], c["flags"]) for c in drafts[0]["checks"]}
    assert attempts == {"B1 is lent to M1": (2, []), "one copy fewer of B1": (2, [])}
    assert "check functions valid" in second.output and "2/2" in second.output

    registered = json.loads((run_dir / "registered.json").read_text())
    assert [(r["kind"], r["status"]) for r in registered] == [("environment", "imported"), ("scenario", "imported")]
    with Client(server.url, api_key=server.api_key) as client:
        with client.envs.create(scenario_id=registered[1]["sandpit_id"]) as env:
            assert env.evaluate().reward == 0.0
            assert env.step("borrow_book", member_id="M1", book_id="B1").status == "ok"
            evaluation = env.evaluate()
    assert evaluation.reward == 1.0 and evaluation.passed == 2


MARKER_DEF = '''
from typing import List

MARKER = "@MARKER@"
try:
    with open(MARKER, "w") as handle:
        handle.write("module level")
except OSError:
    pass


class Notebook:
    """Notes."""

    def __init__(self, init_config: dict):
        self.notes: List[str] = init_config.get("notes", [])
'''

MARKER_METHOD = '''
def add_note(self, text: str) -> dict:
    """Add a note (and try to write the marker).

    Args:
        text (str): the note.
    """
    try:
        with open(MARKER, "w") as handle:
            handle.write("method")
    except OSError:
        pass
    self.notes.append(text)
    return {"success": True}
'''

MARKER_CHECK = '''
def check_func(final_state):
    try:
        with open("@MARKER@", "w") as handle:
            handle.write("check")
    except OSError:
        pass
    return len(final_state["notes"]) > len(initial_state["notes"])
'''


def test_generated_code_never_runs_on_the_host(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "host" / "marker"
    marker.parent.mkdir()
    definition, check = (MARKER_DEF.replace("@MARKER@", str(marker)), MARKER_CHECK.replace("@MARKER@", str(marker)))
    c = "Notebook"
    rules = [
        Rule(contains=[P + "judge_stateful"], content=js({"stateful": True})),
        Rule(contains=[P + "infer_environment"], content=js({"environment_summary": "Notes",
                                                             "environment_introduction": "A notebook of notes."})),
        Rule(contains=[P + "state_space"], content=js({"env_class_name": c, "state_space_definition": [],
                                                       "constraints_rules": []})),
        Rule(contains=[P + "class_definition"], content=py(definition)),
        Rule(contains=[P + "operations"], content=js({"operation_list": [
            {"operation_name": "add_note", "operation_type": "modify"}]})),
        Rule(contains=[P + "method_code"], content=py(MARKER_METHOD)),
        Rule(contains=[P + "test_configs"], content=js({"init_configs": [{"notes": []}]})),
        Rule(contains=[P + "test_agent"], turn=0, tool_calls=[ToolCallScript(name="add_note",
                                                                             arguments={"text": "hi"})]),
        Rule(contains=[P + "test_agent"], content="DONE"),
        Rule(contains=[P + "judge_call"], content=js({"result": "pass"})),
        Rule(contains=[P + "init_configs"], content=js({"init_configs": [{"notes": ["old"]}]})),
        Rule(contains=[P + "scenario_task"], content=js({"task": "Add the note 'milk'."})),
        Rule(contains=[P + "checklist"], content=js({"checklist": [{"check_item": "a note was added",
                                                                    "expects_change": True}]})),
        Rule(contains=[P + "check_function"], content=py(check)),
    ]
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"task": "Write down 'milk' in my notebook."}) + "\n")
    with ScriptedLLM(rules) as llm:
        synth_env(monkeypatch, llm)
        result = invoke("run", "--run-dir", str(tmp_path / "run"), "--seeds", str(seeds), "--url", server.url,
                        "--api-key", server.api_key, "--register")
    assert result.exit_code == 0, result.output
    registered = json.loads((tmp_path / "run" / "registered.json").read_text())
    assert [(r["kind"], r["status"]) for r in registered] == [("environment", "imported"), ("scenario", "imported")]
    with Client(server.url, api_key=server.api_key) as client:
        environment = client.environments.get(registered[0]["sandpit_id"])
        assert environment.class_name == "Notebook"
        with client.envs.create(scenario_id=registered[1]["sandpit_id"]) as env:
            assert env.step("add_note", text="milk").status == "ok"
            assert env.evaluate().reward == 1.0
    quality = json.loads((tmp_path / "run" / "skel_3_quality.json").read_text())
    assert quality["items"][0]["cases"][0]["status"] == "ok"  # the method ran, in a sandbox
    assert not marker.exists()
    assert list(marker.parent.iterdir()) == []
