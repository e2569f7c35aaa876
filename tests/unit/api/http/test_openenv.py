"""The OpenEnv face's conversions (:mod:`sandpit.api.http.openenv`): Basic credentials as
the API key, OpenEnv actions as step requests, steps/envs/states as OpenEnv's replies, and
API errors as WebSocket errors. The endpoints run in tests/integration/api/test_openenv.py."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError
from sandpit.api.errors import EpisodeEnded, NotFound, QuotaExceeded
from sandpit.api.http.openenv import (
    OpenEnvReset,
    OpenEnvStep,
    api_ws_error,
    key_authorization,
    reset_reply,
    schemas,
    state_reply,
    step_action,
    step_reply,
    validation_ws_error,
)
from sandpit.api.schemas.envs import EnvPublic


def _basic(user_pass: str) -> str:
    return "Basic " + base64.b64encode(user_pass.encode()).decode()


@pytest.mark.parametrize(("header", "expected"), [
    (_basic("sandpit:sk_abc"), "Bearer sk_abc"),
    (_basic(":sk_abc"), "Bearer sk_abc"),
    (_basic("sandpit:key:with:colons"), "Bearer key:with:colons"),
    ("basic " + base64.b64encode(b"u:k").decode(), "Bearer k"),
    (_basic("no-colon"), "Bearer "),  # refused by the tenant service (401)
    ("Basic !!!not-base64!!!", "Bearer "),
    ("Basic " + base64.b64encode(b"\xff\xfe:\xff").decode(), "Bearer "),  # not UTF-8
    ("Bearer sk_abc", "Bearer sk_abc"),
    ("Token sk_abc", "Token sk_abc"),  # passed on as it is: the tenant service refuses it
    (None, None),
])
def test_basic_credentials_carry_the_key_as_password(header: str | None, expected: str | None) -> None:
    assert key_authorization(header) == expected


def test_action_forms_become_step_requests() -> None:
    assert step_action({"name": "bump", "arguments": {"by": 1}}).name == "bump"
    assert step_action({"name": "bump", "arguments": {}, "metadata": {}}).arguments == {}
    tool_call = step_action({"type": "function", "function": {"name": "bump", "arguments": "{\"by\": 2}"}})
    assert tool_call.function is not None and tool_call.function.name == "bump"
    assert step_action({"text": "hello"}).text == "hello"


@pytest.mark.parametrize("data", [
    {},  # no form
    {"name": "bump", "text": "x"},  # two forms
    {"arguments": {}},  # arguments without a name
    {"name": "bump", "extra": 1},  # an unknown field
    {"name": "bump", "metadata": "not an object"},  # kept, so refused as an unknown field
    {"name": "x" * 2000},  # over the name's length cap
    {"name": 7},
])
def test_malformed_actions_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        step_action(data)


def _document(**changes: object) -> dict[str, object]:
    return {"env_id": "env_1", "episode": 1, "step": 2, "action": {"name": "bump", "arguments": {}},
            "observation": "3", "status": "ok", "reward": 0.0, "terminated": False, "truncated": False, **changes}


@pytest.mark.parametrize(("terminated", "truncated", "done"), [(False, False, False), (True, False, True),
                                                                (False, True, True), (True, True, True)])
def test_step_reply_done_when_the_episode_ended(terminated: bool, truncated: bool, done: bool) -> None:
    document = _document(reward=1.0, terminated=terminated, truncated=truncated)
    assert step_reply(document) == {"observation": document, "reward": 1.0, "done": done}


def test_reset_reply_is_the_env_document() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    env = EnvPublic(id="env_1", environment_id="envr_1", episode=1, step=0, status="live", init_config={},
                    created_at=now, expires_at=now, observation="Bring the counter to 3.")
    reply = reset_reply(env)
    assert (reply["reward"], reply["done"]) == (None, False)
    assert reply["observation"]["observation"] == "Bring the counter to 3."
    assert reply["observation"]["created_at"] == "2026-01-01T00:00:00Z"
    ended = env.model_copy(update={"episode_status": "terminated"})
    assert reset_reply(ended)["done"] is True


def test_state_reply_adds_openenv_fields() -> None:
    view = {"env_id": "env_1", "episode": 2, "step": 5, "state": {"count": 3}, "truncated": False}
    assert state_reply(view) == {"episode_id": "env_1:2", "step_count": 5, **view}


def test_api_errors_keep_their_code_and_status() -> None:
    ended = api_ws_error(EpisodeEnded("episode 1 has ended"))
    assert ended["type"] == "error"
    assert (ended["data"]["code"], ended["data"]["status"]) == ("episode_ended", 409)
    assert ended["data"]["message"] == "episode 1 has ended"
    quota = api_ws_error(QuotaExceeded("too many steps", limit="steps_per_minute", retry_after=3))
    assert (quota["data"]["status"], quota["data"]["error"]["retry_after"]) == (429, 3)
    assert api_ws_error(NotFound("scenario 'x' not found"))["data"]["status"] == 404


def test_validation_errors_leave_the_input_out() -> None:
    with pytest.raises(ValidationError) as caught:
        step_action({"name": "bump", "secret": "s" * 100})
    error = validation_ws_error(caught.value)
    assert error["data"]["code"] == "VALIDATION_ERROR"
    assert "s" * 100 not in str(error)


@pytest.mark.parametrize("body", [{"seed": -1}, {"seed": "1"}, {"seed": 2**64}, {"episode_id": "e" * 256},
                                  {"unknown": 1}])
def test_reset_body_is_checked(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OpenEnvReset.model_validate(body)


@pytest.mark.parametrize("body", [{"action": {"name": "x"}}, {"episode_id": "env_1"},
                                  {"action": [], "episode_id": "env_1"},
                                  {"action": {}, "episode_id": "env_1", "timeout_s": 0}])
def test_http_step_body_is_checked(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OpenEnvStep.model_validate(body)


def test_schemas_name_action_observation_state() -> None:
    found = schemas()
    assert set(found) == {"action", "observation", "state"}
    assert "text" in found["action"]["properties"]
    assert "reward" in found["observation"]["properties"]
    assert "state" in found["state"]["properties"]
