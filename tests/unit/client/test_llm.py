"""The model client (`sandpit.client.llm`): the real `openai` SDK against the scripted
OpenAI-compatible server on 127.0.0.1 (retries, cache, usage) and against an
`httpx.MockTransport` where a test needs an answer no server would script (no choices,
custom tool calls, exact headers)."""

from __future__ import annotations

import json
import pickle
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_openai import Rule, ScriptedLLM, ToolCallScript
from sandpit.client.llm import (
    CHAT_COUNTERS,
    ChatReply,
    ModelClient,
    ModelError,
    ModelRefused,
    ModelSettings,
    ModelUnavailable,
    ToolCall,
    Usage,
    request_key,
)

SECRET = "sk-unit-secret"  # noqa: S105 - a test double's key


def settings_for(base_url: str, **overrides: Any) -> ModelSettings:
    values: dict[str, Any] = {"base_url": base_url, "model": "m", "retries": 2, "retry_initial_s": 0.001,
                              "retry_max_s": 0.05, "request_timeout_s": 10.0, "embedding_model": "e", **overrides}
    return ModelSettings(**values)


def mocked(handler: Callable[[httpx.Request], httpx.Response], **overrides: Any) -> ModelClient:
    return ModelClient(settings_for("http://model.test/v1", **overrides), SECRET,
                       http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def completion(message: dict[str, Any], *, usage: bool = True, choices: bool = True) -> httpx.Response:
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}] if choices else []}
    if usage:
        body["usage"] = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    return httpx.Response(200, json=body)


def test_request_key_is_canonical() -> None:
    a = request_key({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5})
    b = request_key({"temperature": 0.5, "messages": [{"content": "x", "role": "user"}], "model": "m"})
    assert a == b and len(a) == 64
    assert a != request_key({"model": "m", "messages": [{"role": "user", "content": "y"}], "temperature": 0.5})
    assert a != request_key({"model": "m2", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5})


def test_answers_are_cached_on_disk_and_replayed(tmp_path: Path) -> None:
    with ScriptedLLM([Rule(contains=["hello"], content="world")]) as server:
        def model() -> ModelClient:
            return ModelClient(settings_for(server.base_url, temperature=0.7), SECRET, cache_dir=tmp_path / "cache")

        first = model().chat([{"role": "user", "content": "hello"}])
        again = model()
        replayed = again.chat([{"role": "user", "content": "hello"}])
        vectors = again.embed(["a b", "a b c"])
        assert model().embed(["a b", "a b c"]) == vectors
        assert ModelClient(settings_for(server.base_url, temperature=0.7), SECRET).chat(
            [{"role": "user", "content": "hello"}]).cached is False  # no cache_dir: always live
        requests = len(server.requests)
    assert (first.text, first.cached, replayed.text, replayed.cached) == ("world", False, "world", True)
    assert requests == 3  # one chat, one embedding batch, the uncached client's chat
    assert again.usage.cached == 1 and again.usage.requests == 1 and again.usage.embedding_tokens > 0
    entries = list((tmp_path / "cache").rglob("*.json"))
    assert len(entries) == 2 and all(SECRET not in e.read_text() for e in entries)


def test_transient_answers_are_retried_then_reported(tmp_path: Path) -> None:
    rules = [Rule(contains=["flaky"], errors=[500, 429], content="ok"),
             Rule(contains=["down"], errors=[503] * 10, content="never")]
    with ScriptedLLM(rules) as server:
        model = ModelClient(settings_for(server.base_url), SECRET)
        assert model.chat([{"role": "user", "content": "flaky"}]).text == "ok"
        with pytest.raises(ModelUnavailable, match="HTTP 503") as down:
            model.chat([{"role": "user", "content": "down"}])
        with pytest.raises(ModelRefused, match="HTTP 400") as refused:  # no scripted answer: not retried
            model.chat([{"role": "user", "content": "unscripted"}])
        counts = [sum(1 for r in server.chat_requests() if word in r["messages"][0]["content"])
                  for word in ("flaky", "down", "unscripted")]
    assert counts == [3, 3, 1]  # first attempt + retries=2
    assert (down.value.status, refused.value.status) == ("model_unavailable", "model_error")
    assert "after 2 retries" in down.value.message and "refused the request" in refused.value.message
    assert model.usage.retries == 4 and model.usage.failed == 2 and model.usage.requests == 1
    assert SECRET not in down.value.message + refused.value.message


