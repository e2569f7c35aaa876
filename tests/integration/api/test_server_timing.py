"""``Server-Timing`` on step replies, on a real server with real sandboxes: a step that
ran carries its phases and total (on the event loop and on a worker thread, for ok,
failing and rejected actions), consistent with what the client measured, and a batched
step its total; a replay, error replies and requests refused before the step carry none,
nor does a server with ``SANDPIT_SERVER_TIMING=false``."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from api_server import ApiServer

pytestmark = pytest.mark.docker

SOURCE = '''
from typing import Dict


class Shelf:
    """A shelf of named items."""

    def __init__(self, init_config: dict):
        self.items: Dict[str, int] = dict(init_config.get("items", {}))

    def put(self, name: str, count: int) -> int:
        """Put items on the shelf; returns how many there are now.

        Args:
            name (str): the item.
            count (int): how many.
        """
        self.items[name] = self.items.get(name, 0) + count
        return self.items[name]

    def take(self, name: str) -> int:
        """Take every item of a name; returns how many were taken.

        Args:
            name (str): the item.
        """
        return self.items.pop(name)
'''

_ENTRY = re.compile(r"([a-z]+);dur=(\d+\.\d{3})")


def _timing(reply: httpx.Response) -> dict[str, float]:
    """The reply's ``Server-Timing`` as {name: milliseconds}, checked to be well formed."""
    value = reply.headers["server-timing"]
    entries = [entry.strip() for entry in value.split(",")]
    parsed = [_ENTRY.fullmatch(entry) for entry in entries]
    assert all(parsed), value
    timing = {m.group(1): float(m.group(2)) for m in parsed if m is not None}
    assert len(timing) == len(entries) and list(timing)[-1] == "total", value
    return timing


def _env(api: httpx.Client) -> str:
    environment = api.post("/v1/environments", json={"name": "shelf", "source_code": SOURCE, "class_name": "Shelf"})
    assert environment.status_code == 201, environment.text
    env = api.post("/v1/envs", json={"environment_id": environment.json()["id"], "init_config": {"items": {"a": 1}},
                                     "episode": {"max_steps": None}})
    assert env.status_code == 201, env.text
    return str(env.json()["id"])


def _timed_steps(server: ApiServer) -> list[tuple[str, dict[str, float], float]]:
    """Four actions (ok, the tool raises, unknown tool, ok) on a new env of ``server``: each
    reply's status, its ``Server-Timing`` and the client-measured milliseconds."""
    out = []
    with server.client() as api:
        env_id = _env(api)
        for action in ({"name": "put", "arguments": {"name": "b", "count": 2}}, {"name": "take", "arguments": {"name": "z"}},
                       {"name": "no_such_tool"}, {"name": "take", "arguments": {"name": "b"}}):
            started = time.perf_counter()
            reply = api.post(f"/v1/envs/{env_id}/step", json=action)
            elapsed_ms = (time.perf_counter() - started) * 1000
            assert reply.status_code == 200, reply.text
            out.append((reply.json()["status"], _timing(reply), elapsed_ms))
    return out


def _check(steps: list[tuple[str, dict[str, float], float]]) -> None:
    assert [status for status, _, _ in steps] == ["ok", "error", "rejected", "ok"]
    for status, timing, elapsed_ms in steps:
        assert {"auth", "serialize", "total"} <= set(timing), timing
        assert all(ms >= 0 for ms in timing.values()), timing
        phases = sum(ms for name, ms in timing.items() if name != "total")
        # the header's three decimals round each phase: the total is their sum or more
        assert timing["total"] + 0.001 * len(timing) >= phases, timing
        assert timing["total"] <= elapsed_ms, (timing, elapsed_ms)  # the client waited for all of it
        if status != "rejected":  # a rejected action never reaches the sandbox
            assert timing["sandbox"] > 0 and "persist" in timing, timing


def test_step_replies_carry_their_phases_on_the_event_loop_and_on_a_thread(server: ApiServer, make_server) -> None:
    _check(_timed_steps(server))
    _check(_timed_steps(make_server(SANDPIT_STEP_INLINE_WAIT_S="0")))


