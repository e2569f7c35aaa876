"""The verifiers adapter (`sandpit.client.verifiers_env`) against the real `verifiers`
package, a real `sandpit serve` (real SQLite, real sandboxes) and the real `openai` client
talking to the scripted OpenAI-compatible server (`fake_openai`, loopback): verifiers' own
`evaluate` runs rollouts whose reward equals the same episode through the plain client;
hostile model output (unknown tools, invalid JSON arguments, garbage), a model endpoint
failing mid-rollout, Sandpit failing mid-rollout and wrong keys give clear errors and
leave no env (the session's `leak_check` sees that no container is left either).

Scenarios run on the `Counter` environment with two checks (`count == 5`, record `a`
stored): both -> 1.0, one -> 0.5, none -> 0.0.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fake_openai import Rule, ScriptedLLM, ToolCallScript
from markdown_docs import section_blocks
from openai import AsyncOpenAI
from sandpit.client import AsyncClient, Client, NotFound, Unauthorized

if TYPE_CHECKING:
    import verifiers as vf
    from sandpit.client.verifiers_env import NOT_RUN, STATE_KEY, SandpitRolloutError, SandpitToolEnv

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]

CHECKS = [
    {"check_item": "count is 5", "check_func": "def check_func(final_state):\n    return final_state['count'] == 5\n"},
    {"check_item": "record a stored",
     "check_func": "def check_func(final_state):\n    return 'a' in final_state['records']\n"},
]
BUMP5 = ToolCallScript(name="bump", arguments={"by": 5})
STORE_A = ToolCallScript(name="set_record", arguments={"key": "a", "value": "x"})
TOOL_NAMES = {"bump", "set_record", "get_record", "fail", "spin", "weird", "chat_with_user"}


@pytest.fixture(scope="module", autouse=True)
def _verifiers() -> None:
    """`verifiers` and the verifiers door, imported when this module's first test runs
    rather than when it is collected: its classic API pulls in the `anthropic` and `openai`
    SDKs' types, about 5 s of CPU that every pytest process collecting the suite would pay
    (each xdist worker of scripts/test, every local run)."""
    global vf, NOT_RUN, STATE_KEY, SandpitRolloutError, SandpitToolEnv
    import verifiers as vf
    from sandpit.client.verifiers_env import NOT_RUN, STATE_KEY, SandpitRolloutError, SandpitToolEnv


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[Client]:
    with Client(server.url, api_key=server.api_key, timeout=120) as c:
        yield c


def _scenario(client: Client, environment_id: str, tag: str) -> str:
    return client.scenarios.create({"environment_id": environment_id, "task": f"{tag}: make the counter 5 and "
                                    "store record a", "init_config": {"count": 0}, "checklist_with_func": CHECKS}).id


def _evaluate(env: SandpitToolEnv, llm: ScriptedLLM, **kwargs: Any) -> list[dict[str, Any]]:
    """verifiers' own `evaluate` with the real openai client on the scripted server."""
    async def run() -> Any:
        openai = AsyncOpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0)
        try:
            return await env.evaluate(client=vf.OpenAIChatCompletionsClient(openai), model="scripted",
                                      state_columns=[STATE_KEY], on_progress=[], **kwargs)
        finally:
            await openai.close()
    return list(asyncio.run(run())["outputs"])


def _envs_left(client: Client) -> list[str]:
    return [e.id for e in client.envs.list(limit=200).data if e.status != "closed"]


