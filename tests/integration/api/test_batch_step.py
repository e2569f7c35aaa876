"""The batched step (``POST /v1/envs:step``) on a real server with real sandboxes: each
env's step is exactly what its own step route gives (the same results and state), in the
request's order; a refused step (unknown or another tenant's env, an ended episode, a
stale attempt, a reused key) is that step's outcome and never stops the others; a
malformed batch or an env named twice is a 422 with nothing run; each step's
``idempotency_key`` replays; a tenant whose ``max_concurrent_calls`` is 1 still gets a
whole batch run. The client's ``step_many`` reads the same. The batch's steps share one
transaction: a step whose write fails there (its attempt fenced while its tool ran) is
that step's refusal and the others commit alone; batches stepping the same envs at once
run every step once, and so do four sends of one keyed batch at once; a batch resent
after a lost reply (also across a server crash) replays what committed and runs the rest."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from api_server import COUNTER_SOURCE, ApiServer, create_envs
from sandpit.client import Client, Conflict, NotFound

pytestmark = pytest.mark.docker


def _batch(api: httpx.Client, steps: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return api.post("/v1/envs:step", json={"steps": steps, **extra})


def _bump(env_id: str, by: int, **extra: Any) -> dict[str, Any]:
    return {"env_id": env_id, "action": {"name": "bump", "arguments": {"by": by}}, **extra}


def test_each_step_is_its_own_step_route_step(api: httpx.Client, counter_env_id: str) -> None:
    batched, alone = create_envs(api, counter_env_id, 3), create_envs(api, counter_env_id, 3)
    actions = [{"name": "bump", "arguments": {"by": 2}}, {"text": '<tool_call>{"name": "bump", "arguments": {}}'
                                                          '</tool_call>'}, {"name": "no_such_tool"}]
    reply = _batch(api, [{"env_id": e, "action": a} for e, a in zip(batched, actions, strict=True)],
                   include="state,state_diff")
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [r["env_id"] for r in results] == batched and [r["status"] for r in results] == [200, 200, 200]
    for result, env_id, action in zip(results, alone, actions, strict=True):
        single = api.post(f"/v1/envs/{env_id}/step", json=action, params={"include": "state,state_diff"}).json()
        mine = result["result"]
        for field in ("duration_ms", "env_id"):
            mine.pop(field), single.pop(field)
        assert mine == single
    assert [r["result"]["status"] for r in results] == ["ok", "ok", "rejected"]
    assert api.get(f"/v1/envs/{batched[0]}/state").json()["state"]["count"] == 2


def test_a_refused_step_is_its_own_outcome(server: ApiServer, api: httpx.Client, counter_env_id: str) -> None:
    ok, ended, fenced = create_envs(api, counter_env_id, 3, episode={"max_steps": 1})[:2] + create_envs(api, counter_env_id, 1)
    assert api.post(f"/v1/envs/{ended}/step", json={"name": "bump"}).status_code == 200  # max_steps 1: it ended
    old = api.post(f"/v1/envs/{fenced}/attempts").json()["token"]
    api.post(f"/v1/envs/{fenced}/attempts")
    other_key = server.new_tenant("batch-other")
    with server.client(other_key) as other:
        theirs = create_envs(other, other.post("/v1/environments", json={
            "source_code": COUNTER_SOURCE, "class_name": "Counter"}).json()["id"], 1)[0]
    reply = _batch(api, [_bump(ok, 1), _bump(ended, 1), _bump("env_does_not_exist", 1), _bump(theirs, 1),
                         _bump(fenced, 1, attempt=old)])
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [(r["status"], (r.get("error") or {}).get("code")) for r in results] == [
        (200, None), (409, "episode_ended"), (404, "not_found"), (404, "not_found"), (409, "stale_attempt")]
    assert results[0]["result"]["observation"] == "1" and "result" not in results[1]
    with server.client(other_key) as other:
        assert other.get(f"/v1/envs/{theirs}").json()["step"] == 0  # nothing ran in the other tenant's env
    assert api.get(f"/v1/envs/{fenced}").json()["step"] == 0


@pytest.mark.parametrize("body", [
    {"steps": []},
    {"steps": [_bump(f"env_{i}", 1) for i in range(257)]},
    {"steps": [{"env_id": "env_1"}]},
    {"steps": [{"env_id": "env_1", "action": {"name": "bump"}, "extra": 1}]},
    {"steps": [{"env_id": "", "action": {"name": "bump"}}]},
    {"steps": [{"env_id": "env_1", "action": {"name": "bump", "function": {"name": "x", "arguments": "{}"}}}]},
    {"steps": [_bump("env_1", 1, attempt="not a token!")]},
    {"steps": [_bump("env_1", 1, idempotency_key="")]},
    {"steps": [_bump("env_1", 1)], "include": "secrets"},
    {"steps": "all of them"},
    [],
])
def test_a_malformed_batch_is_422(api: httpx.Client, body: Any) -> None:
    reply = api.post("/v1/envs:step", json=body)
    assert reply.status_code == 422, reply.text
    assert reply.json()["error"]["code"] == "invalid_request"


def test_an_env_twice_is_422_and_nothing_runs(api: httpx.Client, counter_env_id: str) -> None:
    first, second = create_envs(api, counter_env_id, 2)
    reply = _batch(api, [_bump(first, 1), _bump(second, 1), _bump(first, 2)])
    assert reply.status_code == 422 and reply.json()["error"]["field"] == "steps.2.env_id", reply.text
    assert [api.get(f"/v1/envs/{e}").json()["step"] for e in (first, second)] == [0, 0]


def test_a_steps_key_replays_and_a_reused_key_is_409(api: httpx.Client, counter_env_id: str) -> None:
    first, second = create_envs(api, counter_env_id, 2)
    steps = [_bump(first, 1, idempotency_key="k-first"), _bump(second, 5, idempotency_key="k-second")]
    once = _batch(api, steps).json()["results"]
    again = _batch(api, steps).json()["results"]
    assert [r.get("replayed", False) for r in once] == [False, False]
    assert [r["replayed"] for r in again] == [True, True]
    assert [r["result"] for r in again] == [r["result"] for r in once]
    assert [api.get(f"/v1/envs/{e}").json()["step"] for e in (first, second)] == [1, 1]
    reused = _batch(api, [_bump(first, 2, idempotency_key="k-first"), _bump(second, 1)]).json()["results"]
    assert (reused[0]["status"], reused[0]["error"]["code"], reused[1]["status"]) == (409, "idempotency_key_reused",
                                                                                     200)


def test_a_tenant_with_one_concurrent_call_gets_its_batch_run(server: ApiServer) -> None:
    key = server.new_tenant("batch-one", {"max_concurrent_calls": 1})
    with server.client(key) as api:
        environment = api.post("/v1/environments", json={"source_code": COUNTER_SOURCE,
                                                         "class_name": "Counter"}).json()["id"]
        envs = create_envs(api, environment, 4)
        results = _batch(api, [_bump(e, i) for i, e in enumerate(envs, 1)]).json()["results"]
    assert [(r["status"], r["result"]["observation"]) for r in results] == [(200, "1"), (200, "2"), (200, "3"),
                                                                            (200, "4")]


def test_the_client_steps_many(server: ApiServer, counter_env_id: str) -> None:
    with Client(server.url, api_key=server.api_key) as client:
        handles = [client.envs.create(counter_env_id) for _ in range(2)]
        outcomes = client.envs.step_many([(handles[0], {"name": "bump", "arguments": {"by": 3}}),
                                          (handles[1].id, {"text": "done"})], include=["state"])
        assert [o.ok for o in outcomes] == [True, True]
        assert outcomes[0].unwrap().state == {"count": 3, "records": {}, "log": ["bump 3"]}
        assert outcomes[1].result is not None and outcomes[1].result.action == {
            "name": "chat_with_user", "arguments": {"content": "done"}}
        handles[0].resume()
        stale = handles[0].attempt
        handles[0].resume()
        fenced = client.envs.get(handles[0].id, attempt=stale)
        missing = client.envs.step_many([(fenced, {"name": "bump"}), ("env_does_not_exist", {"name": "bump"})])
        assert isinstance(missing[0].exception(), Conflict) and missing[0].exception().code == "stale_attempt"
        with pytest.raises(NotFound):
            missing[1].unwrap()
        with pytest.raises(ValueError, match="twice"):
            client.envs.step_many([(handles[0], {"name": "bump"}), (handles[0].id, {"name": "bump"})])
        for handle in handles:
            handle.delete()


SLOW_SOURCE = '''
import time


class Slow:
    """A counter whose bump takes a while."""

    def __init__(self, init_config):
        self.count = 0

    def bump(self, seconds: float = 0.0) -> int:
        """Add one after sleeping `seconds`."""
        time.sleep(seconds)
        self.count += 1
        return self.count
'''


def _slow_env(api: httpx.Client) -> str:
    created = api.post("/v1/envs", json={"source_code": SLOW_SOURCE, "class_name": "Slow"})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _steps(api: httpx.Client, env_id: str) -> list[int]:
    return [s["step"] for s in api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]]


def test_a_step_whose_write_fails_in_the_batchs_transaction_takes_no_other_down(
        server: ApiServer, api: httpx.Client, counter_env_id: str) -> None:
    slow = _slow_env(api)
    others = create_envs(api, counter_env_id, 3)
    old = api.post(f"/v1/envs/{slow}/attempts").json()["token"]
    replies: list[httpx.Response] = []
    with server.client() as worker:  # the batch's writes wait for the slow step: they share its transaction
        thread = threading.Thread(target=lambda: replies.append(_batch(worker, [
            {"env_id": slow, "action": {"name": "bump", "arguments": {"seconds": 1.5}}, "attempt": old},
            *[_bump(e, 2) for e in others]])))
        thread.start()
        time.sleep(0.5)  # the slow tool is running: a new attempt fences its write
        assert api.post(f"/v1/envs/{slow}/attempts").status_code == 201
        thread.join(timeout=60)
    results = replies[0].json()["results"]
    assert [(r["status"], (r.get("error") or {}).get("code")) for r in results] == [
        (409, "stale_attempt"), (200, None), (200, None), (200, None)]
    assert api.get(f"/v1/envs/{slow}").json()["step"] == 0 and _steps(api, slow) == []
    for env_id in others:  # committed alone after the shared transaction failed
        assert _steps(api, env_id) == [1] and api.get(f"/v1/envs/{env_id}/state").json()["state"]["count"] == 2
    fresh = api.post(f"/v1/envs/{slow}/attempts").json()["token"]  # the sandbox re-syncs to the committed head
    stepped = _batch(api, [{"env_id": slow, "action": {"name": "bump"}, "attempt": fresh}]).json()["results"][0]
    assert stepped["result"]["observation"] == "1"


def test_two_batches_stepping_the_same_envs_at_once(server: ApiServer, api: httpx.Client,
                                                    counter_env_id: str) -> None:
    envs = create_envs(api, counter_env_id, 4)
    rounds = 6
    failures: list[Any] = []

    def drive(order: list[str]) -> None:
        with server.client(timeout=60) as client:
            for _ in range(rounds):
                reply = _batch(client, [_bump(e, 1) for e in order])
                if reply.status_code != 200 or any(r["status"] != 200 for r in reply.json()["results"]):
                    failures.append(reply.text)

    threads = [threading.Thread(target=drive, args=(order,)) for order in (envs, envs[::-1], envs[1:] + envs[:1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and not failures, failures[:2]
    for env_id in envs:  # every step ran once, in one order per env
        assert _steps(api, env_id) == list(range(1, 3 * rounds + 1))
        assert api.get(f"/v1/envs/{env_id}/state").json()["state"]["count"] == 3 * rounds


def test_one_keyed_batch_sent_four_times_at_once_runs_each_step_once(server: ApiServer, api: httpx.Client,
                                                                     counter_env_id: str) -> None:
    """A client that resends a batch before its first send answered: each step's key is
    claimed in its own transaction, so each env's step runs once; in every reply each
    step is the one that ran, its replay, or 409 in flight, and a later resend replays all."""
    envs = create_envs(api, counter_env_id, 4)
    batch = [_bump(e, 2, idempotency_key=f"at-once-{e}") for e in envs]
    barrier = threading.Barrier(4)
    replies: list[list[dict[str, Any]]] = []

    def send() -> None:
        with server.client(timeout=60) as client:
            barrier.wait()
            reply = _batch(client, batch)
            assert reply.status_code == 200, reply.text
            replies.append(reply.json()["results"])

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(replies) == 4
    later = _batch(api, batch).json()["results"]
    assert all(r["status"] == 200 and r["replayed"] for r in later), later
    for index, env_id in enumerate(envs):
        outcomes = [reply[index] for reply in replies]
        ran = [o for o in outcomes if o["status"] == 200 and not o.get("replayed", False)]
        assert len(ran) == 1 and ran[0]["result"] == later[index]["result"], outcomes
        for outcome in outcomes:
            assert outcome["status"] == 200 and outcome["result"] == ran[0]["result"] or (
                outcome["status"], outcome["error"]["code"]) == (409, "idempotency_key_in_flight"), outcome
        assert _steps(api, env_id) == [1]
        assert api.get(f"/v1/envs/{env_id}/state").json()["state"]["count"] == 2


def test_a_resent_batch_replays_what_committed_and_runs_the_rest(api: httpx.Client, counter_env_id: str) -> None:
    running, ended = create_envs(api, counter_env_id, 1)[0], create_envs(api, counter_env_id, 1, episode={"max_steps": 1})[0]
    assert api.post(f"/v1/envs/{ended}/step", json={"name": "bump"}).status_code == 200
    batch = [_bump(running, 3, idempotency_key="resend-a"), _bump(ended, 3, idempotency_key="resend-b")]
    first = _batch(api, batch).json()["results"]
    assert [(r["status"], r.get("replayed", False)) for r in first] == [(200, False), (409, False)]
    assert api.post(f"/v1/envs/{ended}/reset", json={}).status_code == 200
    again = _batch(api, batch).json()["results"]  # the same batch, as a client resends it after a lost reply
    assert [(r["status"], r.get("replayed", False)) for r in again] == [(200, True), (200, False)]
    assert again[0]["result"] == first[0]["result"] and _steps(api, running) == [1]
    assert api.get(f"/v1/envs/{running}/state").json()["state"]["count"] == 3


def test_a_crash_during_a_batch_then_its_resend(make_server, counter_source: str) -> None:
    server = make_server(SANDPIT_IDEMPOTENCY_LEASE_S="3")
    with server.client() as api:
        environment_id = api.post("/v1/environments", json={"source_code": counter_source,
                                                            "class_name": "Counter"}).json()["id"]
        counters = create_envs(api, environment_id, 3)
        slow = _slow_env(api)
    batch = [{"env_id": slow, "action": {"name": "bump", "arguments": {"seconds": 3}}, "idempotency_key": "crash-s"},
             *[_bump(e, 1, idempotency_key=f"crash-{i}") for i, e in enumerate(counters)]]
    lost: list[BaseException] = []
    with server.client(timeout=60) as worker:
        thread = threading.Thread(target=lambda: _send_expecting_loss(worker, batch, lost))
        thread.start()
        time.sleep(1.5)  # the counters' steps are done, the slow one runs: nothing is acknowledged yet
        server.kill()
        thread.join(timeout=60)
    assert lost, "the batch's reply should have been lost with the server"
    server.start()
    with server.client(timeout=60) as api:
        for env_id in [slow, *counters]:  # whatever committed is whole: trajectory, head and state agree
            steps = _steps(api, env_id)
            assert steps in ([], [1]) and api.get(f"/v1/envs/{env_id}").json()["step"] == len(steps)
        deadline = time.monotonic() + 60
        while True:  # the client's resend after the lost reply; the dead server's claims lapse after the lease
            results = _batch(api, batch).json()["results"]
            codes = {(r.get("error") or {}).get("code") for r in results}
            if codes != {"idempotency_key_in_flight"} or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert [r["status"] for r in results] == [200] * 4, results
        for env_id in [slow, *counters]:
            assert _steps(api, env_id) == [1]  # every step ran exactly once
        assert [api.get(f"/v1/envs/{e}/state").json()["state"]["count"] for e in counters] == [1, 1, 1]


def _send_expecting_loss(client: httpx.Client, batch: list[dict[str, Any]], lost: list[BaseException]) -> None:
    try:
        _batch(client, batch)
    except httpx.TransportError as exc:
        lost.append(exc)
