"""Env construction over real HTTP with default executor settings: repeated creates of one
environment and config take the config-template fast path (``construction.path ==
"template"``) for every deterministic shape, and what they start from and do equals what
an exactly constructed env starts from and does (state, a step's observation and delta,
an evaluation's reward); the shapes whose construction is not repeatable are refused with
their reason (in the response and in ``/metrics``) and constructed every time; no env
ever sees another env's changes to the config they share, however deep and however late
the change is made."""

from __future__ import annotations

import json
import time

import httpx
import pytest

pytestmark = pytest.mark.docker

SAMPLE = {"data": {"users": {}, "orders": {}}}
"""What registration constructs the classes with."""

KEEPS_CONFIG = '''
import copy
import json
from typing import Any, Dict


class KeepsConfig:
    def __init__(self, init_config: Dict[str, Any]):
        self.data = init_config["data"]
        self._config = init_config
        self.log = []

    def add_note(self, order_id: str, note: str) -> str:
        """Append a note deep inside an order."""
        self.data["orders"][order_id]["payments"][-1].setdefault("notes", []).append(note)
        self.log.append(note)
        return json.dumps(self.data["orders"][order_id]["payments"][-1], sort_keys=True)

    def rewrite_kept(self, user_id: str, city: str) -> str:
        """Change the config dict the constructor kept a reference to, long after construction."""
        self._config["data"]["users"][user_id]["address"]["city"] = city
        self._config["data"]["users"]["ghost"] = {"address": {"city": city}}
        return copy.deepcopy(self.data["users"][user_id])["address"]["city"]

    def city(self, user_id: str) -> str:
        """A user's city."""
        return self.data["users"][user_id]["address"]["city"]
'''

NORMALISES = '''
import copy


class Normalises:
    def __init__(self, init_config):
        tables = copy.deepcopy(init_config.get("data", {}))
        self.orders = {oid: dict(order, total=round(sum(p["amount"] for p in order["payments"]), 2))
                       for oid, order in sorted(tables.get("orders", {}).items())}
        self.cities = sorted({u["address"]["city"] for u in tables.get("users", {}).values()})

    def cancel(self, order_id: str) -> str:
        """Cancel an order."""
        self.orders[order_id]["status"] = "cancelled"
        return str(self.orders[order_id]["total"])
'''

MODULE_TABLE = '''
RATES = {"CA": 0.07, "NY": 0.04}


class ModuleTable:
    def __init__(self, init_config):
        self.data = init_config["data"]
        self.rate = RATES["CA"]

    def tax(self, order_id: str) -> str:
        """Tax of an order."""
        total = sum(p["amount"] for p in self.data["orders"][order_id]["payments"])
        self.data["orders"][order_id]["tax"] = round(total * self.rate, 2)
        return str(self.data["orders"][order_id]["tax"])
'''

READS_CLOCK = '''
from datetime import datetime


class ReadsClock:
    def __init__(self, init_config):
        self.data = init_config["data"]
        self.opened_at = datetime.now().isoformat()

    def touch(self, order_id: str) -> str:
        """Mark an order."""
        self.data["orders"][order_id]["seen"] = True
        return "ok"
'''

COUNTS_INSTANCES = '''
_CREATED = {"count": 0}


class CountsInstances:
    def __init__(self, init_config):
        _CREATED["count"] += 1
        self.data = init_config["data"]
        self.serial = _CREATED["count"]

    def touch(self, order_id: str) -> str:
        """Mark an order."""
        self.data["orders"][order_id]["seen"] = True
        return "ok"
'''

DETERMINISTIC = {
    "KeepsConfig": (KEEPS_CONFIG, ("add_note", {"order_id": "o0003", "note": "called"})),
    "Normalises": (NORMALISES, ("cancel", {"order_id": "o0003"})),
    "ModuleTable": (MODULE_TABLE, ("tax", {"order_id": "o0003"})),
}
CHECKS = [{"check_item": "orders kept",
           "check_func": "def check_func(final_state):\n    return 'o0003' in str(final_state)\n"},
          {"check_item": "changed", "check_func": "def check_func(final_state):\n"
                                                  "    return final_state != initial_state\n"}]


