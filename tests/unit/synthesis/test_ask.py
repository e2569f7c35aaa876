"""Synthesis's use of the model client (against the scripted OpenAI-compatible server):
its settings map onto `ModelSettings`, live requests are counted per prompt, malformed
answers are retried with feedback and finally reported. The client itself (cache, retries,
errors) is tested in tests/unit/client/test_llm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai import Rule, ScriptedLLM
from sandpit.client.llm import ModelRefused, ModelUnavailable
from sandpit.synthesis.ask import ask
from sandpit.synthesis.parsing import json_object
from sandpit.synthesis.prompts import prompt_name, render
from sandpit.synthesis.records import Rejected
from sandpit.synthesis.settings import SynthSettings


def settings_for(llm: ScriptedLLM, **extra: object) -> SynthSettings:
    return SynthSettings(base_url=llm.base_url, model="scripted", api_key="sk-unit-secret", retries=3,
                         retry_backoff_s=0.001, **extra)


def test_settings_map_onto_the_model_client() -> None:
    model = SynthSettings(base_url="http://x/v1", model="m", retries=3, retry_backoff_s=0.5, temperature=0.3,
                          request_timeout_s=9, embedding_model="e").model_settings()
    assert (model.base_url, model.model, model.temperature, model.request_timeout_s, model.embedding_model) == (
        "http://x/v1", "m", 0.3, 9, "e")
    assert (model.retries, model.retry_initial_s, model.retry_max_s) == (2, 0.5, 30.0)  # attempts -> retries


def test_attempts_per_request_and_usage_per_prompt(tmp_path: Path) -> None:
    rules = [Rule(contains=["flaky"], errors=[500, 429], content="ok"),
             Rule(contains=["down"], errors=[503] * 10, content="never")]
    with ScriptedLLM(rules) as server:
        llm = settings_for(server).model_client(tmp_path)
        judged = render("judge_stateful", task="flaky")
        assert llm.chat(judged, label=prompt_name(judged)).text == "ok"
        with pytest.raises(ModelUnavailable, match="HTTP 503"):
            llm.chat([{"role": "user", "content": "down"}])
        with pytest.raises(ModelRefused, match="HTTP 400"):  # no scripted answer: not retried
            llm.chat([{"role": "user", "content": "unscripted"}])
        counts = [sum(1 for r in server.chat_requests() if any(word in str(m["content"]) for m in r["messages"]))
                  for word in ("flaky", "down", "unscripted")]
    assert counts == [3, 3, 1]  # SANDPIT_SYNTH_RETRIES=3 attempts
    assert llm.usage.failed == 2 and llm.usage.by_prompt == {"judge_stateful": 1}


def test_malformed_answers_are_retried_with_feedback_then_reported(tmp_path: Path) -> None:
    rules = [Rule(contains=["sandpit-prompt judge_stateful", "good"], turn=0, content="yes, it is stateful"),
             Rule(contains=["sandpit-prompt judge_stateful", "good"], content='{"stateful": true}'),
             Rule(contains=["sandpit-prompt judge_stateful", "bad"], content="no JSON, ever")]

    def parse(text: str) -> dict:
        return json_object(text, {"stateful": bool})

    with ScriptedLLM(rules) as server:
        llm = settings_for(server).model_client(tmp_path)
        assert ask(llm, render("judge_stateful", task="good"), parse, attempts=3, what="judge") == {"stateful": True}
        with pytest.raises(Rejected) as caught:
            ask(llm, render("judge_stateful", task="bad"), parse, attempts=3, what="judge")
        second = server.chat_requests()[1]["messages"]
    assert caught.value.reason == "malformed output" and "3 malformed answer(s)" in caught.value.detail
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert "not JSON" in second[-1]["content"]
    assert llm.usage.by_prompt == {"judge_stateful": 5}


def test_prompt_name() -> None:
    assert prompt_name(render("judge_call", class_name="C", rules="", case_type="", method_code="", tool_call="",
                              status="", observation="", state_diff="")) == "judge_call"
    assert prompt_name([{"role": "user", "content": "hello"}]) == prompt_name([]) == "?"


def test_settings_never_expose_the_key() -> None:
    settings = SynthSettings(api_key="sk-very-secret")
    assert "sk-very-secret" not in json.dumps(settings.public())
    assert "sk-very-secret" not in repr(settings) + repr(settings.model_settings())
    assert settings.public()["api_key_set"] is True
