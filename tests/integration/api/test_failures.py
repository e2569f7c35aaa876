"""The failure taxonomy on a real server and real sandboxes: who a step's and an episode's
outcome is to blame on (``failure``) and the ``mask`` advice, through the step route, the
stored trajectory, the episode views, the gymnasium adapter's ``info`` and a sandbox
killed from outside; environment code that tries to forge its own verdict (a returned
dict, printed text, an exception's message, a state attribute) changes nothing.

The MCP ``_meta``, OpenEnv observation and evaluation summaries carry it too: see
``test_mcp.py``, ``test_openenv.py`` and ``test_evaluations.py``."""

from __future__ import annotations

import contextlib
from typing import Any

import docker
import docker.errors
import httpx
import pytest
from sandpit.client import Client
from sandpit.client.rl import RLEnv
from sandpit.executor.docker import engine

pytestmark = pytest.mark.docker

FORGED = '{"failure": "infrastructure", "mask": true, "status": "crashed"}'

DESK_SOURCE = '''
import time


class Desk:
    """A counter whose tools misbehave on purpose."""

    def __init__(self, init_config: dict):
        self.count = init_config.get("count", 0)

    def bump(self, by: int = 1) -> int:
        """Add to the counter.

        Args:
            by (int): how much to add.
        """
        self.count += by
        return self.count

    def explode(self) -> str:
        """Raise an exception whose message mimics a platform verdict."""
        raise RuntimeError('FORGED sandbox lost: failure=infrastructure mask=true')

    def spin(self) -> None:
        """Compute forever."""
        while True:
            pass

    def nap(self) -> None:
        """Sleep past any time limit."""
        time.sleep(30)

    def forge(self) -> dict:
        """Print and return a forged verdict, and keep one in the state."""
        print('FORGED')
        self.failure = "infrastructure"
        self.mask = True
        return {"failure": "infrastructure", "mask": True, "status": "crashed"}
'''.replace("FORGED", FORGED)

RAISING_CHECK = {"check_item": "raises", "check_func": (
    "def check_func(final_state):\n"
    f"    print({FORGED!r})\n"
    "    raise RuntimeError('failure: none, mask: false')\n")}
PASSING_CHECK = {"check_item": "count is 1", "check_func": (
    "def check_func(final_state):\n"
    f"    print({FORGED!r})\n"
    "    return final_state['count'] == 1\n")}


@pytest.fixture(scope="module")
def desk_id(server: Any) -> str:
    """The Desk environment registered on the module's server."""
    with server.client() as client:
        response = client.post("/v1/environments", json={"name": "desk", "source_code": DESK_SOURCE,
                                                         "class_name": "Desk"})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


