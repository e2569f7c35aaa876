"""A conversational episode on the fake executor, its simulated user answering from the
scripted OpenAI-compatible server on 127.0.0.1 (through ``sandpit.client.llm``): the
user's first message is the observation, ``chat_with_user`` gets its reply, ``###STOP###``
ends the episode with the checks' reward, and a failing model is a 503 with nothing
recorded."""

from __future__ import annotations

import pytest
from api_fakes import caller
from fake_openai import Rule, ScriptedLLM
from sandpit.api.app import Services
from sandpit.api.errors import ServiceUnavailable
from sandpit.api.schemas.envs import EnvCreate, EpisodeOptions, StepRequest, UserSimulator
from sandpit.api.schemas.scenarios import CheckSpec, ScenarioCreate
from sandpit.api.schemas.tenants import TenantCreate
from sandpit.executor.fake import FakeExecutor

ME = caller()
CHECK = "def check_func(final_state):\n    return final_state['count'] == 2\n"


def test_a_conversation_with_the_simulated_user(services: Services, fake: FakeExecutor,
                                                environment_id: str) -> None:
    services.tenants.create(TenantCreate(id="team-a", create_key=False))
    fake.script_check(CHECK, lambda initial, final: final["count"] == 2)
    scenario = services.scenarios.create(ME, ScenarioCreate(
        environment_id=environment_id, task="Bump the counter twice.",
        checklist_with_func=[CheckSpec(check_item="count is 2", check_func=CHECK)]))
    rules = [Rule(turn=0, content="# Thought:\nask\n# Reply:\nPlease bump my counter twice."),
             Rule(turn=1, last_contains=["[Agent] Done"], content="###STOP###"),
             Rule(turn=1, content="# Thought:\nhm\n# Reply:\nNot yet.")]
    with ScriptedLLM(rules) as llm:
        user = UserSimulator(model="user-model", base_url=llm.base_url, api_key="sk-user")
        env = services.envs.create(ME, EnvCreate(scenario_id=scenario.id, episode=EpisodeOptions(
            mode="conversational", user=user))).public
        assert env.observation == "Please bump my counter twice."
        services.steps.step(ME, env.id, StepRequest(name="bump", arguments={"by": 2}), None).public()
        done = services.steps.step(ME, env.id, StepRequest(name="chat_with_user",
                                                           arguments={"content": "Done, it is 2."}), None).public()
        requests = llm.chat_requests()
    assert done.terminated and done.observation == "###STOP###" and done.observation_role == "user"
    assert done.reward == 1.0
    assert requests[0]["model"] == "user-model" and requests[0]["messages"][0]["role"] == "system"
    assert "Bump the counter twice." in requests[0]["messages"][0]["content"]


def test_a_failing_user_model_records_nothing(services: Services, environment_id: str) -> None:
    services.tenants.create(TenantCreate(id="team-a", create_key=False))
    rules = [Rule(turn=0, content="# Thought:\nx\n# Reply:\nHello."), Rule(turn=1, errors=[400])]  # a refusal: not retried
    with ScriptedLLM(rules) as llm:
        user = UserSimulator(model="m", base_url=llm.base_url, request_timeout_s=5)
        env = services.envs.create(ME, EnvCreate(environment_id=environment_id, episode=EpisodeOptions(
            mode="conversational", user=user))).public
        with pytest.raises(ServiceUnavailable) as raised:
            services.steps.step(ME, env.id, StepRequest(name="chat_with_user", arguments={"content": "hi"}), None).public()
    assert "model_error" in raised.value.message and "the step was not recorded" in raised.value.message
    assert services.history.trajectory(ME, env.id, None, None, 0).count == 0
