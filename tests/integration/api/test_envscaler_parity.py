"""The ``envscaler`` episode profile is EnvScaler's RL environment, step by step.

The reference is ``sandbox_images/envscaler/reference.py`` (EnvScaler's RL-environment
semantics restated as our own code: parsing, ``hasattr`` validity, termination, the
traceback observation, the reward, ``reset(seed=)``). It runs inside a sandbox through
``POST /v1/execute`` (generated code never runs in the test process) and renders its
diffs with the sandbox's own ``child_render.py``. The same step requests then go through
``POST /v1/envs/{id}/step`` of an env made from a scenario whose ``episode_profile`` is
``envscaler``, and everything is compared: the introduction, the tools the agent is shown,
the first observation and initial state, and for every step the observation text, its
kind, termination, reward and state diff. The ``sandpit`` profile, on the same actions,
differs where the profile table of ``docs/envscaler.md`` says it does.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sandpit.client import Client
from sandpit.importers.envscaler_parity import reference_files, reference_run
from sandpit.sandbox_images import DEFINITION_DIR

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one


HOTEL = '''
import dataclasses
import json
import random
from datetime import date, timedelta
from typing import Dict


@dataclasses.dataclass
class Guest:
    name: str
    vip: bool = False


def _nights(value):
    if value < 1:
        raise ValueError(f"a stay is at least one night, not {value}")
    return value


class HotelDesk:
    """Rooms, bookings keyed by id, guests as dataclasses, a set of blocked dates."""

    def __init__(self, init_config: dict):
        self.rooms: Dict[str, dict] = init_config.get("rooms", {})
        self.bookings: Dict[str, dict] = {}
        self.guests: Dict[str, Guest] = {}
        self.blocked = set()
        self.today = date(2024, 5, 1)
        self.counter = 0
        self.desk_code = random.randint(1, 10 ** 9)

    def register_guest(self, guest_id: str, name: str, vip: bool = False) -> dict:
        """Register a guest."""
        if guest_id in self.guests:
            return {"success": False, "error": "guest exists"}
        self.guests[guest_id] = Guest(name, vip)
        return {"success": True}

    def book(self, booking_id: str, guest_id: str, room: str, nights: int) -> dict:
        """Book a room."""
        if room not in self.rooms or self.rooms[room]["free"] < 1:
            return {"success": False, "error": "no such free room"}
        self.rooms[room]["free"] -= 1
        self.bookings[booking_id] = {"guest": guest_id, "room": room,
                                     "until": str(self.today + timedelta(_nights(nights)))}
        self.counter += 1
        return {"success": True, "booking": self.bookings[booking_id]}

    def cancel(self, booking_id: str) -> dict:
        """Cancel a booking."""
        booking = self.bookings.pop(booking_id)
        self.rooms[booking["room"]]["free"] += 1
        return {"success": True}

    def block(self, day: str) -> int:
        """Block a date."""
        self.blocked.add(date.fromisoformat(day))
        return len(self.blocked)

    def promote(self, guest_id: str) -> str:
        """Make a guest VIP."""
        self.guests[guest_id].vip = True
        return f"{self.guests[guest_id].name} is VIP"

    def set_rate(self, room: str, rate) -> str:
        """Set a room's rate (any number)."""
        self.rooms[room]["rate"] = rate
        return "ok"

    def import_rates(self, text: str) -> int:
        """Set rates from JSON text."""
        rates = json.loads(text)
        for room, rate in rates.items():
            self.rooms[room]["rate"] = rate
        return len(rates)

    def _reindex(self) -> str:
        self.counter += 100
        return "reindexed"