@pytest.mark.parametrize(("status", "retried"), [(408, True), (409, True), (429, True), (500, True), (502, True),
                                                 (400, False), (401, False), (404, False), (422, False)])
def test_which_statuses_are_retried(status: int, retried: bool) -> None:
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        return httpx.Response(status, json={"error": {"message": f"status {status}"}})

    with mocked(handler, retries=1) as model, pytest.raises(ModelError) as failed:
        model.chat([{"role": "user", "content": "x"}])
    assert len(seen) == (2 if retried else 1)
    assert failed.value.status == ("model_unavailable" if retried else "model_error")
    assert isinstance(failed.value, ModelUnavailable if retried else ModelRefused)


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    answers = iter([httpx.Response(429, headers={"retry-after": "0.3"}, json={"error": {"message": "slow down"}}),
                    completion({"role": "assistant", "content": "done"})])
    with mocked(lambda _request: next(answers), retry_max_s=5.0) as model:
        started = time.monotonic()
        assert model.chat([{"role": "user", "content": "x"}]).text == "done"
        assert 0.3 <= time.monotonic() - started < 3
    capped = iter([httpx.Response(429, headers={"retry-after": "60"}, json={"error": {"message": "slow down"}}),
                   completion({"role": "assistant", "content": "done"})])
    with mocked(lambda _request: next(capped), retry_max_s=0.05) as model:
        started = time.monotonic()
        model.chat([{"role": "user", "content": "x"}])
        assert time.monotonic() - started < 3


def test_should_stop_ends_the_retries() -> None:
    attempts: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        return httpx.Response(503, json={"error": {"message": "down"}})

    with mocked(handler, retries=10) as model, pytest.raises(ModelUnavailable):
        model.chat([{"role": "user", "content": "x"}], should_stop=lambda: len(attempts) >= 2)
    assert len(attempts) == 2


def test_connection_failure_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with ModelClient(settings_for(f"http://127.0.0.1:{port}/v1", retries=1), None) as model:
        with pytest.raises(ModelUnavailable, match="APIConnectionError"):
            model.chat([{"role": "user", "content": "x"}])
        assert model.usage.retries == 1 and model.usage.failed == 1


def test_request_shape_and_key() -> None:
    bodies: list[dict[str, Any]] = []
    auth: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        auth.append(request.headers["authorization"])
        return completion({"role": "assistant", "content": "hi"})

    tools = [{"type": "function", "function": {"name": "bump", "parameters": {"type": "object"}}}]
    with mocked(handler, temperature=0.2, max_tokens=50) as model:
        model.chat([{"role": "user", "content": "x"}], tools)
        model.chat([{"role": "user", "content": "x"}], [])
    with ModelClient(settings_for("http://model.test/v1"), None,
                     http_client=httpx.Client(transport=httpx.MockTransport(handler))) as keyless:
        keyless.chat([{"role": "user", "content": "x"}])
    assert bodies[0] == {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools,
                         "temperature": 0.2, "max_tokens": 50}
    assert "tools" not in bodies[1]
    assert "temperature" not in bodies[2] and "max_tokens" not in bodies[2]  # None: left to the server
    assert auth == [f"Bearer {SECRET}"] * 2 + ["Bearer EMPTY"]


