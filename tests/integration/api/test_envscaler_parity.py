"""Replaying an episode through Sandpit gives what EnvScaler's in-process code gives, step by
step: observations, state diffs (EnvScaler's ``get_state_diff``), termination and reward.

The reference is ``tests/support/envscaler_reference.py`` (EnvScaler's RL-environment
semantics restated as our own code). It runs inside a sandbox through ``POST
/v1/execute`` (generated code never runs in the test process), renders its diffs with the
sandbox's own ``child_render.py``, and prints them as JSON; the same actions then go through
``POST /v1/envs/{id}/step`` of an env made from a scenario, and every step is compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from sandpit.sandbox_images import DEFINITION_DIR

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REFERENCE = Path(__file__).resolve().parents[2] / "support" / "envscaler_reference.py"

HOTEL = '''
import dataclasses
from datetime import date, timedelta
from typing import Dict, List


@dataclasses.dataclass
class Guest:
    name: str
    vip: bool = False


class HotelDesk:
    """Rooms, bookings keyed by id, guests as dataclasses, a set of blocked dates."""

    def __init__(self, init_config: dict):
        self.rooms: Dict[str, dict] = init_config.get("rooms", {})
        self.bookings: Dict[str, dict] = {}
        self.guests: Dict[str, Guest] = {}
        self.blocked = set()
        self.today = date(2024, 5, 1)
        self.counter = 0

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
        self.bookings[booking_id] = {"guest": guest_id, "room": room, "until": str(self.today + timedelta(nights))}
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
'''

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
        "final_state['counter'] == initial_state['counter'] + 2\n"},
    {"check_item": "a check that errors", "check_func": "def check_func(final_state):\n    return final_state['nope']\n"},
]


def call(tool: str, /, **arguments: object) -> dict:
    return {"type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}


EPISODES = {
    "completes": [
        call("register_guest", guest_id="g1", name="Ann"),
        call("book", booking_id="b1", guest_id="g1", room="102", nights=2),
        call("book", booking_id="b2", guest_id="g1", room="101", nights=1),
        call("cancel", booking_id="b2"),
        call("register_guest", guest_id="g1", name="Ann"),  # a refusal the tool returns, no state change
        call("nonexistent_tool"),
        {"type": "function", "function": {"name": "promote", "arguments": "{broken json"}},
        call("promote", guest_id="g1"),
        call("block", day="2024-05-03"),
        call("set_rate", room="102", rate=80.0),  # 80 -> 80.0: equal in Python, so no change either side
        call("set_rate", room="102", rate=True),  # True == 1? no: 80 -> True is a change
        call("chat_with_user", content="Task Completed"),
    ],
    "tool_raises": [
        call("register_guest", guest_id="g1", name="Ann"),
        call("cancel", booking_id="missing"),  # KeyError: EnvScaler ends the episode, reward 0.0
    ],
}


def _reference(api: httpx.Client, actions: list[dict]) -> list[dict]:
    render_source = (DEFINITION_DIR / "runner" / "child_render.py").read_text()
    limits_source = (DEFINITION_DIR / "runner" / "limits.py").read_text()  # child_render's caps
    script = "\n".join([
        "import json, sys, types",
        f"sys.modules['limits'] = types.ModuleType('limits'); exec({limits_source!r}, sys.modules['limits'].__dict__)",
        f"render_module = types.ModuleType('render'); exec({render_source!r}, render_module.__dict__)",
        f"reference = types.ModuleType('envscaler_reference'); exec({REFERENCE.read_text()!r}, reference.__dict__)",
        f"records = reference.run({HOTEL!r}, 'HotelDesk', {INIT!r}, {CHECKS!r}, json.loads({json.dumps(actions)!r}),",
        "                        render_module.render)",
        "print(json.dumps(records))",
    ])
    result = api.post("/v1/execute", json={"code": script}, timeout=60)
    assert result.status_code == 200, result.text
    body = result.json()
    assert body["status"] == "ok", body["stderr"]
    return json.loads(body["stdout"])


@pytest.fixture(scope="module")
def scenario_id(server) -> str:
    with server.client() as client:
        environment = client.post("/v1/environments", json={"source_code": HOTEL, "class_name": "HotelDesk"})
        assert environment.status_code == 201, environment.text
        scenario = client.post("/v1/scenarios", json={
            "environment_id": environment.json()["id"], "task": "Book Ann into 102 and make her VIP.",
            "init_config": INIT, "checklist_with_func": CHECKS})
        assert scenario.status_code == 201, scenario.text
        return scenario.json()["id"]


@pytest.mark.parametrize("episode", sorted(EPISODES))
def test_replay_matches_envscaler_in_process(api: httpx.Client, scenario_id: str, episode: str) -> None:
    actions = EPISODES[episode]
    expected = _reference(api, actions)
    env = api.post("/v1/envs", json={"scenario_id": scenario_id,
                                     "episode": {"on_tool_error": "terminate", "max_steps": 100}})
    assert env.status_code == 201, env.text
    env_id = env.json()["id"]
    got = []
    for action in actions[:len(expected)]:
        response = api.post(f"/v1/envs/{env_id}/step", json=action, params={"include": "state_diff"})
        assert response.status_code == 200, response.text
        got.append(response.json())
    assert len(got) == len(expected)
    for number, (ours, theirs) in enumerate(zip(got, expected, strict=True), start=1):
        where = f"{episode} step {number}: {actions[number - 1]}"
        if theirs["observation"].startswith("Error: <Exception>"):  # EnvScaler prints the traceback
            assert ours["status"] == "error" and ours["observation"].startswith("Error: KeyError"), where
            assert "KeyError: 'missing'" in theirs["observation"], where
        else:
            assert ours["observation"] == theirs["observation"], where
        assert ours["observation_role"] == theirs["role"], where
        assert ours["terminated"] == theirs["terminated"], where
        assert ours["reward"] == theirs["reward"], where
        assert ours["state_diff"] == theirs["state_diff"], where
    assert got[-1]["terminated"]
    if episode == "completes":
        assert got[-1]["reward"] == 0.8  # 4 of 5: the erroring check counts as not passed
        assert any(d["state_diff"] for d in got) and got[4]["state_diff"] == {} and got[9]["state_diff"] == {}
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204