'''


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


STR = {"type": "string"}
RECORD = {
    "env_id": "hotel_desk_001", "env_class_name": "HotelDesk", "env_class_code": HOTEL,
    "environment_introduction": "A small hotel's front desk: rooms, guests and bookings.",
    "constraints_rules": ["A booking needs a free room.", "Only registered guests are promoted."],
    "tools": [
        _tool("register_guest", "Register a guest.\n\nReturns:\n    dict: success flag.",
              {"guest_id": STR, "name": STR, "vip": {"type": ["boolean", "null"]}}, ["guest_id", "name", "vip"]),
        _tool("book", "Book a room.\n\nConstraints:\n    - The room must be free.",
              {"booking_id": STR, "guest_id": STR, "room": STR, "nights": {"type": "integer"}},
              ["booking_id", "guest_id", "room", "nights"]),
        _tool("cancel", "Cancel a booking.", {"booking_id": STR}, ["booking_id"]),
        _tool("block", "Block a date.", {"day": STR}, ["day"]),
        _tool("promote", "Make a guest VIP.", {"guest_id": STR}, ["guest_id"]),
        _tool("set_rate", "Set a room's rate.", {"room": STR, "rate": {"type": "number"}}, ["room", "rate"]),
        _tool("import_rates", "Set rates from JSON text.", {"text": STR}, ["text"]),
    ],
}
INIT = {"rooms": {"101": {"free": 1, "rate": 100}, "102": {"free": 2, "rate": 80}}}
CHECKS = [
    {"check_item": "b1 booked in 102", "check_func":
        "def check_func(final_state):\n    return final_state['bookings'].get('b1', {}).get('room') == '102'\n"},
    {"check_item": "ann is VIP", "check_func":
        "def check_func(final_state):\n    return final_state['guests']['g1'].vip is True\n"},
    {"check_item": "a date is blocked", "check_func":
        "from datetime import date\ndef check_func(final_state):\n    return date(2024, 5, 3) in final_state['blocked']\n"},
    {"check_item": "room 101 still free", "check_func":
        "def check_func(final_state):\n    return final_state['rooms']['101']['free'] == 1 and "
        "final_state['counter'] >= initial_state['counter'] + 2\n"},
    {"check_item": "a check that errors", "check_func": "def check_func(final_state):\n    return final_state['nope']\n"},
    {"check_item": "a check that returns no bool", "check_func": "def check_func(final_state):\n    return 1\n"},
]
SCENARIO = {"task_id": "t1", "env_id": "hotel_desk_001", "task": "Book Ann into 102 and make her VIP.",
            "init_config": INIT, "checklist_with_func": CHECKS}
SEED = 20260527


def call(tool: str, /, **arguments: object) -> dict:
    """An OpenAI tool call with JSON-text arguments."""
    return {"type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}


def text(body: str) -> dict:
    return {"text": body}


EPISODES = {
    "completes": [
        call("register_guest", guest_id="g1", name="Ann"),
        {"name": "book", "arguments": {"booking_id": "b1", "guest_id": "g1", "room": "102", "nights": 2}},
        text('<think>book 101 too</think><tool_call>{"name": "book", "arguments": '
             '"{\\"booking_id\\": \\"b2\\", \\"guest_id\\": \\"g1\\", \\"room\\": \\"101\\", \\"nights\\": 1}"}'
             '</tool_call>'),  # arguments as JSON text: decoded and run
        call("cancel", booking_id="b2"),
        call("register_guest", guest_id="g1", name="Ann"),  # a refusal the tool returns, no state change
        call("nonexistent_tool"),  # hasattr: no
        {"name": "_reindex", "arguments": {}},  # hasattr: yes, a private method is an action too
        {"name": "book", "arguments": "[1, 2]"},  # arguments that decode to no object: invalid
        {"type": "function", "function": {"name": "promote", "arguments": "{broken json"}},  # to action
        call("chat_with_user"),  # no content: invalid
        call("promote", guest_id="g1"),
        call("block", day="2024-05-03"),
        call("set_rate", room="102", rate=80.0),  # 80 -> 80.0: equal in Python, so no change either side
        call("set_rate", room="102", rate=True),  # 80 -> True is a change
        text("All done. Task Completed"),  # plain text: chat_with_user, the end
    ],
    "parse_failures": [
        text("<think>unclosed reasoning, then an answer"),
        text('<tool_call>{"name": "promote", "arguments": {"guest_id": "g1"}}'),  # unclosed
        text('<tool_call>{"name": "promote", "arguments": {oops}}</tool_call>'),  # JSON that does not parse
        text('<tool_call>{"name": "promote"}</tool_call>'),  # no arguments
        text('<tool_call>{"name": "promote", "arguments": "{oops"}</tool_call>'),  # to action
        text("   "),  # nothing at all: to action
        text("<think>only thinking</think>"),  # neither content nor call: to action
        text('<tool_call>[1]</tool_call>'),  # no JSON object inside: the text is a reply
    ],
    "chat_content_not_text": [
        call("register_guest", guest_id="g1", name="Ann"),
        {"name": "chat_with_user", "arguments": {"content": ["done", 1]}},
    ],
    "tool_raises": [
        call("register_guest", guest_id="g1", name="Ann"),
        call("cancel", booking_id="missing"),  # KeyError: the episode ends, reward 0.0
    ],
    "nested_raise": [call("book", booking_id="b1", guest_id="g1", room="102", nights=0)],
    "stdlib_raises": [call("import_rates", text="{not json")],
    "not_callable": [{"name": "rooms", "arguments": {}}],  # a state attribute: TypeError
    "wrong_arguments": [call("book", booking_id="b1", colour="red")],  # TypeError raised by the call itself
}


def _reference(server: Any, requests: list[dict], seed: int | None) -> dict[str, Any]:
    """The reference's run of ``requests`` in a sandbox (``sandpit rl envscaler``'s channel)."""
    job = {"source": HOTEL, "class_name": "HotelDesk", "seed": seed, "record": RECORD, "scenario": SCENARIO,
           "requests": requests}
    with Client(server.url, api_key=server.api_key, timeout=60) as client:
        return reference_run(client, reference_files(DEFINITION_DIR), job)


@pytest.fixture(scope="module")
def scenario_ids(server) -> dict[str, str]:
    """The hotel registered with its declared tools; one scenario per profile."""
    with server.client() as client:
        environment = client.post("/v1/environments", json={
            "source_code": HOTEL, "class_name": "HotelDesk", "tools": RECORD["tools"],
            "introduction": RECORD["environment_introduction"], "rules": RECORD["constraints_rules"]})
        assert environment.status_code == 201, environment.text
        ids = {}
        for profile in ("envscaler", "sandpit"):
            scenario = client.post("/v1/scenarios", json={
                "environment_id": environment.json()["id"], "task": SCENARIO["task"], "init_config": INIT,
                "checklist_with_func": CHECKS, "episode_profile": profile})
            assert scenario.status_code == 201, scenario.text
            assert scenario.json()["episode_profile"] == profile
            ids[profile] = scenario.json()["id"]
        return ids


def _ours(api: httpx.Client, scenario_id: str, requests: list[dict], count: int,
          seed: int | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    body: dict[str, Any] = {"scenario_id": scenario_id}
    if seed is not None:
        body["seed"] = seed
    env = api.post("/v1/envs", json=body)
    assert env.status_code == 201, env.text
    created = env.json()
    created["state"] = api.get(f"/v1/envs/{created['id']}/state").json()["state"]
    steps = []
    for request in requests[:count]:
        response = api.post(f"/v1/envs/{created['id']}/step", json=request, params={"include": "state_diff"})
        assert response.status_code == 200, response.text
        steps.append(response.json())
    assert api.delete(f"/v1/envs/{created['id']}").status_code == 204
    return created, steps


@pytest.mark.parametrize("episode", sorted(EPISODES))
def test_the_envscaler_profile_is_envscalers_rl_environment(api: httpx.Client, server: Any,
                                                             scenario_ids: dict[str, str], episode: str) -> None:
    requests = EPISODES[episode]
    expected = _reference(server, requests, SEED)
    created, got = _ours(api, scenario_ids["envscaler"], requests, len(expected["steps"]), SEED)
    assert created["introduction"] == expected["introduction"]
    assert created["tools"] == expected["tools"]  # the record's own tools, nothing added
    assert created["observation"] == expected["observation"]["content"]
    assert created["episode_config"]["profile"] == "envscaler"
    assert created["state"] == expected["initial_state"]  # the seeded constructor drew the same desk_code
    assert len(got) == len(expected["steps"])
    for number, (ours, theirs) in enumerate(zip(got, expected["steps"], strict=True), start=1):
        where = f"{episode} step {number}: {requests[number - 1]}"
        assert ours["observation"] == theirs["observation"], where
        assert ours["observation_role"] == theirs["role"], where
        assert ours["terminated"] == theirs["terminated"], where
        assert ours["reward"] == theirs["reward"], where
        assert ours["state_diff"] == theirs["state_diff"], where
    assert got[-1]["terminated"], episode


def test_the_episodes_end_as_envscalers_do(api: httpx.Client, scenario_ids: dict[str, str]) -> None:
    """What the parity cases above must show (so a reference that drifted with Sandpit
    would be caught): EnvScaler's exact texts, and the reward formula over six checks."""
    completes = _ours(api, scenario_ids["envscaler"], EPISODES["completes"], 99, SEED)[1]
    assert [s["observation"] for s in completes if s["status"] == "rejected"] == [
        "Error: Invalid action", "Error: Invalid action", "Error: Failed to parse response to action",
        "Error: Invalid action"]
    assert completes[6]["observation"] == "reindexed" and completes[-1]["observation"] == "Task finished"
    assert completes[-1]["reward"] == round(4 / 6, 4)  # an erroring check and a non-bool count as 0
    failures = _ours(api, scenario_ids["envscaler"], EPISODES["parse_failures"], 99, None)[1]
    assert [s["observation"] for s in failures[:7]] == ["Error: Failed to parse response to struct response"] * 4 + [
        "Error: Failed to parse response to action"] * 3
    assert failures[-1]["observation"] == "Task finished" and failures[-1]["terminated"]
    raised = _ours(api, scenario_ids["envscaler"], EPISODES["nested_raise"], 99, None)[1][0]
    assert raised["observation"].startswith("Error: <Exception>\nTraceback (most recent call last):\n")
    assert '  File "<string>", line ' in raised["observation"] and "in _nights" in raised["observation"]
    assert raised["observation"].endswith("ValueError: a stay is at least one night, not 0\n")
    assert "/opt/sandpit" not in raised["observation"] and "runner" not in raised["observation"]
    assert raised["terminated"] and raised["reward"] == 0.0 and raised["observation_role"] == "user"
    wrong = _ours(api, scenario_ids["envscaler"], EPISODES["wrong_arguments"], 99, None)[1][0]
    assert wrong["observation"] == ("Error: <Exception>\nTraceback (most recent call last):\n"
                                    "TypeError: HotelDesk.book() got an unexpected keyword argument 'colour'\n")


def test_the_sandpit_profile_differs_where_documented(api: httpx.Client, scenario_ids: dict[str, str]) -> None:
    created, steps = _ours(api, scenario_ids["sandpit"], EPISODES["tool_raises"], 99, None)
    assert created["introduction"].startswith("# Environment\n") and created["episode_config"]["profile"] == "sandpit"
    assert [t["function"]["name"] for t in created["tools"]][-1] == "chat_with_user"  # Sandpit offers its end action
    assert steps[1]["observation"] == "Error: KeyError: 'missing'" and not steps[1]["terminated"]
    private = _ours(api, scenario_ids["sandpit"], [{"name": "_reindex", "arguments": {}}], 99, None)[1][0]
    assert private["status"] == "rejected" and private["observation"] == "Error: Invalid action"
    broken = _ours(api, scenario_ids["sandpit"], EPISODES["parse_failures"][:1], 99, None)[1][0]
    assert broken["observation"] == "Error: Failed to parse response to action"


def test_options_that_contradict_the_profile_are_refused(api: httpx.Client, scenario_ids: dict[str, str]) -> None:
    for episode, field in (({"on_tool_error": "continue"}, "episode.on_tool_error"),
                           ({"termination_action": "finish"}, "episode.termination_action")):
        response = api.post("/v1/envs", json={"scenario_id": scenario_ids["envscaler"], "episode": episode})
        assert response.status_code == 422 and field in response.text, response.text
    for bad in ({"profile": "EnvScaler"}, {"profile": 1}):
        response = api.post("/v1/envs", json={"scenario_id": scenario_ids["sandpit"], "episode": bad})
        assert response.status_code == 422 and "profile" in response.text, response.text
    for seed in (-1, 2 ** 64, 1.5, "7", True):
        response = api.post("/v1/envs", json={"scenario_id": scenario_ids["sandpit"], "seed": seed})
        assert response.status_code == 422 and "seed" in response.text, (seed, response.text)
    chosen = api.post("/v1/envs", json={"scenario_id": scenario_ids["sandpit"], "episode": {"profile": "envscaler"}})
    assert chosen.status_code == 201 and chosen.json()["episode_config"]["profile"] == "envscaler", chosen.text
    api.delete(f"/v1/envs/{chosen.json()['id']}")