def test_reply_message_and_tool_calls() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "bump", "arguments": '{"by": 2}'}},
        {"id": "", "type": "function", "function": {"name": "bump", "arguments": "{broken"}},
        {"id": "custom_1", "type": "custom", "custom": {"name": "grammar", "input": "x"}}]}
    with mocked(lambda _request: completion(message)) as model:
        usage = Usage()
        reply = model.chat([{"role": "user", "content": "x"}], usage=usage, label="judge")
    assert reply.content is None and reply.text == ""
    assert reply.tool_calls == (ToolCall("call_a", "bump", '{"by": 2}'), ToolCall("call_1_1", "bump", "{broken"))
    assert reply.message() == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "bump", "arguments": '{"by": 2}'}},
        {"id": "call_1_1", "type": "function", "function": {"name": "bump", "arguments": "{broken"}}]}
    assert ChatReply("done").message() == {"role": "assistant", "content": "done"}
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens, usage.by_prompt) == (1, 7, 3, {"judge": 1})
    assert model.usage == Usage()  # the counts went to the given usage


def test_an_answer_without_choices_is_refused() -> None:
    with mocked(lambda _request: completion({}, choices=False)) as model:
        with pytest.raises(ModelRefused, match="no choices"):
            model.chat([{"role": "user", "content": "x"}])
        assert model.usage.requests == 1 and model.usage.failed == 1


def test_embed_needs_a_model_and_keeps_the_order() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        data = [{"object": "embedding", "index": i, "embedding": [float(i)]} for i in range(len(body["input"]))]
        return httpx.Response(200, json={"object": "list", "model": body["model"], "data": data[::-1],
                                         "usage": {"prompt_tokens": 4, "total_tokens": 4}})

    with mocked(handler, embedding_model=None) as model:
        with pytest.raises(ValueError, match="embedding model"):
            model.embed(["a"])
        assert model.embed(["a", "b", "c"], model="e") == [[0.0], [1.0], [2.0]]
        assert model.usage.embedding_tokens == 4 and model.usage.requests == 1


def test_usage_adds_up_and_maps_to_the_rollout_counters() -> None:
    total = Usage(requests=1, prompt_tokens=5, by_prompt={"a": 1})
    total.add(Usage(requests=2, retries=1, completion_tokens=3, by_prompt={"a": 1, "b": 2}))
    assert total.as_dict(CHAT_COUNTERS) == {"prompt_tokens": 5, "completion_tokens": 3, "requests": 3, "retries": 1}
    assert total.as_dict() == {"requests": 3, "prompt_tokens": 5, "completion_tokens": 3, "embedding_tokens": 0,
                               "cached": 0, "retries": 1, "failed": 0, "by_prompt": {"a": 2, "b": 2}}


def test_errors_keep_their_status_across_pickling() -> None:
    for error in (ModelError("model_error", "too long"), ModelUnavailable("down"), ModelRefused("no")):
        error.result = {"partial": True}
        copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
        assert (type(copy), copy.status, copy.message, str(copy), copy.result) == (
            type(error), error.status, error.message, str(error), {"partial": True})


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="retries"):
        ModelSettings(base_url="http://x/v1", model="m", retries=-1)
    with pytest.raises(ValueError, match="max_concurrency"):
        ModelClient(ModelSettings(base_url="http://x/v1", model="m"), max_concurrency=0)


def test_scripted_tool_calls_round_trip_through_the_cache(tmp_path: Path) -> None:
    rules = [Rule(tool_calls=[ToolCallScript(name="bump", arguments={"by": 1})])]
    with ScriptedLLM(rules) as server:
        live = ModelClient(settings_for(server.base_url), SECRET, cache_dir=tmp_path).chat(
            [{"role": "user", "content": "go"}])
        cached = ModelClient(settings_for(server.base_url), SECRET, cache_dir=tmp_path).chat(
            [{"role": "user", "content": "go"}])
    assert cached.cached and cached.tool_calls == live.tool_calls and cached.message() == live.message()
