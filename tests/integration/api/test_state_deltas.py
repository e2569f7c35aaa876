"""Deep structural state deltas end to end: a real sandbox finds the changed paths, PID 1
and the executor apply them, the API commits trees of nodes to a real SQLite file, and
``GET /v1/envs/{id}/state`` (now, ``?step=k``, after restore, fork and eviction) must show
exactly the expected Python state after every step: types (``1``, ``1.0``, ``true``), key
order, aliasing, lists that grow, shrink and reorder, a dict that becomes a list and back,
non-JSON values deep inside, hostile values. The expected state is kept by the test
applying the same change to its own copy (the environment code itself only runs in
sandboxes)."""

from __future__ import annotations

import copy
import datetime
import sqlite3
import time
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SOURCE = '''
import datetime


class Deep:
    """All state under self.data, changed by a path and an action."""

    def __init__(self, init_config):
        self.data = init_config.get("data", {})
        self.count = 0

    def mutate(self, path: list, action: str, value=None) -> str:
        """Apply one change at ``path`` (keys and indexes from self.data)."""
        parent = self.data
        for step in path[:-1]:
            parent = parent[step]
        key = path[-1]
        if action == "set":
            parent[key] = value
        elif action == "delete":
            del parent[key]
        elif action == "append":
            parent[key].append(value)
        elif action == "pop":
            parent[key].pop(value)
        elif action == "reverse":
            parent[key].reverse()
        elif action == "reorder":
            parent[key] = dict(reversed(list(parent[key].items())))
        elif action == "to_list":
            parent[key] = list(parent[key].values())
        elif action == "to_dict":
            parent[key] = {str(i): v for i, v in enumerate(parent[key])}
        elif action == "date":
            parent[key] = datetime.date(2024, 5, 1)
        elif action == "set_of":
            parent[key] = set(value)
        elif action == "alias_attr":
            self.alias = parent[key]
        elif action == "alias_key":
            parent[value] = parent[key]
        elif action == "cycle":
            parent[key]["self"] = parent[key]
        elif action == "deep":
            node = "bottom"
            for _ in range(value):
                node = [node]
            parent[key] = node
        self.count += 1
        return "ok"
'''


def mutate(state: dict[str, Any], path: list[Any], action: str, value: Any = None) -> None:
    """The test's own copy of ``Deep.mutate`` on the expected state (trusted code)."""
    parent = state["data"]
    for step in path[:-1]:
        parent = parent[step]
    key = path[-1]
    if action == "set":
        parent[key] = copy.deepcopy(value)
    elif action == "delete":
        del parent[key]
    elif action == "append":
        parent[key].append(copy.deepcopy(value))
    elif action == "pop":
        parent[key].pop(value)
    elif action == "reverse":
        parent[key].reverse()
    elif action == "reorder":
        parent[key] = dict(reversed(list(parent[key].items())))
    elif action == "to_list":
        parent[key] = list(parent[key].values())
    elif action == "to_dict":
        parent[key] = {str(i): v for i, v in enumerate(parent[key])}
    elif action == "date":
        parent[key] = datetime.date(2024, 5, 1)
    elif action == "set_of":
        parent[key] = set(value)
    elif action == "alias_attr":
        state["alias"] = parent[key]
    elif action == "alias_key":
        parent[value] = parent[key]
    elif action == "cycle":
        parent[key]["self"] = parent[key]
    elif action == "deep":
        node: Any = "bottom"
        for _ in range(value):
            node = [node]
        parent[key] = node
    state["count"] += 1


def view(value: Any) -> Any:
    """The JSON view Sandpit shows of a Python value (``child_render.py``'s tags)."""
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    if isinstance(value, set):
        return {"$set": sorted(view(v) for v in value)}
    if type(value) is dict:
        return {k: view(v) for k, v in value.items()}
    if type(value) is list:
        return [view(v) for v in value]
    return value


