"""EnvScaler RL episodes over HTTP, on real sandboxes (issue 11): one faithful state seen
the same way by every reader and by check functions, scenario-bound episodes with the
server's reward/terminated/truncated, malformed actions as recorded steps, arguments that
go to Python as given, a conversational episode against a scripted OpenAI-compatible
user, readable history across resets, and real third-party code under the default policy.

Every environment and check below is untrusted code: it only runs inside sandboxes.
"""

from __future__ import annotations

import json
from datetime import datetime

import httpx
import pytest
from fake_openai import Rule, ScriptedLLM

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

LEDGER = '''
import dataclasses
from datetime import date


@dataclasses.dataclass
class Item:
    sku: str
    qty: int


@dataclasses.dataclass
class Order:
    id: str
    due: date
    items: list


class Ledger:
    """Accounts with tags, dated orders and a private audit trail."""

    def __init__(self, init_config):
        self.balance = init_config.get("balance", 0)
        self.tags = set(init_config.get("tags", []))
        self.orders = {}
        self.opened = date(2024, 1, 2)
        self.pair = (1, "a")
        self._audit = []

    def deposit(self, amount: int) -> str:
        """Add money.

        Args:
            amount (int): how much.
        """
        self.balance += amount
        self._audit.append(("deposit", amount))
        return f"balance {self.balance}"

    def lookup(self, n: int) -> str:
        """Echo a number.

        Args:
            n (int): a number.
        """
        return f"found {n}"

    def tag(self, label: str) -> int:
        """Add a tag."""
        self.tags.add(label)
        return len(self.tags)

    def order(self, order_id: str, sku: str, qty: int) -> str:
        """Place an order due on 2024-05-01."""
        self.orders[order_id] = Order(order_id, date(2024, 5, 1), [Item(sku, qty)])
        return f"ordered {order_id}"

    def fail(self) -> str:
        """Always raises."""
        raise RuntimeError("broken tool")
'''

CHECKS = [
    {"check_item": "balance reached 10", "check_func": "def check_func(final_state):\n"
                                                       "    return final_state['balance'] == 10\n"},
    {"check_item": "tagged vip", "check_func": "def check_func(final_state):\n"
                                               "    return isinstance(final_state['tags'], set) and 'vip' in final_state['tags']\n"},
    {"check_item": "order O1 due before June", "check_func":
        "from datetime import date\n\ndef check_func(final_state):\n"
        "    order = final_state['orders'].get('O1')\n"
        "    return order is not None and order.due < date(2024, 6, 1) and order.items[0].sku == 'A'\n"},
]


def _ok(response: httpx.Response, status: int = 200) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json()


def _step(api: httpx.Client, env_id: str, body: dict, include: str | None = None) -> dict:
    params = {"include": include} if include else None
    return _ok(api.post(f"/v1/envs/{env_id}/step", json=body, params=params))


@pytest.fixture(scope="module")
def ledger_id(server) -> str:
    with server.client() as client:
        return _ok(client.post("/v1/environments", json={
            "name": "ledger", "source_code": LEDGER, "class_name": "Ledger",
            "introduction": "A small bank ledger.", "rules": ["Never overdraw.", "Tag VIP customers."],
            "sample_init_config": {"balance": 1}}), 201)["id"]


@pytest.fixture(scope="module")
def scenario_id(server, ledger_id: str) -> str:
    with server.client() as client:
        return _ok(client.post("/v1/scenarios", json={
            "environment_id": ledger_id, "task": "Deposit 10, tag the customer vip, order one A as O1.",
            "init_config": {"balance": 0}, "checklist": [c["check_item"] for c in CHECKS],
            "checklist_with_func": CHECKS}), 201)["id"]


