"""The rollout agent loop (``sandpit.api.evaluations.rollout``) with the real ``openai`` client against
the scripted OpenAI-compatible server on 127.0.0.1, and a fake ``execute`` (no sandbox)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_openai import Rule, ScriptedLLM, ToolCallScript
from sandpit.api.evaluations.rollout import (
    ModelClient,
    ModelError,
    ModelSettings,
    StepRecord,
    initial_messages,
    run_episode,
    system_prompt,
)

TOOLS = [{"type": "function", "function": {"name": "bump", "description": "Add to the counter.",
                                           "parameters": {"type": "object", "properties": {"by": {"type": "integer"}}}}}]


class FakeEnv:
    """Records executed calls; ``bump`` adds to a counter, other names are refused, and
    arguments that are not a JSON object are refused as the API would."""

    def __init__(self) -> None:
        self.count = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.raw: list[Any] = []

    def execute(self, number: int, name: str, raw: Any) -> StepRecord:
        self.raw.append(raw)
        try:
            arguments = json.loads(raw or "{}") if isinstance(raw, str) else raw
        except ValueError:
            return StepRecord(number, {"name": name, "arguments": raw}, "Error: Failed to parse response to action",
                              "rejected")
        self.calls.append((name, arguments))
        if name != "bump":
            return StepRecord(number, {"name": name, "arguments": arguments}, f"Error: unknown tool {name!r}", "rejected")
        self.count += arguments.get("by", 1)
        return StepRecord(number, {"name": name, "arguments": arguments}, str(self.count), "ok", 1.0)


def client(llm: ScriptedLLM, **overrides: Any) -> ModelClient:
    settings = {"base_url": llm.base_url, "model": "m", "retries": 2, "retry_initial_s": 0.001, "retry_max_s": 0.05,
                "request_timeout_s": 10.0, **overrides}
    return ModelClient(ModelSettings(**settings), "sk-unit-secret")


def run(llm: ScriptedLLM, task: str, env: FakeEnv, max_steps: int = 10, **overrides: Any) -> Any:
    model = client(llm, **overrides)
    try:
        return run_episode(model, initial_messages("Counter", "A counter.\n\nRules:\nBe nice.", task), TOOLS,
                           env.execute, max_steps=max_steps)
    finally:
        model.close()


def test_system_prompt_is_built_from_the_environment() -> None:
    prompt = system_prompt("OrderDesk", "Sells things.\n\nRules:\nNo refunds.")
    assert '"OrderDesk"' in prompt and "No refunds." in prompt and "tools" in prompt
    assert "(no description)" in system_prompt(None, None)
    messages = initial_messages("E", "d", "do it")
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == "do it"


def test_loop_runs_tool_calls_until_the_model_stops_and_retries_5xx_and_429() -> None:
    rules = [Rule(turn=0, errors=[500, 429], tool_calls=[ToolCallScript(name="bump", arguments={"by": 2}),
                                                         ToolCallScript(name="bump", arguments="{broken")]),
             Rule(turn=1, tool_calls=[ToolCallScript(name="explode")]),
             Rule(turn=2, content="all done")]
    env = FakeEnv()
    with ScriptedLLM(rules) as llm:
        result = run(llm, "bump it", env)
        bodies = llm.chat_requests()
    assert result.stop_reason == "model_stopped"
    assert [r.status for r in result.trajectory] == ["ok", "rejected", "rejected"]
    assert result.trajectory[1].action == {"name": "bump", "arguments": "{broken"}
    assert "Failed to parse" in result.trajectory[1].observation
    assert env.calls == [("bump", {"by": 2}), ("explode", {})]  # the malformed call was refused by the env
    assert env.raw[1] == "{broken"  # handed over as the model sent it
    assert [m["role"] for m in result.transcript] == ["system", "user", "assistant", "tool", "tool", "assistant",
                                                      "tool", "assistant"]
    assert result.transcript[-1]["content"] == "all done"
    assert result.usage.requests == 3 and result.usage.retries == 2 and result.usage.prompt_tokens > 0
    assert len(bodies) == 5 and bodies[0]["tools"] == TOOLS
    second_turn = bodies[3]["messages"]  # the model saw the observations and the rejection
    assert [m.get("content") for m in second_turn if m["role"] == "tool"][0] == "2"
    tool_ids = [m["tool_call_id"] for m in second_turn if m["role"] == "tool"]
    assert tool_ids == [c["id"] for c in second_turn[2]["tool_calls"]]


def test_max_steps_ends_the_episode_and_unrun_calls_are_answered() -> None:
    rules = [Rule(tool_calls=[ToolCallScript(name="bump", arguments={"by": 1})] * 2)]
    env = FakeEnv()
    with ScriptedLLM(rules) as llm:
        result = run(llm, "forever", env, max_steps=3)
    assert result.stop_reason == "max_steps" and len(result.trajectory) == 3 and env.count == 3
    tool_messages = [m for m in result.transcript if m["role"] == "tool"]
    assert len(tool_messages) == 4 and "not executed" in tool_messages[-1]["content"]


def test_model_refusal_is_not_retried_and_outage_is_retried_then_reported() -> None:
    with ScriptedLLM([Rule(contains=["outage"], errors=[503] * 10, content="x")]) as llm:
        with pytest.raises(ModelError) as refused:
            run(llm, "nothing scripted", FakeEnv())
        assert refused.value.status == "model_error" and "HTTP 400" in refused.value.message
        assert len(llm.chat_requests()) == 1
        with pytest.raises(ModelError) as outage:
            run(llm, "outage", FakeEnv())
        assert outage.value.status == "model_unavailable"
        assert len(llm.chat_requests()) == 1 + 3  # first try + 2 retries
        assert outage.value.result is not None and outage.value.result.usage.retries == 2
        assert "sk-unit-secret" not in refused.value.message + outage.value.message


def test_connection_failure_is_model_unavailable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = ModelClient(ModelSettings(base_url=f"http://127.0.0.1:{port}/v1", model="m", retries=1,
                                      retry_initial_s=0.001), None)
    try:
        with pytest.raises(ModelError) as failed:
            run_episode(model, initial_messages("E", None, "t"), TOOLS, FakeEnv().execute, max_steps=1)
    finally:
        model.close()
    assert failed.value.status == "model_unavailable"


def test_should_stop_ends_the_loop_between_steps() -> None:
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    with ScriptedLLM([Rule(tool_calls=[ToolCallScript(name="bump", arguments={"by": 1})] * 3)]) as llm:
        model = client(llm)
        try:
            result = run_episode(model, initial_messages("E", None, "t"), TOOLS, FakeEnv().execute, max_steps=10,
                                 should_stop=stop)
        finally:
            model.close()
    assert result.stop_reason == "stopped" and len(result.trajectory) == 1
    assert json.dumps(result.transcript)  # JSON-serializable as stored