def test_a_rollout_through_verifiers_earns_what_the_plain_client_earns(server: Any, client: Client,
                                                                       counter_env_id: str) -> None:
    full, half = _scenario(client, counter_env_id, "VF-FULL"), _scenario(client, counter_env_id, "VF-HALF")
    rules = [Rule(contains=["VF-FULL"], turn=0, tool_calls=[BUMP5]),
             Rule(contains=["VF-FULL"], turn=1, tool_calls=[STORE_A]),
             Rule(contains=["VF-FULL"], turn=2, content="Task Completed."),
             Rule(contains=["VF-HALF"], turn=0, tool_calls=[BUMP5]),
             Rule(contains=["VF-HALF"], turn=1, content="Task Completed.")]
    before = set(_envs_left(client))
    with ScriptedLLM(rules) as llm:
        env = SandpitToolEnv([full, half], base_url=server.url, api_key=server.api_key)
        outputs = sorted(_evaluate(env, llm), key=lambda o: o["info"]["scenario_id"] != full)
    first = next(r for r in llm.chat_requests() if "VF-FULL" in str(r["messages"]))  # rollouts run concurrently
    assert {t["function"]["name"] for t in first["tools"]} == TOOL_NAMES  # the env's own schemas
    assert first["messages"][-1] == {"role": "user", "content": "VF-FULL: make the counter 5 and store record a"}
    assert [o["reward"] for o in outputs] == [1.0, 0.5] and all(o["error"] is None for o in outputs)
    record = outputs[0][STATE_KEY]
    assert record["ended"] and record["scenario_id"] == full and [c["passed"] for c in record["checks"]] == [True, True]
    assert [(s["step"], s["status"], s["episode"]) for s in record["steps"]] == [(1, "ok", 1), (2, "ok", 1),
                                                                                (3, "ok", 1)]
    assert record["env_id"] == record["steps"][0]["env_id"]
    tool_replies = [m for m in outputs[0]["completion"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_replies][0] == "5"  # the tool ran in the sandbox
    assert outputs[0]["stop_condition"] == "has_final_env_response"
    # the same episodes through the plain client
    for sid, actions, reward in ((full, [BUMP5, STORE_A], 1.0), (half, [BUMP5], 0.5)):
        with client.envs.create(scenario_id=sid) as plain:
            for call in actions:
                plain.step(call.name, **call.arguments)  # type: ignore[arg-type]
            assert plain.step(text="Task Completed.").reward == reward
    assert set(_envs_left(client)) == before  # every rollout's env was deleted


def test_hostile_tool_calls_are_rejected_steps_and_the_episode_goes_on(server: Any, client: Client,
                                                                      counter_env_id: str) -> None:
    sid = _scenario(client, counter_env_id, "VF-HOSTILE")
    garbage = [ToolCallScript(name="nope", arguments={}), ToolCallScript(name="bump", arguments="{by: 1"),
               ToolCallScript(name="bump", arguments="[1]"), ToolCallScript(name="__class__", arguments={}),
               ToolCallScript(name="bump", arguments='"' + "x" * 300_000 + '"'),
               ToolCallScript(name="", arguments="\x00\ud7ff")]
    # the 300 kB arguments are over the server's 256 KiB (413) and the 4.2 M characters of text over
    # its request limit (422): both are sent as a stand-in call, a rejected step
    rules = [Rule(contains=["VF-HOSTILE"], turn=0, tool_calls=garbage),
             Rule(contains=["VF-HOSTILE"], turn=1, content="   "),
             Rule(contains=["VF-HOSTILE"], turn=2, content="x" * 4_200_000),
             Rule(contains=["VF-HOSTILE"], turn=3, tool_calls=[BUMP5, ToolCallScript(
                 name="chat_with_user", arguments={"content": "done"}), STORE_A])]
    with ScriptedLLM(rules) as llm:
        env = SandpitToolEnv(sid, base_url=server.url, api_key=server.api_key)
        [output] = _evaluate(env, llm)
    record = output[STATE_KEY]
    statuses = [s["status"] for s in record["steps"]]
    assert statuses == ["rejected"] * 8 + ["ok", "ok"], record["steps"]
    replies = [m for m in output["completion"] if m["role"] in ("tool", "user")]
    assert all(m["content"].startswith("Error: ") for m in replies[:8]), replies[:8]
    # the termination action ends the episode; the call after it in the same turn is not run
    assert replies[-1]["content"] == NOT_RUN and record["ended"] and output["reward"] == 0.5
    assert output["error"] is None and len(llm.chat_requests()) == 4


def test_a_model_endpoint_failing_mid_rollout_stops_it_and_deletes_the_env(server: Any, client: Client,
                                                                           counter_env_id: str) -> None:
    sid = _scenario(client, counter_env_id, "VF-MODEL-DOWN")
    rules = [Rule(contains=["VF-MODEL-DOWN"], turn=0, tool_calls=[BUMP5]),
             Rule(contains=["VF-MODEL-DOWN"], turn=1, errors=[500], content="never reached")]
    before = set(_envs_left(client))
    with ScriptedLLM(rules) as llm:
        env = SandpitToolEnv(sid, base_url=server.url, api_key=server.api_key)
        [output] = _evaluate(env, llm)
    assert output["stop_condition"] == "has_error" and output["error"] is not None
    assert output["reward"] == 0.0 and not output[STATE_KEY]["ended"]
    assert [s["status"] for s in output[STATE_KEY]["steps"]] == ["ok"]
    assert set(_envs_left(client)) == before


def test_sandpit_failing_mid_rollout_is_a_recorded_infra_error(server: Any, client: Client,
                                                               counter_env_id: str) -> None:
    sid = _scenario(client, counter_env_id, "VF-ENV-GONE")
    rules = [Rule(contains=["VF-ENV-GONE"], turn=0, tool_calls=[BUMP5]),
             Rule(contains=["VF-ENV-GONE"], turn=1, delay_s=1.5, tool_calls=[STORE_A])]
    errors: list[BaseException] = []

    async def run(llm: ScriptedLLM, env: SandpitToolEnv) -> Any:
        async def delete_it_mid_rollout() -> None:
            async with AsyncClient(server.url, server.api_key) as other:
                while True:  # the rollout's env, once its first step is recorded
                    envs = [e for e in (await other.envs.list(limit=200)).data if e.scenario_id == sid and e.step >= 1]
                    if envs:
                        await other.envs.delete(envs[0].id)
                        return
                    await asyncio.sleep(0.05)

        deleting = asyncio.ensure_future(delete_it_mid_rollout())
        openai = AsyncOpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0)
        try:
            return await env.evaluate(client=vf.OpenAIChatCompletionsClient(openai), model="scripted",
                                      state_columns=[STATE_KEY], on_progress=[])
        finally:
            await asyncio.wait_for(deleting, 30)
            await openai.close()

    with ScriptedLLM(rules) as llm:
        env = SandpitToolEnv(sid, base_url=server.url, api_key=server.api_key)
        original = env.env_response

        async def recording(messages: Any, state: Any, **kwargs: Any) -> Any:
            try:
                return await original(messages, state, **kwargs)
            except SandpitRolloutError as exc:
                errors.append(exc)
                raise
        env.env_response = recording
        [output] = asyncio.run(run(llm, env))["outputs"]
    assert output["stop_condition"] == "has_error" and output["reward"] == 0.0
    assert len(errors) == 1 and isinstance(errors[0].__cause__, NotFound) and isinstance(errors[0], vf.InfraError)
    assert "failed" in str(errors[0]) and output[STATE_KEY]["env_id"] in str(errors[0])