def test_one_state_for_every_reader_and_real_objects_for_checks(api: httpx.Client, ledger_id: str) -> None:
    env = _ok(api.post("/v1/envs", json={"environment_id": ledger_id, "init_config": {"balance": 3}}), 201)
    env_id = env["id"]
    _step(api, env_id, {"name": "tag", "arguments": {"label": "vip"}})
    result = _step(api, env_id, {"name": "order", "arguments": {"order_id": "O1", "sku": "A", "qty": 2}},
                   include="state,state_diff")
    head = _ok(api.get(f"/v1/envs/{env_id}/state"))
    at_two = _ok(api.get(f"/v1/envs/{env_id}/state", params={"step": 2}))
    assert head["state"] == at_two["state"] == result["state"]
    state = head["state"]
    assert state["tags"] == {"$set": ["vip"]}
    assert state["opened"] == {"$date": "2024-01-02"} and state["pair"] == {"$tuple": [1, "a"]}
    assert state["orders"]["O1"] == {"$object": {"type": "Order", "attrs": {
        "id": "O1", "due": {"$date": "2024-05-01"}, "items": [{"$object": {"type": "Item",
                                                                         "attrs": {"sku": "A", "qty": 2}}}]}}}
    assert state["_audit"] == [] and state["balance"] == 3  # private attributes are state (EnvScaler vars())
    assert head["truncated"] is False
    # EnvScaler get_state_diff: a dict on both sides is diffed key by key, anything else whole
    assert result["state_diff"] == {"orders": {"O1": {"added": state["orders"]["O1"]}}}
    # a stored (evicted) env renders the same: fork one and read it before it has a session
    fork_id = _ok(api.post(f"/v1/envs/{env_id}/fork", json={"count": 1}), 201)["data"][0]["id"]
    assert _ok(api.get(f"/v1/envs/{fork_id}/state"))["state"] == state
    evaluation = _ok(api.post(f"/v1/envs/{env_id}/evaluate", json={"checks": [
        *CHECKS[1:],
        {"check_item": "tuple and date are real", "check_func":
            "import datetime\ndef check_func(final_state):\n"
            "    return final_state['pair'] == (1, 'a') and isinstance(final_state['opened'], datetime.date)\n"},
        {"check_item": "initial state is real too", "check_func":
            "def check_func(final_state):\n    return initial_state['tags'] == set() and initial_state['orders'] == {}\n"},
    ]}))
    assert [r["passed"] for r in evaluation["results"]] == [True, True, True, True], evaluation
    for doomed in (env_id, fork_id):
        assert api.delete(f"/v1/envs/{doomed}").status_code == 204


def test_evaluations_of_envs_sharing_a_start_judge_each_envs_own_states(api: httpx.Client, ledger_id: str) -> None:
    """Envs of one config start from one stored state, whose text the server keeps by
    root for every evaluation: each env's checks still see its own final state, and an
    env's next episode its own steps."""
    config = {"balance": 5}
    checks = [
        {"check_item": "balance 10", "check_func": "def check_func(final_state):\n"
                                                  "    return final_state['balance'] == 10\n"},
        {"check_item": "started at 5, untagged", "check_func":
            "def check_func(final_state):\n"
            "    return initial_state['balance'] == 5 and initial_state['tags'] == set()\n"},
        {"check_item": "tagged vip", "check_func": "def check_func(final_state):\n"
                                                  "    return 'vip' in final_state['tags']\n"},
    ]
    first, second = (_ok(api.post("/v1/envs", json={"environment_id": ledger_id, "init_config": config}), 201)["id"]
                     for _ in range(2))
    _step(api, first, {"name": "deposit", "arguments": {"amount": 5}})
    _step(api, first, {"name": "tag", "arguments": {"label": "vip"}})
    _step(api, second, {"name": "deposit", "arguments": {"amount": 1}})
    for _ in range(2):
        for env_id, expected in ((first, [True, True, True]), (second, [False, True, False])):
            evaluation = _ok(api.post(f"/v1/envs/{env_id}/evaluate", json={"checks": checks}))
            assert [r["passed"] for r in evaluation["results"]] == expected, evaluation
    _ok(api.post(f"/v1/envs/{first}/reset", json={}))
    _step(api, first, {"name": "deposit", "arguments": {"amount": 5}})
    evaluation = _ok(api.post(f"/v1/envs/{first}/evaluate", json={"checks": checks}))
    assert [r["passed"] for r in evaluation["results"]] == [True, True, False], evaluation
    for doomed in (first, second):
        assert api.delete(f"/v1/envs/{doomed}").status_code == 204