def _config(orders: int = 400) -> dict:
    """Nested tables, ~100 KB: users with addresses, orders with payment histories."""
    return {"data": {
        "users": {f"u{i:04d}": {"name": f"user {i}", "address": {"city": f"city {i % 7}", "zip": f"{i:05d}"}}
                  for i in range(orders // 4)},
        "orders": {f"o{i:04d}": {"user": f"u{i % (orders // 4):04d}", "status": "pending",
                                 "payments": [{"amount": round(i * 1.5, 2), "kind": "card"},
                                              {"amount": 1.25, "kind": "gift"}]}
                   for i in range(orders)}}}


def _register(api: httpx.Client, source: str, class_name: str) -> str:
    response = api.post("/v1/environments", json={"source_code": source, "class_name": class_name,
                                                  "sample_init_config": SAMPLE})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _create(api: httpx.Client, environment_id: str, config: dict) -> dict:
    response = api.post("/v1/envs", content=json.dumps({"environment_id": environment_id, "init_config": config}),
                        headers={"Content-Type": "application/json"})
    assert response.status_code == 201, response.text
    return response.json()


def _until(api: httpx.Client, environment_id: str, config: dict, path: str, keep: list[dict],
           tries: int = 20) -> dict:
    """Create envs of ``config`` until one's ``construction.path`` is ``path`` (the config
    template is built at the second create, off the request path); every env is kept in
    ``keep`` (the sandbox stays in use: an emptied one is recycled with its templates)."""
    for _ in range(tries):
        env = _create(api, environment_id, config)
        keep.append(env)
        if env["construction"]["path"] == path:
            return env
        time.sleep(0.3)
    raise AssertionError(f"no create took the {path} path: {[e['construction'] for e in keep]}")


def _state(api: httpx.Client, env_id: str) -> dict:
    response = api.get(f"/v1/envs/{env_id}/state")
    assert response.status_code == 200, response.text
    return response.json()["state"]


def _step(api: httpx.Client, env_id: str, name: str, arguments: dict) -> dict:
    response = api.post(f"/v1/envs/{env_id}/step", json={"name": name, "arguments": arguments},
                        params={"include": "state_diff"})
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["status"] == "ok", reply
    return reply


def _evaluate(api: httpx.Client, env_id: str) -> dict:
    response = api.post(f"/v1/envs/{env_id}/evaluate", json={"checks": CHECKS})
    assert response.status_code == 200, response.text
    return response.json()


def _drop(api: httpx.Client, envs: list[dict]) -> None:
    for env in envs:
        api.delete(f"/v1/envs/{env['id']}")


@pytest.mark.parametrize("class_name", sorted(DETERMINISTIC))
def test_a_template_forked_env_equals_an_exactly_constructed_one(api: httpx.Client, class_name: str) -> None:
    source, (tool, arguments) = DETERMINISTIC[class_name]
    environment_id = _register(api, source, class_name)
    config = _config()
    kept: list[dict] = []
    try:
        exact = _create(api, environment_id, config)  # the config's first create: constructed
        kept.append(exact)
        assert exact["construction"] == {"path": "constructed", "reason": "first_open", "detail": None}
        forked = _until(api, environment_id, config, "template", kept)
        assert forked["construction"] == {"path": "template", "reason": None, "detail": None}
        assert _state(api, forked["id"]) == _state(api, exact["id"])
        mine, theirs = _step(api, forked["id"], tool, arguments), _step(api, exact["id"], tool, arguments)
        assert (mine["observation"], mine["state_diff"]) == (theirs["observation"], theirs["state_diff"])
        assert _state(api, forked["id"]) == _state(api, exact["id"])
        mine, theirs = _evaluate(api, forked["id"]), _evaluate(api, exact["id"])
        assert mine["reward"] == theirs["reward"] and mine["passed"] == theirs["passed"] == 2
    finally:
        _drop(api, kept)


def test_changes_to_a_kept_config_never_reach_another_env(api: httpx.Client) -> None:
    """Hostile: tools that change the config's nested tables in place, deeply, and through
    the reference the constructor kept, after construction; envs of the same config (forked
    before and after the change) start from the config as given."""
    environment_id = _register(api, KEEPS_CONFIG, "KeepsConfig")
    config = _config()
    kept: list[dict] = []
    try:
        first = _until(api, environment_id, config, "template", kept)
        pristine = _state(api, first["id"])
        sibling = _create(api, environment_id, config)
        kept.append(sibling)
        for _ in range(3):
            _step(api, first["id"], "add_note", {"order_id": "o0003", "note": "x" * 1000})
        assert _step(api, first["id"], "rewrite_kept", {"user_id": "u0001", "city": "Mutated"})["observation"] \
            == "Mutated"
        changed = _state(api, first["id"])
        assert changed["data"]["users"]["ghost"] == {"address": {"city": "Mutated"}}
        assert len(changed["data"]["orders"]["o0003"]["payments"][-1]["notes"]) == 3
        later = _create(api, environment_id, config)
        kept.append(later)
        assert later["construction"]["path"] == "template"
        for env in (sibling, later):
            assert _state(api, env["id"]) == pristine
            assert _step(api, env["id"], "city", {"user_id": "u0001"})["observation"] == "city 1"
        assert later["init_config"] == config == sibling["init_config"]
    finally:
        _drop(api, kept)


@pytest.mark.parametrize(("source", "class_name", "reason", "detail"), [
    (READS_CLOCK, "ReadsClock", "nondeterministic", "unsuitable: two constructions differ"),
    (COUNTS_INSTANCES, "CountsInstances", "module_state", "unsuitable: construction changed module-level state"),
])
def test_a_refused_template_falls_back_to_exact_construction_with_its_reason(
        api: httpx.Client, source: str, class_name: str, reason: str, detail: str) -> None:
    environment_id = _register(api, source, class_name)
    config = _config(orders=120)
    kept: list[dict] = []
    try:
        for _ in range(20):  # the template is tried at the second create, refused soon after
            env = _create(api, environment_id, config)
            kept.append(env)
            assert env["construction"]["path"] == "constructed"
            if env["construction"]["reason"] == reason:
                break
            assert env["construction"]["reason"] in ("first_open", "building"), env["construction"]
            time.sleep(0.3)
        assert kept[-1]["construction"] == {"path": "constructed", "reason": reason, "detail": detail}
        again = _create(api, environment_id, config)  # and stays refused
        kept.append(again)
        assert again["construction"]["reason"] == reason
        states = [_state(api, env["id"]) for env in kept]
        if class_name == "CountsInstances":  # each constructed in a process of its own
            assert {state["serial"] for state in states} == {1}
        else:
            assert len({state["opened_at"] for state in states}) == len(states)
        assert all(state["data"] == config["data"] for state in states)
        assert _step(api, again["id"], "touch", {"order_id": "o0003"})["observation"] == "ok"
        metrics = api.get("/metrics").text
        assert f'sandpit_env_construction_total{{path="constructed",reason="{reason}"}}' in metrics
        assert detail not in metrics  # free text never becomes a label
    finally:
        _drop(api, kept)


def test_a_reset_of_the_same_config_takes_the_template_and_starts_pristine(api: httpx.Client) -> None:
    """A trainer's episode loop on one env (no other env of the environment open): the
    previous episode's session keeps the sandbox (and its templates) until the next one is
    placed, so resets fork from the config's template; each starts from the config as given
    whatever the previous episode changed in place."""
    environment_id = _register(api, KEEPS_CONFIG, "KeepsConfig")
    config = _config()
    env = _create(api, environment_id, config)
    try:
        pristine = _state(api, env["id"])
        paths = []
        for i in range(12):
            _step(api, env["id"], "add_note", {"order_id": "o0003", "note": f"episode {i}"})
            _step(api, env["id"], "rewrite_kept", {"user_id": "u0001", "city": f"c{i}"})
            response = api.post(f"/v1/envs/{env['id']}/reset", json={})
            assert response.status_code == 200, response.text
            assert response.json()["episode"] == i + 2
            paths.append(response.json()["construction"])
            assert _state(api, env["id"]) == pristine
            if [c["path"] for c in paths[-2:]] == ["template", "template"]:
                break
            time.sleep(0.3)
        assert [c["path"] for c in paths[-2:]] == ["template", "template"], paths
    finally:
        api.delete(f"/v1/envs/{env['id']}")