def exact(a: Any, b: Any) -> bool:
    """Equal with types and key order (``1 == 1.0 == True`` in Python)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(exact(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def tables() -> dict[str, Any]:
    return {"users": {f"U{i:04d}": {"id": i, "tags": ["a", "b"], "address": {"city": "Austin", "zip": i},
                                    "pad": "p" * 100} for i in range(600)},
            "orders": {f"O{i:04d}": {"id": i, "status": "pending", "items": [{"qty": 1, "price": 2.5}],
                                     "pad": "q" * 100} for i in range(600)},
            "meta": {"version": 1}}


# (path, action, value), each followed by a state check
SCRIPT: list[tuple[list[Any], str, Any]] = [
    (["orders", "O0001", "status"], "set", "cancelled"),              # one nested change
    (["orders", "O0001", "items", 0, "qty"], "set", 1.0),             # type only: 1 -> 1.0 at depth
    (["orders", "O0001", "items", 0, "qty"], "set", True),            # 1.0 -> True
    (["orders", "O0001", "items", 0, "qty"], "set", 1),               # True -> 1
    (["users", "U0002"], "delete", None),                             # deletion
    (["users", "NEW"], "set", {"id": -1, "tags": []}),                # addition (at the end)
    (["orders", "O0003"], "reorder", None),                           # same content, keys reordered
    (["users"], "reorder", None),                                     # a large node reordered
    (["users", "U0004", "tags"], "append", "c"),                      # list growth
    (["users", "U0004", "tags"], "pop", 0),                           # list shrink
    (["users", "U0004", "tags"], "reverse", None),                    # list reorder
    (["orders", "O0005"], "alias_attr", None),                        # one object under two attributes
    (["orders", "O0005", "status"], "set", "via alias"),              # ...changed through one name
    (["orders", "O0006"], "alias_key", "O-TWIN"),                     # one object under two keys
    (["orders", "O0006", "items"], "append", {"qty": 0}),             # ...changed through one key
    (["users"], "to_list", None),                                     # a dict replaced by a list
    (["users"], "to_dict", None),                                     # ...and back
    (["orders", "O0007", "when"], "date", None),                      # a non-JSON value deep inside
    (["orders", "O0007", "when"], "set", "2024-05-01"),               # ...and gone again
    (["orders", "O0008", "tags"], "set_of", ["x", "y"]),              # a set deep inside
    (["orders", "O0008", "tags"], "set", ["x"]),
    (["meta", "version"], "set", 2**80),                              # a big integer
    (["users", "k" * 100_000], "set", {"v": "huge key"}),             # a huge key
]


def _step(api: httpx.Client, env_id: str, path: list[Any], action: str, value: Any) -> dict[str, Any]:
    response = api.post(f"/v1/envs/{env_id}/step", json={"name": "mutate", "arguments": {
        "path": path, "action": action, "value": value}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ok", body
    return body


def _state(api: httpx.Client, env_id: str, step: int | None = None) -> Any:
    response = api.get(f"/v1/envs/{env_id}/state", params={} if step is None else {"step": step})
    assert response.status_code == 200, response.text
    return response.json()["state"]


@pytest.fixture(scope="module")
def deep_env_id(server) -> str:
    with server.client() as client:
        response = client.post("/v1/environments", json={"source_code": SOURCE, "class_name": "Deep"})
        assert response.status_code == 201, response.text
        return response.json()["id"]


def _create(api: httpx.Client, environment_id: str, data: dict[str, Any]) -> str:
    response = api.post("/v1/envs", json={"environment_id": environment_id, "init_config": {"data": data}})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_every_kind_of_change_reads_back_exactly_now_at_every_step_after_restore_and_fork(
        server, api: httpx.Client, deep_env_id: str) -> None:
    model: dict[str, Any] = {"data": tables(), "count": 0}
    env_id = _create(api, deep_env_id, model["data"])
    views = [view(model)]
    assert exact(_state(api, env_id), views[0])
    blob_bytes = [_blob_bytes(server)]
    for path, action, value in SCRIPT:
        _step(api, env_id, path, action, value)
        mutate(model, path, action, value)
        views.append(view(model))
        assert exact(_state(api, env_id), views[-1]), (path, action)
        blob_bytes.append(_blob_bytes(server))
    # the JSON-native one-record steps store a few KiB, not the 200 KB tables
    assert blob_bytes[1] - blob_bytes[0] < 20_000 and blob_bytes[2] - blob_bytes[1] < 20_000
    for number, expected in enumerate(views):
        assert exact(_state(api, env_id, number), expected), number
    restored = view(copy.deepcopy(model))
    forks = api.post(f"/v1/envs/{env_id}/fork", json={"step": len(views) - 1, "count": 1})
    assert forks.status_code == 201, forks.text
    fork_id = forks.json()["data"][0]["id"]
    assert exact(_state(api, fork_id), restored)
    _step(api, fork_id, ["orders", "O0009", "status"], "set", 0.5)
    mutate(model, ["orders", "O0009", "status"], "set", 0.5)
    assert exact(_state(api, fork_id), view(model))
    assert exact(_state(api, env_id), views[-1])  # the original is untouched by its fork's step
    for number in (len(views) - 1, 7, 1):  # restore (a new session from the tree), then a step
        response = api.post(f"/v1/envs/{env_id}/restore", json={"step": number})
        assert response.status_code == 200, response.text
        assert exact(_state(api, env_id), views[number]), number
    _step(api, env_id, ["orders", "O0001", "items", 0, "qty"], "set", 2.0)
    expected = copy.deepcopy(views[1])
    expected["data"]["orders"]["O0001"]["items"][0]["qty"] = 2.0
    expected["count"] += 1
    assert exact(_state(api, env_id), expected)
    assert exact(_state(api, env_id, 2), expected)


def test_hostile_values_cycles_and_depth_then_back_to_exact_json(api: httpx.Client, deep_env_id: str) -> None:
    model: dict[str, Any] = {"data": tables(), "count": 0}
    env_id = _create(api, deep_env_id, model["data"])
    _step(api, env_id, ["orders", "O0001"], "cycle", None)
    shown = _state(api, env_id)["data"]["orders"]["O0001"]["self"]
    assert list(shown) == ["$cycle"]
    _step(api, env_id, ["orders", "O0001", "self"], "delete", None)
    _step(api, env_id, ["orders", "O0002", "deep"], "deep", 500)  # far past every depth limit
    assert "$truncated" in str(_state(api, env_id)["data"]["orders"]["O0002"]["deep"])
    _step(api, env_id, ["orders", "O0002", "deep"], "deep", 50)
    for path, action, value in [(["orders", "O0001"], "cycle", None), (["orders", "O0001", "self"], "delete", None),
                                (["orders", "O0002", "deep"], "deep", 500), (["orders", "O0002", "deep"], "deep", 50)]:
        mutate(model, path, action, value)
    assert exact(_state(api, env_id), view(model))
    assert exact(_state(api, env_id, 4), view(model))


def _blob_bytes(server) -> int:
    with sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT coalesce(sum(length(data)), 0) FROM blobs").fetchone()[0])


def test_an_evicted_env_comes_back_from_its_tree_exactly(make_server) -> None:
    server = make_server(SANDPIT_ENV_IDLE_EVICT_S="1")
    with server.client() as api:
        environment_id = api.post("/v1/environments", json={"source_code": SOURCE, "class_name": "Deep"}).json()["id"]
        model: dict[str, Any] = {"data": tables(), "count": 0}
        env_id = _create(api, environment_id, model["data"])
        for path, action, value in SCRIPT[:6]:
            _step(api, env_id, path, action, value)
            mutate(model, path, action, value)
        deadline = time.monotonic() + 30
        while api.get(f"/v1/envs/{env_id}").json()["status"] != "evicted":
            assert time.monotonic() < deadline, "the env was never evicted"
            time.sleep(0.5)
        assert exact(_state(api, env_id), view(model))
        _step(api, env_id, ["orders", "O0010", "items", 0, "price"], "set", 3)  # restored from the tree, then a step
        mutate(model, ["orders", "O0010", "items", 0, "price"], "set", 3)
        assert exact(_state(api, env_id), view(model))
        assert exact(_state(api, env_id, 7), view(model))