def test_arguments_go_to_python_as_given(api: httpx.Client, ledger_id: str) -> None:
    env_id = _ok(api.post("/v1/envs", json={"environment_id": ledger_id}), 201)["id"]
    mismatch = _step(api, env_id, {"name": "deposit", "arguments": {"amount": "5"}})
    assert mismatch["status"] == "error" and mismatch["observation"].startswith("Error: TypeError"), mismatch
    accepted = _step(api, env_id, {"name": "lookup", "arguments": {"n": "ticket_001"}})  # Python accepts it
    assert (accepted["status"], accepted["observation"]) == ("ok", "found ticket_001")
    steps = _ok(api.get(f"/v1/envs/{env_id}/trajectory"))["steps"]
    assert [(s["status"], s["action"]["arguments"]) for s in steps] == [("error", {"amount": "5"}),
                                                                         ("ok", {"n": "ticket_001"})]
    malformed = _step(api, env_id, {"type": "function", "function": {"name": "deposit", "arguments": "{amount: 5"}})
    assert (malformed["status"], malformed["observation"]) == ("rejected", "Error: Failed to parse response to action")
    assert malformed["step"] == 3 and "not valid JSON" in malformed["error"]
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


@pytest.mark.parametrize("mode, expected", [
    ("warn", ("error", ["arguments.amount: '5' is not of type 'integer'"])),
    ("strict", ("rejected", ["arguments.amount: '5' is not of type 'integer'"])),
])
def test_argument_checking_warn_and_strict(api: httpx.Client, ledger_id: str, mode: str, expected: tuple) -> None:
    env_id = _ok(api.post("/v1/envs", json={"environment_id": ledger_id, "argument_checking": mode}), 201)["id"]
    assert _ok(api.get(f"/v1/envs/{env_id}"))["argument_checking"] == mode
    result = _step(api, env_id, {"name": "deposit", "arguments": {"amount": "5"}})
    assert (result["status"], result["argument_findings"]) == expected, result
    fine = _step(api, env_id, {"name": "deposit", "arguments": {"amount": 5}})
    assert fine["status"] == "ok" and fine["argument_findings"] is None
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_scenario_episode_rewards_at_termination(api: httpx.Client, scenario_id: str) -> None:
    env = _ok(api.post("/v1/envs", json={"scenario_id": scenario_id}), 201)
    env_id = env["id"]
    assert env["observation"] == env["task"] == "Deposit 10, tag the customer vip, order one A as O1."
    assert "A small bank ledger." in env["introduction"] and "- Never overdraw." in env["introduction"]
    names = [t["function"]["name"] for t in env["tools"]]
    assert "chat_with_user" in names and "deposit" in names and env["episode_status"] == "running"
    assert env["episode_config"]["max_steps"] == 30 and env["episode_config"]["termination_action"] == "chat_with_user"
    first = _step(api, env_id, {"name": "deposit", "arguments": {"amount": 10}})
    assert (first["reward"], first["terminated"], first["truncated"]) == (0.0, False, False)
    _step(api, env_id, {"text": '<think>tag them</think><tool_call>{"name": "tag", "arguments": {"label": "vip"}}'
                                '</tool_call>'})
    no_content = _step(api, env_id, {"name": "chat_with_user", "arguments": {}})
    assert no_content["status"] == "rejected" and not no_content["terminated"]
    done = _step(api, env_id, {"text": "All done: deposited and tagged."})  # plain text = chat_with_user
    assert (done["observation"], done["observation_role"], done["terminated"]) == ("Task finished", "user", True)
    assert done["action"] == {"name": "chat_with_user", "arguments": {"content": "All done: deposited and tagged."}}
    assert done["reward"] == round(2 / 3, 4) == 0.6667  # the order was never placed: 2 of 3 checks
    assert [c["passed"] for c in done["checks"]] == [True, True, False]
    after = api.post(f"/v1/envs/{env_id}/step", json={"name": "deposit", "arguments": {"amount": 1}})
    assert after.status_code == 409 and after.json()["error"]["code"] == "episode_ended"
    info = _ok(api.get(f"/v1/envs/{env_id}"))
    assert (info["episode_status"], info["reward"]) == ("terminated", 0.6667)
    trajectory = _ok(api.get(f"/v1/envs/{env_id}/trajectory"))
    assert (trajectory["status"], trajectory["reward"], trajectory["count"]) == ("terminated", 0.6667, 4)
    assert trajectory["steps"][-1]["done"] == "terminated" and trajectory["steps"][-1]["reward"] == 0.6667

    # the ended episode runs again when restored to before its end
    _ok(api.post(f"/v1/envs/{env_id}/restore", json={"step": 2}))
    assert _ok(api.get(f"/v1/envs/{env_id}"))["episode_status"] == "running"
    _step(api, env_id, {"name": "order", "arguments": {"order_id": "O1", "sku": "A", "qty": 1}})
    full = _step(api, env_id, {"name": "chat_with_user", "arguments": {"content": "Task Completed"}})
    assert full["terminated"] and full["reward"] == 1.0

    # reset: a new episode of the same scenario, tools and task again, the old one readable
    reset = _ok(api.post(f"/v1/envs/{env_id}/reset", json={}))
    assert (reset["episode"], reset["step"], reset["episode_status"]) == (2, 0, "running")
    assert reset["observation"] == env["observation"] and [t["function"]["name"] for t in reset["tools"]] == names
    old = _ok(api.get(f"/v1/envs/{env_id}/trajectory", params={"episode": 1}))
    assert (old["episode"], old["status"], old["reward"], old["count"]) == (1, "terminated", 1.0, 4)
    old_state = _ok(api.get(f"/v1/envs/{env_id}/state", params={"episode": 1, "step": 4}))
    assert old_state["state"]["balance"] == 10 and "O1" in old_state["state"]["orders"]
    assert _ok(api.get(f"/v1/envs/{env_id}/state"))["state"]["balance"] == 0
    episodes = _ok(api.get(f"/v1/envs/{env_id}/episodes"))
    assert [(e["episode"], e["status"], e["steps"], e["reward"]) for e in episodes["data"]] == [
        (1, "terminated", 4, 1.0), (2, "running", 0, None)]
    page = _ok(api.get(f"/v1/envs/{env_id}/trajectory", params={"episode": 1, "limit": 2, "offset": 1}))
    assert [s["step"] for s in page["steps"]] == [2, 3] and page["count"] == 4
    assert api.get(f"/v1/envs/{env_id}/trajectory", params={"episode": 9}).status_code == 404
    assert api.get(f"/v1/envs/{env_id}/state", params={"episode": 1, "step": 99}).status_code == 404
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_max_steps_truncates_and_scores(api: httpx.Client, scenario_id: str) -> None:
    env_id = _ok(api.post("/v1/envs", json={"scenario_id": scenario_id, "episode": {"max_steps": 2}}), 201)["id"]
    _step(api, env_id, {"name": "deposit", "arguments": {"amount": 10}})
    last = _step(api, env_id, {"name": "no_such_tool", "arguments": {}})  # rejected steps count too
    assert (last["status"], last["truncated"], last["terminated"]) == ("rejected", True, False)
    assert last["reward"] == round(1 / 3, 4)
    unscored = _ok(api.post(f"/v1/envs/{env_id}/reset", json={"episode": {"max_steps": 1, "score_truncated": False}}))
    assert unscored["episode_config"]["score_truncated"] is False
    only = _step(api, env_id, {"name": "deposit", "arguments": {"amount": 10}})
    assert only["truncated"] and only["reward"] == 0.0 and only["checks"] is None
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_on_tool_error_terminate_is_envscalers_rule(api: httpx.Client, scenario_id: str) -> None:
    env_id = _ok(api.post("/v1/envs", json={"scenario_id": scenario_id,
                                            "episode": {"on_tool_error": "terminate"}}), 201)["id"]
    _step(api, env_id, {"name": "deposit", "arguments": {"amount": 10}})
    failed = _step(api, env_id, {"name": "fail", "arguments": {}})
    assert (failed["status"], failed["terminated"], failed["reward"]) == ("error", True, 0.0)
    assert failed["traceback"] and "broken tool" in failed["observation"]
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_conversational_episode_with_a_scripted_user(api: httpx.Client, scenario_id: str) -> None:
    rules = [
        Rule(turn=0, contains=["Deposit 10"], content="# Thought:\nstart small\n# Reply:\nHi, please deposit 10 for me."),
        Rule(turn=1, last_contains=["[Agent] Deposited"], content="# Thought:\nnext\n# Reply:\nThanks! Tag me as vip."),
        Rule(turn=2, last_contains=["[Agent] Tagged"], content="###STOP###"),
    ]
    with ScriptedLLM(rules) as llm:
        env = _ok(api.post("/v1/envs", json={"scenario_id": scenario_id, "episode": {
            "mode": "conversational", "user": {"model": "user-sim", "base_url": llm.base_url,
                                               "api_key": "sk-user-secret"}}}), 201)
        env_id = env["id"]
        assert env["observation"] == "Hi, please deposit 10 for me." and env["task"].startswith("Deposit 10")
        assert "api_key" not in json.dumps(env["episode_config"]) and "sk-user-secret" not in json.dumps(env)
        _step(api, env_id, {"name": "deposit", "arguments": {"amount": 10}})
        reply = _step(api, env_id, {"name": "chat_with_user", "arguments": {"content": "Deposited 10."}})
        assert (reply["observation"], reply["observation_role"], reply["terminated"]) == (
            "Thanks! Tag me as vip.", "user", False)
        _step(api, env_id, {"name": "tag", "arguments": {"label": "vip"}})
        end = _step(api, env_id, {"name": "chat_with_user", "arguments": {"content": "Tagged you as vip."}})
        assert end["observation"] == "###STOP###" and end["terminated"] and end["reward"] == 0.6667
        requests = llm.chat_requests()
    assert len(requests) == 3 and requests[0]["model"] == "user-sim"
    assert "Deposit 10" in requests[0]["messages"][0]["content"]  # the task goes to the simulated user only
    assert requests[2]["messages"][-1] == {"role": "user", "content": "[Agent] Tagged you as vip."}
    episodes = _ok(api.get(f"/v1/envs/{env_id}/episodes"))["data"]
    assert episodes[0]["status"] == "terminated"
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_conversational_episode_under_the_envscaler_profile(api: httpx.Client, scenario_id: str) -> None:
    """EnvScaler's conversational RL env: ``chat_with_user`` content of any JSON type goes
    to the user as ``[Agent] <str(content)>``; a private attribute is an action
    (``hasattr``); ``###STOP###`` ends the episode with the reward; a raising tool ends it
    at 0.0 with EnvScaler's traceback observation."""
    rules = [
        Rule(turn=0, contains=["Deposit 10"], content="# Thought:\nstart\n# Reply:\nPlease deposit 10."),
        Rule(turn=1, last_contains=["[Agent] ['deposited', 10]"], content="# Thought:\nok\n# Reply:\nTag me vip."),
        Rule(turn=2, last_contains=["[Agent] done"], content="###STOP###"),
    ]
    with ScriptedLLM(rules) as llm:
        episode = {"profile": "envscaler", "mode": "conversational",
                   "user": {"model": "user-sim", "base_url": llm.base_url}}
        env = _ok(api.post("/v1/envs", json={"scenario_id": scenario_id, "episode": episode}), 201)
        env_id = env["id"]
        assert env["episode_config"]["profile"] == "envscaler" and env["episode_config"]["on_tool_error"] == "terminate"
        assert env["introduction"].startswith("# Environment Information\n\n## Brief Introduction:  \n")
        assert "chat_with_user" not in [t["function"]["name"] for t in env["tools"]]  # EnvScaler's tools as they are
        _step(api, env_id, {"name": "deposit", "arguments": {"amount": 10}})
        private = _step(api, env_id, {"name": "_audit", "arguments": {}})  # a list attribute: "called", TypeError
        assert private["terminated"] and private["reward"] == 0.0 and private["observation_role"] == "user"
        assert private["observation"].startswith("Error: <Exception>\nTraceback (most recent call last):\n")
        assert private["observation"].endswith("TypeError: 'list' object is not callable\n")
        env_id = _ok(api.post(f"/v1/envs/{env_id}/reset"))["id"]  # same options: a new episode
        _step(api, env_id, {"name": "deposit", "arguments": {"amount": 10}})
        reply = _step(api, env_id, {"name": "chat_with_user", "arguments": {"content": ["deposited", 10]}})
        assert (reply["observation"], reply["observation_role"], reply["terminated"]) == ("Tag me vip.", "user", False)
        _step(api, env_id, {"name": "tag", "arguments": {"label": "vip"}})
        end = _step(api, env_id, {"text": "done"})  # plain text: chat_with_user
        assert end["observation"] == "###STOP###" and end["terminated"] and end["reward"] == 0.6667, end
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_conversational_options_are_checked(api: httpx.Client, scenario_id: str) -> None:
    no_user = api.post("/v1/envs", json={"scenario_id": scenario_id, "episode": {"mode": "conversational"}})
    assert no_user.status_code == 422 and no_user.json()["error"]["field"] == "episode"
    unreachable = api.post("/v1/envs", json={"scenario_id": scenario_id, "episode": {
        "mode": "conversational", "user": {"model": "m", "base_url": "http://127.0.0.1:9/v1"}}})
    assert unreachable.status_code == 503, unreachable.text  # nothing created: the user's model is down
    bad_url = api.post("/v1/envs", json={"scenario_id": scenario_id, "episode": {
        "mode": "conversational", "user": {"model": "m", "base_url": "file:///etc/passwd"}}})
    assert bad_url.status_code == 422 and bad_url.json()["error"]["field"] == "episode.user.base_url"


