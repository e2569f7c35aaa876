"""The batched step's vectorised path on a real server: steps of many envs sharing
sandboxes (their calls grouped, one frame per sandbox) give exactly what each env's own
step route gives (observations, deltas, state, rewards, errors, episode ends), also under
the ``envscaler`` profile; a step whose tool loops past its deadline or kills its
session process is that step's ``timeout``/``crashed`` outcome while the others of its
group commit, and its env goes on from its last committed state; a step that ends at
once frees its env while the rest of its batch runs; episodes that end together are
scored (their checks run at once) as they are alone."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from api_server import COUNTER_SOURCE, ApiServer, create_envs

pytestmark = pytest.mark.docker

FAILING_SOURCE = '''
import os
import time


class Failing:
    """A counter whose tools can loop or kill their own process."""

    def __init__(self, init_config):
        self.count = 0

    def bump(self) -> int:
        """Add one."""
        self.count += 1
        return self.count

    def spin(self) -> int:
        """Never return."""
        self.count = -1
        while True:
            pass

    def die(self) -> int:
        """End this process."""
        self.count = -1
        os._exit(3)

    def nap(self, seconds: float) -> int:
        """Sleep, then add one."""
        time.sleep(seconds)
        self.count += 1
        return self.count
'''


def _environment(api: httpx.Client, source: str, class_name: str) -> str:
    response = api.post("/v1/environments", json={"source_code": source, "class_name": class_name})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


ACTIONS: list[dict[str, Any]] = [
    {"name": "bump", "arguments": {"by": 2}},
    {"name": "set_record", "arguments": {"key": "a", "value": "v", "size": 40_000}},  # a keyed delta
    {"name": "get_record", "arguments": {"key": "missing"}},  # the tool raises: an error observation
    {"name": "bump", "arguments": {"by": "not a number"}},
    {"name": "no_such_tool"},
    {"text": "no tool call at all"},
    {"name": "bump", "arguments": {}},
    {"name": "set_record", "arguments": {"key": "b", "value": "w"}},
]


@pytest.mark.parametrize("profile", ["sandpit", "envscaler"])
def test_a_wide_batch_equals_each_envs_own_steps(api: httpx.Client, profile: str) -> None:
    environment_id = _environment(api, COUNTER_SOURCE, "Counter")
    episode = {"max_steps": 2, "profile": profile}
    batched = create_envs(api, environment_id, len(ACTIONS), episode=episode)
    alone = create_envs(api, environment_id, len(ACTIONS), episode=episode)
    for round_ in range(2):  # the second round ends every episode (max_steps 2: truncated)
        reply = api.post("/v1/envs:step", json={"include": "state,state_diff", "steps": [
            {"env_id": e, "action": a} for e, a in zip(batched, ACTIONS, strict=True)]})
        assert reply.status_code == 200, reply.text
        results = reply.json()["results"]
        assert [r["env_id"] for r in results] == batched
        for result, env_id, action in zip(results, alone, ACTIONS, strict=True):
            single = api.post(f"/v1/envs/{env_id}/step", json=action, params={"include": "state,state_diff"})
            assert (result["status"], round_) == (single.status_code, round_), (result, single.text)
            if single.status_code != 200:
                assert result["error"] == {**single.json()["error"], "message": single.json()["error"]["message"]
                                           .replace(env_id, result["env_id"])}
                continue
            mine, theirs = result["result"], single.json()
            for field in ("duration_ms", "env_id"):
                mine.pop(field), theirs.pop(field)
            assert mine == theirs
    for mine, theirs in zip(batched, alone, strict=True):
        trajectory = [api.get(f"/v1/envs/{e}/trajectory").json()["steps"] for e in (mine, theirs)]
        strip = [[{k: v for k, v in s.items() if k not in ("env_id", "duration_ms", "created_at")} for s in t]
                 for t in trajectory]
        assert strip[0] == strip[1]
        assert api.get(f"/v1/envs/{mine}/state").json()["state"] == api.get(f"/v1/envs/{theirs}/state").json()["state"]


def test_a_step_that_loops_or_dies_fails_alone_in_its_group(api: httpx.Client) -> None:
    environment_id = _environment(api, FAILING_SOURCE, "Failing")
    envs = create_envs(api, environment_id, 4, profile={"call_timeout_s": 1.0})
    assert api.post("/v1/envs:step", json={"steps": [{"env_id": e, "action": {"name": "bump"}}
                                                     for e in envs]}).status_code == 200
    actions = ["spin", "die", "bump", "bump"]
    reply = api.post("/v1/envs:step", json={"steps": [{"env_id": e, "action": {"name": a}}
                                                      for e, a in zip(envs, actions, strict=True)]})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [r["status"] for r in results] == [200] * 4
    assert [r["result"]["status"] for r in results] == ["timeout", "crashed", "ok", "ok"]
    assert [r["result"]["observation"] for r in results[2:]] == ["2", "2"]
    again = api.post("/v1/envs:step", json={"steps": [{"env_id": e, "action": {"name": "bump"}} for e in envs]})
    assert [r["result"]["observation"] for r in again.json()["results"]] == ["2", "2", "3", "3"]
    for env_id, steps in zip(envs, (3, 3, 3, 3), strict=True):
        assert api.get(f"/v1/envs/{env_id}").json()["step"] == steps


def test_a_step_that_ended_frees_its_env_while_the_batch_runs(server: ApiServer) -> None:
    """A step of a batch that ends at once (a stale attempt) does not hold its env until
    the batch ends: a step sent alone to that env while another env of the batch naps is
    answered before the nap ends, and each env's steps are the ones it was sent. (A
    tenant with slots to spare: with one running call, the step alone would wait for the
    nap's slot instead.)"""
    key = server.new_tenant("batch-locks", {"max_running_calls": 4})
    nap_s = 6.0
    replies: list[httpx.Response] = []
    with server.client(key) as api:
        environment_id = _environment(api, FAILING_SOURCE, "Failing")
        napping, fenced, plain = create_envs(api, environment_id, 3)
        old = api.post(f"/v1/envs/{fenced}/attempts").json()["token"]
        api.post(f"/v1/envs/{fenced}/attempts")  # ``old`` is stale from now on

        def batch() -> None:
            with server.client(key, timeout=60) as client:
                replies.append(client.post("/v1/envs:step", json={"steps": [
                    {"env_id": napping, "action": {"name": "nap", "arguments": {"seconds": nap_s}}},
                    {"env_id": fenced, "action": {"name": "bump"}, "attempt": old},
                    {"env_id": plain, "action": {"name": "bump"}}]}))

        thread = threading.Thread(target=batch)
        started = time.monotonic()
        thread.start()
        time.sleep(1.5)  # the batch has sent its calls (its steps commit together, at the end)
        alone = api.post(f"/v1/envs/{fenced}/step", json={"name": "bump"})
        answered_s, batch_running = time.monotonic() - started, thread.is_alive()
        thread.join(timeout=60)
        assert alone.status_code == 200 and alone.json()["observation"] == "1", alone.text
        assert answered_s < nap_s and batch_running, answered_s  # not behind the napping env's call
        assert replies and replies[0].status_code == 200, replies
        results = replies[0].json()["results"]
        assert [(r["status"], (r.get("error") or {}).get("code")) for r in results] == [
            (200, None), (409, "stale_attempt"), (200, None)]
        assert results[0]["result"]["observation"] == "1" and results[2]["result"]["observation"] == "1"
        assert [api.get(f"/v1/envs/{e}").json()["step"] for e in (napping, fenced, plain)] == [1, 1, 1]


