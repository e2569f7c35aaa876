"""Steps run on the event loop (``step_inline_wait_s``) on a real server with real
sandboxes: on an idle server a step runs there from start to end, with exactly the
replies, state and trajectory a server that runs every step on a worker thread gives;
a step whose tool is slow moves to a thread within the wait and the server keeps
answering meanwhile; a tool that never returns is stopped by its call timeout as on a
thread; concurrent steps, steps with ``Idempotency-Key`` (on the event loop too) or
``Sandpit-Attempt`` (on a thread), and requests that fail (a wrong key, an unknown or ended env, a malformed body) are answered
as before. ``sandpit_step_runs_total`` says where each step ran."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx
import pytest
from api_server import ApiServer

pytestmark = pytest.mark.docker

SOURCE = '''
import time
from typing import Dict, List


class Desk:
    """A desk with notes: fast tools, a slow one and one that never returns."""

    def __init__(self, init_config: dict):
        self.notes: Dict[str, str] = dict(init_config.get("notes", {}))
        self.log: List[str] = []

    def write(self, key: str, text: str) -> str:
        """Write a note.

        Args:
            key (str): the note's name.
            text (str): its text.
        """
        self.notes[key] = text
        self.log.append(key)
        return f"wrote {key}"

    def read(self, key: str) -> str:
        """Read a note.

        Args:
            key (str): the note's name.
        """
        return self.notes[key]

    def nap(self, seconds: float) -> str:
        """Sleep, then write down that it slept.

        Args:
            seconds (float): how long.
        """
        time.sleep(seconds)
        self.log.append("nap")
        return f"slept {seconds}"

    def spin(self) -> None:
        """Never returns."""
        while True:
            pass
'''

ACTIONS: list[dict[str, Any]] = [
    {"name": "write", "arguments": {"key": "a", "text": "alpha"}},
    {"name": "read", "arguments": {"key": "a"}},
    {"name": "read", "arguments": {"key": "missing"}},  # the tool raises: status error
    {"name": "no_such_tool"},  # rejected before the sandbox
    {"text": '<tool_call>{"name": "write", "arguments": {"key": "b", "text": "beta"}}</tool_call>'},
    {"name": "write", "arguments": {"key": "a", "text": "x" * 5000}},
]


def _runs(server: ApiServer, metric: str = "sandpit_step_runs_total", label: str = "where") -> dict[str, float]:
    """``sandpit_step_runs_total`` by ``where`` (or ``metric`` by ``label``), read from ``/metrics``."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(rf'^{metric}\{{{label}="(\w+)"\}} ([0-9.e+]+)$', text, re.M)}


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {where: after.get(where, 0.0) - before.get(where, 0.0) for where in after
            if after.get(where, 0.0) != before.get(where, 0.0)}


def _desk(api: httpx.Client) -> str:
    reply = api.post("/v1/environments", json={"name": "desk", "source_code": SOURCE, "class_name": "Desk"})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["id"])


def _env(api: httpx.Client, environment_id: str, **body: Any) -> str:
    reply = api.post("/v1/envs", json={"environment_id": environment_id, "init_config": {"notes": {"z": "zed"}},
                                       "episode": {"max_steps": None}, **body})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["id"])


def _episode(server: ApiServer) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    """:data:`ACTIONS` on a new env of ``server``, one at a time: the step replies (without
    ids and times), the final state, the trajectory's steps (likewise) and where they ran."""
    with server.client() as api:
        env_id = _env(api, _desk(api))
        before = _runs(server)
        replies = []
        for action in ACTIONS:
            reply = api.post(f"/v1/envs/{env_id}/step", json=action, params={"include": "state,state_diff"})
            assert reply.status_code == 200, reply.text
            replies.append(_timeless(reply.json()))
        where = _moved(before, _runs(server))
        state = api.get(f"/v1/envs/{env_id}/state").json()["state"]
        trajectory = api.get(f"/v1/envs/{env_id}/trajectory").json()
    return replies, state, [_timeless(s) for s in trajectory["steps"]], where


def _timeless(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("env_id", "duration_ms", "created_at", "info")}