TAU_CALCULATE = '''
from typing import Any, Dict


class RetailTools:
    """tau-bench retail style: all data under one attribute, tools read and write it."""

    def __init__(self, init_config: Dict[str, Any]):
        self.data = init_config.get("data", {"orders": {}})

    def calculate(self, expression: str) -> str:
        """Calculate the result of a mathematical expression.

        Args:
            expression (str): the expression, e.g. '2 + 2'.
        """
        if not all(char in "0123456789+-*/(). " for char in expression):
            return "Error: invalid characters in expression"
        try:
            return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))
        except Exception as e:
            return f"Error: {e}"
'''


def test_tau_bench_style_restricted_eval_registers_with_a_warning(api: httpx.Client) -> None:
    environment = _ok(api.post("/v1/environments", json={"source_code": TAU_CALCULATE, "class_name": "RetailTools"}),
                      201)
    report = environment["policy_report"]
    assert environment["policy"] == "standard" and report["passed"] is True
    rules = {(f["rule"], f["severity"]) for f in report["findings"]}
    assert ("dynamic-eval", "warning") in rules and ("eval-globals", "info") in rules
    env_id = _ok(api.post("/v1/envs", json={"environment_id": environment["id"]}), 201)["id"]
    assert _step(api, env_id, {"name": "calculate", "arguments": {"expression": "(2 + 3) * 4"}})["observation"] == "20.0"
    assert _step(api, env_id, {"name": "calculate", "arguments": {"expression": "__import__('os')"}})[
        "observation"] == "Error: invalid characters in expression"
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_inline_checks_go_through_the_static_policy(api: httpx.Client, ledger_id: str) -> None:
    env_id = _ok(api.post("/v1/envs", json={"environment_id": ledger_id}), 201)["id"]
    refused = api.post(f"/v1/envs/{env_id}/evaluate", json={"checks": [{"check_item": "escape", "check_func":
        "def check_func(final_state):\n    return ().__class__.__bases__[0].__subclasses__() != []\n"}]})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "checks.0.check_func", refused.text
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_timestamps_carry_their_zone(api: httpx.Client, ledger_id: str) -> None:
    env = _ok(api.post("/v1/envs", json={"environment_id": ledger_id}), 201)
    _step(api, env["id"], {"name": "deposit", "arguments": {"amount": 1}})
    stamps = [env["created_at"], env["expires_at"], _ok(api.get(f"/v1/environments/{ledger_id}"))["created_at"],
              *[s["created_at"] for s in _ok(api.get(f"/v1/envs/{env['id']}/trajectory"))["steps"]],
              _ok(api.get(f"/v1/envs/{env['id']}/episodes"))["data"][0]["started_at"],
              _ok(api.get(f"/v1/envs/{env['id']}"))["created_at"]]
    for stamp in stamps:
        assert datetime.fromisoformat(stamp).tzinfo is not None, stamp
    assert api.delete(f"/v1/envs/{env['id']}").status_code == 204
