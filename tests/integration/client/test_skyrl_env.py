"""The SkyRL text env (`sandpit.client.skyrl_env`) through the real `skyrl_gym` package, against a
real `sandpit serve` (real SQLite, real sandboxes): an episode driven as SkyRL's generator
drives it (`skyrl_gym.make`, `init`, `step` until done, `close`) with scripted model outputs
reaches the scenario's reward and equals the same outputs sent through the plain client;
hostile outputs, settings and keys give clear errors and leave no env behind; the README's
SkyRL example runs as written.

The scenario runs on the `Counter` environment with two checks (`count == 5`, record `a`
stored): both pass -> 1.0, one -> 0.5, none -> 0.0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import skyrl_gym
from api_server import ApiServer
from markdown_docs import section_blocks
from sandpit.client import Client, InvalidRequest, NotFound, Unauthorized
from sandpit.client.skyrl_env import SKYRL_ID
from waiting import wait_until

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[3]
CHECKS = [
    {"check_item": "count is 5", "check_func": "def check_func(final_state):\n    return final_state['count'] == 5\n"},
    {"check_item": "record a stored",
     "check_func": "def check_func(final_state):\n    return 'a' in final_state['records']\n"},
]
OUTPUTS = [
    '<think>First the counter.</think>\n<tool_call>\n{"name": "bump", "arguments": {"by": 5}}\n</tool_call>',
    "I will <tool_call>{not json</tool_call>",  # a malformed call: a rejected step, the episode goes on
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    '<tool_call>\n{"name": "set_record", "arguments": {"key": "a", "value": "x"}}\n</tool_call>',
    "Done: the counter is 5 and record a is stored.",
]
"""What a model might write over one episode; the last (plain text) ends it."""
TENANT = "skyrl"


@pytest.fixture(scope="module")
def key(server: ApiServer) -> str:
    """A tenant of this module alone, so its env count is this module's."""
    return server.new_tenant(TENANT)


@pytest.fixture(scope="module")
def client(server: ApiServer, key: str) -> Iterator[Client]:
    with Client(server.url, api_key=key, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def scenario_id(client: Client, counter_source: str) -> str:
    environment = client.environments.create(counter_source, "Counter", introduction="A counter and a record store.")
    return client.scenarios.create({"environment_id": environment.id, "init_config": {"count": 0},
                                    "task": "Make the counter 5 and store record a.",
                                    "checklist_with_func": CHECKS}).id


def _live_envs(client: Client) -> int:
    return client.envs.list(limit=1).count


def _generator_episode(env: Any, prompt: list[dict[str, str]], outputs: list[str]) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]]]:
    """What SkyRL's generator does with an env: init, then step until done, then close.
    Returns the chat it ends with and each step's output."""
    chat, _ = env.init(prompt)
    steps = []
    for output in outputs:
        out = env.step(output)
        steps.append(out)
        chat += [{"role": "assistant", "content": output}, *out["observations"]]
        if out["done"]:
            break
    env.close()
    return chat, steps


def test_an_episode_through_skyrl_gym_equals_the_plain_client(server: ApiServer, key: str, client: Client,
                                                              scenario_id: str) -> None:
    before = _live_envs(client)
    env = skyrl_gym.make(SKYRL_ID, env_config={"base_url": server.url, "api_key": key},
                         extras={"scenario_id": scenario_id, "max_turns": 10, "data_source": "sandpit"})
    chat, steps = _generator_episode(env, [{"role": "system", "content": "You are careful."}], OUTPUTS)
    assert chat[0]["role"] == "system" and chat[0]["content"].startswith("You are careful.\n\n# Environment")
    assert "A counter and a record store." in chat[0]["content"] and '"name": "set_record"' in chat[0]["content"]
    assert chat[1] == {"role": "user", "content": "Make the counter 5 and store record a."}
    assert [s["metadata"]["status"] for s in steps] == ["ok", "rejected", "rejected", "ok", "ok"]
    assert [s["reward"] for s in steps] == [0.0, 0.0, 0.0, 0.0, 1.0] and [s["done"] for s in steps] == [False] * 4 + [
        True]
    assert steps[0]["observations"] == [{"role": "tool", "content": "5"}]
    assert steps[1]["observations"][0]["role"] == "user" and steps[1]["observations"][0]["content"].startswith("Error")
    assert steps[-1]["observations"] == [] and steps[-1]["metadata"]["observation"] == "Task finished"
    env_id = steps[0]["metadata"]["env_id"]
    assert [(s["metadata"]["env_id"], s["metadata"]["episode"], s["metadata"]["step"]) for s in steps] == [
        (env_id, 1, n) for n in range(1, 6)]
    assert [c["passed"] for c in steps[-1]["metadata"]["checks"]] == [True, True]
    assert env.get_metrics() == {"steps": 5, "rejected_steps": 2, "truncated": 0, "reward": 1.0}
    assert _live_envs(client) == before  # close() deleted it

    with client.envs.create(scenario_id=scenario_id, episode={"max_steps": 10}) as plain:
        results = [plain.step(text=output) for output in OUTPUTS]
    assert [(r.status, r.observation, r.reward, r.terminated, r.truncated) for r in results] == [
        (s["metadata"]["status"], s["metadata"]["observation"], s["reward"], s["metadata"]["terminated"],
         s["metadata"]["truncated"]) for s in steps]


def test_max_turns_truncates_and_scores(server: ApiServer, key: str, client: Client, scenario_id: str) -> None:
    env = skyrl_gym.make(SKYRL_ID, env_config={"base_url": server.url, "api_key": key, "observations": "user"},
                         extras={"scenario_id": scenario_id, "max_turns": 2})
    _, steps = _generator_episode(env, [], OUTPUTS[:1] + OUTPUTS[3:])
    assert [s["done"] for s in steps] == [False, True] and steps[-1]["metadata"]["truncated"]
    assert steps[0]["observations"] == [{"role": "user", "content": "5"}]
    assert steps[-1]["reward"] == 1.0  # a truncated episode is scored (the server's default)