def test_an_idle_servers_steps_run_on_the_event_loop_with_a_threads_results(server: ApiServer, make_server) -> None:
    inline = _episode(server)
    threaded = _episode(make_server(SANDPIT_STEP_INLINE_WAIT_S="0"))
    assert threaded[3] == {"worker_thread": len(ACTIONS)}
    assert sum(inline[3].values()) == len(ACTIONS)  # each started on the event loop; a slow reply moved it on
    assert inline[3].get("worker_thread", 0) <= 1  # only while a background writer held the database, if ever
    assert inline[:3] == threaded[:3]
    replies, state, steps = inline[:3]
    assert [r["status"] for r in replies] == ["ok", "ok", "error", "rejected", "ok", "ok"]
    assert state["notes"] == {"z": "zed", "a": "x" * 5000, "b": "beta"} and len(steps) == len(ACTIONS)


def test_a_slow_tool_moves_to_a_thread_and_the_server_keeps_answering(server: ApiServer) -> None:
    key = server.new_tenant("inline-wide", quotas={"max_running_calls": 4})  # the nap takes no one else's slot
    with server.client(key) as api:
        _slow_tool_moves(server, api, key)


def test_a_spin_longer_than_the_wait_still_hands_a_slow_tool_on(make_server) -> None:
    """``SANDPIT_STEP_INLINE_SPIN_S`` at its largest (50 ms) with the default 2 ms wait:
    the event loop polls no longer than the wait, so the slow tool moves to a thread and
    the server keeps answering as with the default spin; fast steps on it are inline."""
    server = make_server(SANDPIT_STEP_INLINE_SPIN_S="0.05")
    key = server.new_tenant("inline-spin", quotas={"max_running_calls": 4})
    with server.client(key) as api:
        env_id = _env(api, _desk(api))
        api.post(f"/v1/envs/{env_id}/step", json=ACTIONS[0])  # its session is live: no re-attach below
        before, spins = _runs(server), _runs(server, "sandpit_step_spins_total", "outcome")
        for _ in range(5):
            reply = api.post(f"/v1/envs/{env_id}/step", json=ACTIONS[1])
            assert reply.status_code == 200 and reply.json()["observation"] == "alpha", reply.text
        assert sum(_moved(before, _runs(server)).values()) == 5
        spun = _moved(spins, _runs(server, "sandpit_step_spins_total", "outcome"))
        # each step that started on the event loop polled (caught or missed) or found no spare CPU
        assert set(spun) <= {"caught", "missed", "no_spare_cpu"} and sum(spun.values()) == 5, spun
        _slow_tool_moves(server, api, key)


def _slow_tool_moves(server: ApiServer, api: httpx.Client, key: str) -> None:
    desk = _desk(api)
    slow, other = _env(api, desk), _env(api, desk)
    api.post(f"/v1/envs/{other}/step", json=ACTIONS[0])  # its session is live: no re-attach below
    before = _runs(server)
    answer: dict[str, httpx.Response] = {}

    def nap() -> None:
        with server.client(key) as own:
            answer["nap"] = own.post(f"/v1/envs/{slow}/step", json={"name": "nap", "arguments": {"seconds": 2.0}})

    napper = threading.Thread(target=nap)
    napper.start()
    time.sleep(0.5)  # the nap is in its sandbox now
    started = time.perf_counter()
    assert api.get("/healthz").status_code == 200
    health_s = time.perf_counter() - started
    started = time.perf_counter()
    stepped = api.post(f"/v1/envs/{other}/step", json=ACTIONS[1])
    step_s = time.perf_counter() - started
    napper.join(30)
    assert health_s < 0.5 and step_s < 1.0, (health_s, step_s)
    assert stepped.status_code == 200 and stepped.json()["observation"] == "alpha"
    assert answer["nap"].status_code == 200, answer["nap"].text
    assert answer["nap"].json()["status"] == "ok" and answer["nap"].json()["observation"] == "slept 2.0"
    moved = _moved(before, _runs(server))
    assert moved.get("handed_off") == 1 and moved.get("worker_thread") == 1, moved  # the other step: a nap ran
    assert api.get(f"/v1/envs/{slow}/state").json()["state"]["log"] == ["nap"]
    again = api.post(f"/v1/envs/{slow}/step", json=ACTIONS[0])
    assert again.status_code == 200 and again.json()["status"] == "ok"