def test_wrong_key_and_unknown_scenarios_fail_clearly_and_start_nothing(server: Any, client: Client,
                                                                       counter_env_id: str) -> None:
    sid = _scenario(client, counter_env_id, "VF-KEY")
    with pytest.raises(Unauthorized):
        SandpitToolEnv(sid, base_url=server.url, api_key="sk-wrong")
    with pytest.raises(NotFound, match="scn_nope"):
        SandpitToolEnv([sid, "scn_nope"], base_url=server.url, api_key=server.api_key)
    other_tenant = server.new_tenant("vf-other")
    with pytest.raises(NotFound):  # another tenant's scenario is unknown, not forbidden
        SandpitToolEnv(sid, base_url=server.url, api_key=other_tenant)
    # a key revoked (here: replaced) after the dataset was read: each rollout records the error
    env = SandpitToolEnv(sid, base_url=server.url, api_key=server.api_key)
    env.api_key = "sk-wrong"
    before = set(_envs_left(client))
    with ScriptedLLM([Rule(contains=["VF-KEY"], content="never asked")]) as llm:
        [output] = _evaluate(env, llm)
        assert llm.chat_requests() == []
    assert output["stop_condition"] == "has_error" and output["reward"] == 0.0
    assert "could not start an env" in str(output["error"])
    assert set(_envs_left(client)) == before