def test_replays_errors_and_refused_requests_carry_none(server: ApiServer, api: httpx.Client) -> None:
    env_id = _env(api)
    keyed = api.post(f"/v1/envs/{env_id}/step", json={"name": "put", "arguments": {"name": "k", "count": 1}},
                     headers={"Idempotency-Key": "timing-1"})
    replayed = api.post(f"/v1/envs/{env_id}/step", json={"name": "put", "arguments": {"name": "k", "count": 1}},
                        headers={"Idempotency-Key": "timing-1"})
    assert keyed.status_code == 200 and _timing(keyed)["sandbox"] > 0
    assert replayed.headers.get("idempotent-replayed") == "true" and "server-timing" not in replayed.headers
    refused = [
        httpx.post(f"{server.url}/v1/envs/{env_id}/step", json={"name": "take", "arguments": {"name": "k"}},
                   headers={"Authorization": "Bearer sk-not-a-key"}, timeout=30),  # 401
        api.post("/v1/envs/env-no-such-env/step", json={"name": "take", "arguments": {"name": "k"}}),  # 404
        api.post(f"/v1/envs/{env_id}/step", content=b'{"name": "take", "arguments": ',
                 headers={"Content-Type": "application/json"}),  # 422: truncated
        api.post(f"/v1/envs/{env_id}/step", json={"name": "take", "arguments": {"name": "k"}},
                 params={"include": "state," * 40}),  # 422: include too long
        api.post(f"/v1/envs/{env_id}/step", json={"name": "take", "arguments": {"name": "k"}, "extra": 1}),  # 422
        api.post(f"/v1/envs/{env_id}/step", json={"name": "take", "arguments": {"name": "k"}},
                 headers={"Idempotency-Key": "k" * 300}),  # 422: key too long
        api.post(f"/v1/envs/{env_id}/step", content=b"x" * (9 * 1024 * 1024),
                 headers={"Content-Type": "application/json"}),  # 413
    ]
    assert [r.status_code for r in refused] == [401, 404, 422, 422, 422, 422, 413]
    assert not [r for r in refused if "server-timing" in r.headers]
    # the refused requests changed nothing: the item is still there to take
    taken = api.post(f"/v1/envs/{env_id}/step", json={"name": "take", "arguments": {"name": "k"}})
    assert taken.json()["observation"] == "1" and _timing(taken)["total"] > 0


def test_a_batch_carries_its_total_and_a_refused_batch_none(server: ApiServer, api: httpx.Client) -> None:
    envs = [_env(api) for _ in range(3)]
    steps = [{"env_id": env_id, "action": {"name": "put", "arguments": {"name": "b", "count": 2}}} for env_id in envs]
    started = time.perf_counter()
    reply = api.post("/v1/envs:step", json={"steps": steps})
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert reply.status_code == 200, reply.text
    assert [r["result"]["observation"] for r in reply.json()["results"]] == ["2", "2", "2"]
    timing = _timing(reply)
    assert list(timing) == ["total"] and 0 < timing["total"] <= elapsed_ms, (timing, elapsed_ms)
    refused = [api.post("/v1/envs:step", json={"steps": [steps[0], steps[0]]}),  # an env twice: 422, nothing runs
               api.post("/v1/envs:step", json={"steps": "all of them"}),
               api.post("/v1/envs:step", content=b'{"steps": [', headers={"Content-Type": "application/json"}),
               httpx.post(f"{server.url}/v1/envs:step", json={"steps": steps},
                          headers={"Authorization": "Bearer sk-not-a-key"}, timeout=30)]
    assert [r.status_code for r in refused] == [422, 422, 422, 401]
    assert not [r for r in refused if "server-timing" in r.headers]
    state = api.get(f"/v1/envs/{envs[0]}/state").json()["state"]
    assert state["items"] == {"a": 1, "b": 2}  # the refused batches ran nothing


def test_the_setting_turns_it_off(make_server) -> None:
    quiet = make_server(SANDPIT_SERVER_TIMING="false")
    with quiet.client() as api:
        env_id = _env(api)
        reply = api.post(f"/v1/envs/{env_id}/step", json={"name": "put", "arguments": {"name": "b", "count": 2}})
        batch = api.post("/v1/envs:step", json={"steps": [{"env_id": env_id, "action": {"name": "take",
                                                                                           "arguments": {"name": "b"}}}]})
    assert reply.status_code == 200 and reply.json()["observation"] == "2"
    assert batch.status_code == 200 and batch.json()["results"][0]["result"]["observation"] == "2"
    assert "server-timing" not in reply.headers and "server-timing" not in batch.headers