def _sandboxes(docker_client: docker.DockerClient, tenant: str) -> int:
    """Sandbox containers of `tenant` (labelled by the executor), running or not."""
    return len(docker_client.containers.list(all=True, filters={"label": f"sandpit.tenant={tenant}"}))


def test_hostile_outputs_settings_and_keys(server: ApiServer, key: str, client: Client, scenario_id: str,
                                           docker_client: docker.DockerClient) -> None:
    before = _live_envs(client)
    config = {"base_url": server.url, "api_key": key}
    env = skyrl_gym.make(SKYRL_ID, env_config=config, extras={"scenario_id": scenario_id})
    env.init([])
    hostile = ["", "   ", "<think>never closed", "<tool_call>", '<tool_call>{"name": "__class__", "arguments": {}}'
               "</tool_call>", '<tool_call>{"name": "bump", "arguments": [1]}</tool_call>', "\x00\ud800 garbage",
               "<tool_call>" + "x" * 300_000 + "</tool_call>",  # over the server's 256 KiB per action
               "y" * (5 * 1024 * 1024)]  # over the request limit
    for number, output in enumerate(hostile, start=1):
        out = env.step(output)
        meta = out["metadata"]
        assert (meta["status"], meta["step"], out["done"]) == ("rejected", number, False), (output[:40], meta)
        assert out["observations"][0]["content"].startswith("Error")
    assert env.step('<tool_call>{"name": "fail", "arguments": {"message": "boom"}}</tool_call>')["metadata"][
        "status"] == "error"
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.step("Done.")
    with pytest.raises(RuntimeError, match="closed"):
        env.init([])

    wrong = skyrl_gym.make(SKYRL_ID, env_config={"base_url": server.url, "api_key": "sk-wrong"},
                           extras={"scenario_id": scenario_id})
    with pytest.raises(Unauthorized):
        wrong.init([])
    wrong.close()
    other = server.new_tenant("skyrl-other")  # another tenant's key does not see the scenario
    theirs = skyrl_gym.make(SKYRL_ID, env_config={"base_url": server.url, "api_key": other},
                            extras={"scenario_id": scenario_id})
    with pytest.raises(NotFound):
        theirs.init([])
    theirs.close()
    with pytest.raises(NotFound):
        unknown = skyrl_gym.make(SKYRL_ID, env_config=config, extras={"scenario_id": "scn_nope"})
        try:
            unknown.init([])
        finally:
            unknown.close()
    for episode in ({"max_steps": 0}, {"mode": "sideways"}, {"no_such_option": 1}):  # the server's 422
        refused = skyrl_gym.make(SKYRL_ID, env_config=config, extras={"scenario_id": scenario_id, "episode": episode})
        with pytest.raises(InvalidRequest):
            refused.init([])
        refused.close()
    with pytest.raises(ValueError, match="dataset row"):
        skyrl_gym.make(SKYRL_ID, env_config={"base_url": server.url},
                       extras={"scenario_id": scenario_id, "api_key": key})
    assert _live_envs(client) == before  # nothing left on the server
    with Client(server.url, api_key=other) as theirs_client:
        assert _live_envs(theirs_client) == 0
    # a refused init started no sandbox; the closed envs' sandboxes are the warm pool's (at
    # most SANDPIT_EXECUTOR_POOL_SIZE kept, the rest reaped when idle, all removed at stop:
    # the conftest's leak check)
    assert _sandboxes(docker_client, "skyrl-other") == 0


def test_the_readme_example_runs_as_written(server: ApiServer, key: str, client: Client, counter_source: str,
                                           tmp_path: Path) -> None:
    """The README's SkyRL block, saved under its file name and run with this test run's Python
    beside a `counter.py` (the quickstart leaves one there)."""
    blocks = [b for b in section_blocks((ROOT / "README.md").read_text(), "RL frameworks")
              if b.language == "python" and b.code.startswith("# skyrl_episode.py")]
    assert len(blocks) == 1
    script = tmp_path / "skyrl_episode.py"
    script.write_text(blocks[0].code)
    (tmp_path / "counter.py").write_text(counter_source)
    before = _live_envs(client)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "SANDPIT_URL": server.url, "SANDPIT_API_KEY": key})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "reward 1.0 after 3 steps", run.stdout
    wait_until(lambda: _live_envs(client) == before, "the example's env deleted", timeout_s=30)


def test_the_documented_loop_runs_as_written(server: ApiServer, key: str, client: Client, scenario_id: str,
                                             tmp_path: Path) -> None:
    """docs/rl.md's SkyRL loop (four trajectories on four threads), run as written beside the
    `scenarios.json` the page's first example writes."""
    blocks = [b for b in section_blocks((ROOT / "docs" / "rl.md").read_text(), "4. SkyRL") if b.language == "python"]
    assert len(blocks) == 1 and blocks[0].code.startswith("# skyrl_loop.py")
    (tmp_path / "skyrl_loop.py").write_text(blocks[0].code)
    (tmp_path / "scenarios.json").write_text(json.dumps([scenario_id, scenario_id]))
    before = _live_envs(client)
    run = subprocess.run([sys.executable, "skyrl_loop.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SANDPIT_URL": server.url, "SANDPIT_API_KEY": key})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "[1.0, 1.0, 1.0, 1.0]", run.stdout
    wait_until(lambda: _live_envs(client) == before, "the loop's envs deleted", timeout_s=30)