def test_the_readme_example_runs_as_written(server: Any, client: Client, counter_source: str, tmp_path: Path) -> None:
    """The README's verifiers block, saved under its file name and run with this test run's
    Python beside a `counter.py` (the quickstart leaves one there), the model scripted."""
    blocks = [b for b in section_blocks((ROOT / "README.md").read_text(), "RL frameworks")
              if b.language == "python" and b.code.startswith("# verifiers_eval.py")]
    assert len(blocks) == 1
    script = tmp_path / "verifiers_eval.py"
    script.write_text(blocks[0].code)
    (tmp_path / "counter.py").write_text(counter_source)
    before = set(_envs_left(client))
    rules = [Rule(contains=["Make the counter 5, then say so."], turn=0, tool_calls=[BUMP5]),
             Rule(contains=["Make the counter 5, then say so."], turn=1, content="The counter is 5.")]
    with ScriptedLLM(rules) as llm:
        run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                             env={**os.environ, "SANDPIT_URL": server.url, "SANDPIT_API_KEY": server.api_key,
                                  "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "sk-test", "MODEL": "scripted"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "reward 1.0 after 2 steps", run.stdout
    assert set(_envs_left(client)) == before


def test_a_conversational_episode_starts_from_the_simulated_users_message(server: Any, client: Client,
                                                                          counter_env_id: str) -> None:
    sid = client.scenarios.create({"environment_id": counter_env_id, "task": "VF-CONV: bump the counter by 5",
                                   "init_config": {"count": 0}, "checklist_with_func": CHECKS}).id
    rules = [  # the simulated user (called by the server) and the agent (called by verifiers), one server
        Rule(model="user-sim", contains=["VF-CONV"], turn=0, content="# Thought:\nstart\n# Reply:\nPlease bump it by 5."),
        Rule(model="user-sim", contains=["VF-CONV"], last_contains=["done"], content="###STOP###"),
        Rule(model="agent", contains=["Please bump it by 5."], turn=0, tool_calls=[BUMP5]),
        Rule(model="agent", contains=["Please bump it by 5."], turn=1, content="It is done: the counter is 5.")]
    with ScriptedLLM(rules) as llm:
        episode = {"mode": "conversational", "user": {"model": "user-sim", "base_url": llm.base_url, "api_key": "sk-u"}}
        env = SandpitToolEnv(sid, base_url=server.url, api_key=server.api_key, episode=episode)

        async def run() -> Any:
            openai = AsyncOpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0)
            try:
                return await env.evaluate(client=vf.OpenAIChatCompletionsClient(openai), model="agent",
                                          state_columns=[STATE_KEY], on_progress=[])
            finally:
                await openai.close()
        [output] = asyncio.run(run())["outputs"]
        agent = [r for r in llm.chat_requests() if r["model"] == "agent"]
    assert agent[0]["messages"] == [{"role": "user", "content": "Please bump it by 5."}]  # not the task
    assert not any("VF-CONV" in str(r["messages"]) for r in agent)
    assert output["completion"][-1] == {"role": "user", "content": "###STOP###"}
    assert output["reward"] == 0.5 and output[STATE_KEY]["ended"] and output["error"] is None