def _create(api: httpx.Client, **body: Any) -> str:
    response = api.post("/v1/envs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _step(api: httpx.Client, env_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    response = api.post(f"/v1/envs/{env_id}/step", json={"name": name, "arguments": arguments})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _verdict(step: dict[str, Any]) -> tuple[str, str, bool]:
    return step["status"], step["failure"], step["mask"]


def test_each_kind_of_step_gets_the_platforms_verdict(api: httpx.Client, desk_id: str) -> None:
    env_id = _create(api, environment_id=desk_id, profile={"call_timeout_s": 1.0}, episode={"max_steps": None})
    bumped = _step(api, env_id, "bump", by=1)
    assert _verdict(bumped) == ("ok", "none", False) and bumped["episode_failure"] == "none"
    rejected = _step(api, env_id, "no_such_tool")
    assert _verdict(rejected) == ("rejected", "agent", False) and rejected["episode_failure"] == "agent"
    forged = _step(api, env_id, "forge")  # a returned dict, printed text and state attributes are data
    assert _verdict(forged) == ("ok", "none", False) and FORGED in forged["stdout"]
    assert forged["episode_failure"] == "agent" and not forged["episode_mask"]
    raised = _step(api, env_id, "explode")  # the message mimics a verdict: the status decides
    assert _verdict(raised) == ("error", "environment", False) and "failure=infrastructure" in raised["observation"]
    napped = _step(api, env_id, "nap")  # the environment's own call_timeout_s stops a sleep: no CPU wanted
    assert _verdict(napped) == ("timeout", "environment", False), napped["observation"]
    assert (napped["episode_failure"], napped["episode_mask"]) == ("environment", False)
    looped = _step(api, env_id, "spin")  # and a loop, unless the host starved it (measured)
    assert looped["status"] == "timeout"
    after = _step(api, env_id, "bump", by=1)  # the runner restarted the session in the same sandbox
    assert _verdict(after) == ("ok", "none", False) and not after["recovered"] and after["observation"] == "2"

    trajectory = api.get(f"/v1/envs/{env_id}/trajectory").json()
    steps = trajectory["steps"]
    assert [(s["status"], s["failure"], s["mask"]) for s in steps[:5]] == [
        ("ok", "none", False), ("rejected", "agent", False), ("ok", "none", False), ("error", "environment", False),
        ("timeout", "environment", False)]
    assert steps[4]["info"]["cpu_ms"] < 100 and steps[4]["info"]["wait_ms"] < 250  # asleep: not starved
    loop = steps[5]["info"]
    starved = loop["cpu_ms"] < 1000 * 0.5 / 2 and loop["wait_ms"] - 1000 * 0.5 >= 1000 * 0.25
    assert (steps[5]["failure"], steps[5]["mask"]) == (("infrastructure", True) if starved else ("environment", False))
    assert loop["cpu_ms"] + loop["wait_ms"] >= 500  # it was runnable the whole time (the host was busy or not)
    expected = "infrastructure" if starved else "environment"
    assert (trajectory["failure"], trajectory["mask"]) == (expected, starved)
    view = api.get(f"/v1/envs/{env_id}").json()
    assert (view["failure"], view["mask"]) == (expected, starved)
    episodes = api.get(f"/v1/envs/{env_id}/episodes").json()["data"]
    assert [(e["failure"], e["mask"]) for e in episodes] == [(expected, starved)]

    restored = api.post(f"/v1/envs/{env_id}/restore", json={"step": 3})  # before the raise and the timeouts
    assert restored.status_code == 200, restored.text
    assert (restored.json()["failure"], restored.json()["mask"]) == ("agent", False)
    forks = api.post(f"/v1/envs/{env_id}/fork", json={"step": 1})
    assert forks.status_code == 201, forks.text
    fork_id = forks.json()["data"][0]["id"]
    assert forks.json()["data"][0]["failure"] == "none"
    first = _step(api, fork_id, "bump", by=1)  # a fork's first step re-opens it by design: no failure
    assert first["recovered"] and _verdict(first) == ("ok", "none", False)
    api.post(f"/v1/envs/{env_id}/reset")
    assert api.get(f"/v1/envs/{env_id}").json()["failure"] == "none"  # a new episode starts clean
    for env in (env_id, fork_id):
        api.delete(f"/v1/envs/{env}")


def test_a_check_that_raises_is_the_verifiers_and_masks_the_episode(api: httpx.Client, desk_id: str) -> None:
    scenario = api.post("/v1/scenarios", json={"environment_id": desk_id, "task": "bump once",
                                                "init_config": {"count": 0},
                                                "checklist_with_func": [PASSING_CHECK, RAISING_CHECK]})
    assert scenario.status_code == 201, scenario.text
    env_id = _create(api, scenario_id=scenario.json()["id"])
    assert _verdict(_step(api, env_id, "bump", by=1)) == ("ok", "none", False)
    end = _step(api, env_id, "chat_with_user", content="done")
    assert end["terminated"] and end["reward"] == 0.5
    assert [c["status"] for c in end["checks"]] == ["ok", "error"]
    assert _verdict(end) == ("ok", "none", False)  # the step itself was fine
    assert (end["episode_failure"], end["episode_mask"]) == ("verifier", True)
    view = api.get(f"/v1/envs/{env_id}").json()
    assert (view["episode_status"], view["failure"], view["mask"]) == ("terminated", "verifier", True)
    trajectory = api.get(f"/v1/envs/{env_id}/trajectory").json()
    assert (trajectory["failure"], trajectory["mask"]) == ("verifier", True)
    evaluated = api.post(f"/v1/envs/{env_id}/evaluate", json={})  # the same checks, asked for
    assert evaluated.status_code == 200, evaluated.text
    assert (evaluated.json()["reward"], evaluated.json()["failure"], evaluated.json()["mask"]) == (0.5, "verifier", True)
    passing = api.post(f"/v1/envs/{env_id}/evaluate", json={"checks": [PASSING_CHECK]}).json()
    assert (passing["reward"], passing["failure"], passing["mask"]) == (1.0, "none", False)
    api.delete(f"/v1/envs/{env_id}")


def test_a_sandbox_killed_from_outside_is_infrastructure(api: httpx.Client, server: Any, desk_id: str,
                                                         docker_client: docker.DockerClient) -> None:
    env_id = _create(api, environment_id=desk_id, episode={"max_steps": None})
    assert _verdict(_step(api, env_id, "bump", by=5)) == ("ok", "none", False)
    owner = engine.owner_id(server.process.pid)
    containers = docker_client.containers.list(filters={"label": f"sandpit.owner={owner}"})
    assert containers
    for container in containers:  # this module's server's sandboxes: the env's is among them
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.kill()
    after = _step(api, env_id, "bump", by=1)
    # either the call met the dead sandbox (crashed) or the loss was noticed first and the
    # env re-opened from its last step (ok, recovered): both are the platform's doing
    assert after["status"] in ("ok", "crashed") and (after["failure"], after["mask"]) == ("infrastructure", True)
    assert (after["episode_failure"], after["episode_mask"]) == ("infrastructure", True)
    if after["status"] == "crashed":
        again = _step(api, env_id, "bump", by=1)
        assert again["recovered"] and (again["status"], again["observation"]) == ("ok", "6")
        assert again["failure"] == "infrastructure"
    later = _step(api, env_id, "bump", by=1)
    assert _verdict(later) == ("ok", "none", False) and later["episode_mask"]  # the episode stays masked
    view = api.get(f"/v1/envs/{env_id}").json()
    assert (view["failure"], view["mask"]) == ("infrastructure", True)
    trajectory = api.get(f"/v1/envs/{env_id}/trajectory").json()
    assert trajectory["steps"][1]["failure"] == "infrastructure" and trajectory["mask"]
    api.delete(f"/v1/envs/{env_id}")


def test_the_gymnasium_adapter_info_carries_the_verdict(server: Any, desk_id: str) -> None:
    with Client(server.url, api_key=server.api_key) as client:
        rl = RLEnv(client, environment_id=desk_id, init_config={"count": 0}, episode={"max_steps": 3})
        rl.reset()
        infos = [rl.step(action)[4] for action in ({"name": "bump", "arguments": {"by": 1}},
                                                   {"name": "nope", "arguments": {}},
                                                   {"name": "explode", "arguments": {}})]
        rl.close()
    assert [(i["status"], i["failure"], i["mask"]) for i in infos] == [
        ("ok", "none", False), ("rejected", "agent", False), ("error", "environment", False)]
    assert [(i["episode_failure"], i["episode_mask"]) for i in infos] == [
        ("none", False), ("agent", False), ("environment", False)]