def test_a_tool_that_never_returns_is_stopped_as_on_a_thread(server: ApiServer, api: httpx.Client) -> None:
    env_id = _env(api, _desk(api), profile={"call_timeout_s": 1.0})
    api.post(f"/v1/envs/{env_id}/step", json=ACTIONS[0])
    before = _runs(server)
    spun = api.post(f"/v1/envs/{env_id}/step", json={"name": "spin"})
    assert spun.status_code == 200, spun.text
    assert spun.json()["status"] == "timeout"
    assert _moved(before, _runs(server)) == {"handed_off": 1}
    after = api.post(f"/v1/envs/{env_id}/step", json=ACTIONS[1])  # re-attached from the committed head
    assert after.status_code == 200 and after.json()["observation"] == "alpha"


def test_concurrent_steps_run_every_step_once(server: ApiServer, api: httpx.Client) -> None:
    desk = _desk(api)
    envs = [_env(api, desk) for _ in range(8)]
    errors: list[str] = []

    def agent(env_id: str) -> None:
        with server.client() as own:
            for i in range(15):
                reply = own.post(f"/v1/envs/{env_id}/step",
                                 json={"name": "write", "arguments": {"key": f"k{i}", "text": str(i)}})
                if reply.status_code != 200 or reply.json()["status"] != "ok":
                    errors.append(reply.text)

    before = _runs(server)
    agents = [threading.Thread(target=agent, args=(env_id,)) for env_id in envs]
    for thread in agents:
        thread.start()
    for thread in agents:
        thread.join(120)
    assert not errors
    moved = _moved(before, _runs(server))
    assert sum(moved.values()) == 8 * 15 and moved.get("worker_thread", 0) > 0, moved
    for env_id in envs:
        state = api.get(f"/v1/envs/{env_id}/state").json()["state"]
        assert state["log"] == [f"k{i}" for i in range(15)]
        assert len(api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]) == 15


def test_keyed_fenced_and_failing_requests_are_answered_as_before(server: ApiServer, api: httpx.Client) -> None:
    desk = _desk(api)
    env_id, ended = _env(api, desk), _env(api, desk, episode={"max_steps": 1})
    api.post(f"/v1/envs/{env_id}/step", json=ACTIONS[0])
    assert api.post(f"/v1/envs/{ended}/step", json=ACTIONS[0]).status_code == 200  # max_steps 1: it ended
    token = api.post(f"/v1/envs/{env_id}/attempts").json()["token"]
    before = _runs(server)
    keyed = api.post(f"/v1/envs/{env_id}/step", json=ACTIONS[1], headers={"Idempotency-Key": "inline-1"})
    replayed = api.post(f"/v1/envs/{env_id}/step", json=ACTIONS[1], headers={"Idempotency-Key": "inline-1"})
    fenced = api.post(f"/v1/envs/{env_id}/step", json=ACTIONS[1], headers={"Sandpit-Attempt": token})
    assert keyed.status_code == 200 and replayed.headers.get("idempotent-replayed") == "true"
    assert replayed.json() == keyed.json() and fenced.status_code == 200
    # the keyed step starts on the event loop (moving on to a thread if its reply is slow, as
    # any step; on a thread only while a background writer held the database), its replay
    # is no step run, the fenced one runs on a thread
    where = _moved(before, _runs(server))
    assert sum(where.values()) == 2 and 1 <= where.get("worker_thread", 0) <= 2, where
    wrong_key = httpx.post(f"{server.url}/v1/envs/{env_id}/step", json=ACTIONS[1],
                           headers={"Authorization": "Bearer sk-not-a-key"}, timeout=30)
    assert wrong_key.status_code == 401
    assert api.post("/v1/envs/env-no-such-env/step", json=ACTIONS[1]).status_code == 404
    assert api.post(f"/v1/envs/{ended}/step", json=ACTIONS[1]).json()["error"]["code"] == "episode_ended"
    assert api.post(f"/v1/envs/{env_id}/step", content=b'{"name": "read", "arguments": ',
                    headers={"Content-Type": "application/json"}).status_code == 422
    steps = api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]
    assert [s["action"]["name"] for s in steps] == ["write", "read", "read"]  # the keyed read once
