"""Model access: cache keying and replay, retries, usage totals, malformed answers
retried with feedback and finally reported (against the scripted OpenAI-compatible server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai import Rule, ScriptedLLM
from sandpit.synthesis.ask import ask
from sandpit.synthesis.llm import LLM, LLMUnavailable, request_key
from sandpit.synthesis.parsing import json_object
from sandpit.synthesis.prompts import render
from sandpit.synthesis.records import Rejected
from sandpit.synthesis.settings import SynthSettings


def settings_for(llm: ScriptedLLM, **extra: object) -> SynthSettings:
    return SynthSettings(base_url=llm.base_url, model="scripted", api_key="sk-unit-secret", retries=3,
                         retry_backoff_s=0.001, **extra)


def test_request_key_is_canonical() -> None:
    a = request_key({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5})
    b = request_key({"temperature": 0.5, "messages": [{"content": "x", "role": "user"}], "model": "m"})
    assert a == b and len(a) == 64
    assert a != request_key({"model": "m", "messages": [{"role": "user", "content": "y"}], "temperature": 0.5})
    assert a != request_key({"model": "m2", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5})


def test_answers_are_cached_on_disk_and_replayed(tmp_path: Path) -> None:
    with ScriptedLLM([Rule(contains=["hello"], content="world")]) as server:
        llm = LLM(settings_for(server), tmp_path / "cache")
        first = llm.chat([{"role": "user", "content": "hello"}])
        again = LLM(settings_for(server), tmp_path / "cache").chat([{"role": "user", "content": "hello"}])
        other = llm.chat([{"role": "user", "content": "hello there"}])
        vectors = llm.embed(["a b", "a b c"])
        assert LLM(settings_for(server), tmp_path / "cache").embed(["a b", "a b c"]) == vectors
        requests = len(server.requests)
    assert (first.content, first.cached, again.content, again.cached, other.cached) == ("world", False, "world",
                                                                                       True, False)
    assert requests == 3  # two chats and one embedding batch; the replays never reached the server
    assert llm.usage.requests == 3 and llm.usage.cached == 0 and llm.usage.prompt_tokens > 0
    entries = list((tmp_path / "cache").rglob("*.json"))
    assert len(entries) == 3
    assert all("sk-unit-secret" not in e.read_text() for e in entries)


def test_retries_server_errors_then_gives_up(tmp_path: Path) -> None:
    rules = [Rule(contains=["flaky"], errors=[500, 429], content="ok"),
             Rule(contains=["down"], errors=[503] * 10, content="never")]
    with ScriptedLLM(rules) as server:
        llm = LLM(settings_for(server), tmp_path)
        assert llm.chat([{"role": "user", "content": "flaky"}]).content == "ok"
        with pytest.raises(LLMUnavailable, match="HTTP 503"):
            llm.chat([{"role": "user", "content": "down"}])
        with pytest.raises(LLMUnavailable, match="HTTP 400"):  # no scripted answer: not retried
            llm.chat([{"role": "user", "content": "unscripted"}])
        counts = [sum(1 for r in server.chat_requests() if word in r["messages"][0]["content"])
                  for word in ("flaky", "down", "unscripted")]
    assert counts == [3, 3, 1]
    assert llm.usage.failed == 2


def test_malformed_answers_are_retried_with_feedback_then_reported(tmp_path: Path) -> None:
    rules = [Rule(contains=["sandpit-prompt judge_stateful", "good"], turn=0, content="yes, it is stateful"),
             Rule(contains=["sandpit-prompt judge_stateful", "good"], content='{"stateful": true}'),
             Rule(contains=["sandpit-prompt judge_stateful", "bad"], content="no JSON, ever")]

    def parse(text: str) -> dict:
        return json_object(text, {"stateful": bool})

    with ScriptedLLM(rules) as server:
        llm = LLM(settings_for(server), tmp_path)
        assert ask(llm, render("judge_stateful", task="good"), parse, attempts=3, what="judge") == {"stateful": True}
        with pytest.raises(Rejected) as caught:
            ask(llm, render("judge_stateful", task="bad"), parse, attempts=3, what="judge")
        second = server.chat_requests()[1]["messages"]
    assert caught.value.reason == "malformed output" and "3 malformed answer(s)" in caught.value.detail
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert "not JSON" in second[-1]["content"]


def test_settings_never_expose_the_key() -> None:
    settings = SynthSettings(api_key="sk-very-secret")
    assert "sk-very-secret" not in json.dumps(settings.public())
    assert "sk-very-secret" not in repr(settings)
    assert settings.public()["api_key_set"] is True