def test_episodes_ending_together_are_scored_as_alone(api: httpx.Client) -> None:
    environment_id = _environment(api, COUNTER_SOURCE, "Counter")
    checks = [{"check_item": "count is 2", "check_func": "def check_func(final_state):\n"
                                                        "    return final_state['count'] == 2\n"},
              {"check_item": "bumped", "check_func": "def check_func(final_state):\n"
                                                     "    return len(final_state['log']) > 0\n"}]
    scenario = api.post("/v1/scenarios", json={"environment_id": environment_id, "task": "Bump to two.",
                                               "init_config": {}, "checklist": [c["check_item"] for c in checks],
                                               "checklist_with_func": checks})
    assert scenario.status_code == 201, scenario.text
    body = {"scenario_id": scenario.json()["id"], "episode": {"max_steps": 1}}
    batched: list[str] = []
    alone: list[str] = []
    for ids in (batched, alone):
        for _ in range(4):
            created = api.post("/v1/envs", json=body)
            assert created.status_code == 201, created.text
            ids.append(created.json()["id"])
    amounts = [2, 1, 2, "x"]
    reply = api.post("/v1/envs:step", json={"steps": [{"env_id": e, "action": {"name": "bump", "arguments": {"by": a}}}
                                                      for e, a in zip(batched, amounts, strict=True)]})
    results = [r["result"] for r in reply.json()["results"]]
    assert [(r["truncated"], r["reward"]) for r in results] == [(True, 1.0), (True, 0.5), (True, 1.0), (True, 0.0)]
    for mine, env_id, amount in zip(results, alone, amounts, strict=True):
        theirs = api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": amount}}).json()
        timeless = [[{k: v for k, v in c.items() if k != "duration_ms"} for c in r["checks"]] for r in (mine, theirs)]
        assert (mine["reward"], mine["status"], timeless[0]) == (theirs["reward"], theirs["status"], timeless[1])
