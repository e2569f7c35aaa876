"""The error model (:mod:`sandpit.api.errors`) as plain data: every error body can be sent
as UTF-8, a validation error names its field, and the module needs no web framework."""

from __future__ import annotations

from sandpit.api.errors import (
    EpisodeEnded,
    QuotaExceeded,
    Unauthorized,
    UnknownTool,
    error_body,
    error_reply,
    invalid_request_body,
    status_of,
)


def test_error_bodies_are_always_encodable() -> None:
    body = error_body("invalid_request", "bad \ud800 value", "init_config.\udc00")
    assert body["error"]["message"].encode("utf-8") and body["error"]["field"].encode("utf-8")


def test_statuses_come_from_the_table_by_the_most_specific_class() -> None:
    assert status_of(UnknownTool("x")) == (422, "unknown_tool")
    assert status_of(EpisodeEnded("x")) == (409, "episode_ended")


def test_a_reply_carries_its_headers_and_extras() -> None:
    quota = error_reply(QuotaExceeded("slow down", limit="steps_per_minute", retry_after=0, fixed=False))
    assert (quota.status, quota.headers) == (429, {"Retry-After": "1"})  # at least one second
    assert quota.body["error"] == {"code": "quota_exceeded", "message": "slow down", "field": None,
                                   "limit": "steps_per_minute", "retry_after": 1}
    assert error_reply(Unauthorized("no key")).headers == {"WWW-Authenticate": 'Bearer realm="sandpit"'}


def test_a_validation_error_names_its_first_field() -> None:
    errors = [{"loc": ("body", "function", "name"), "msg": "Input should be a valid string"},
              {"loc": ("query", "include"), "msg": "too long"}]
    assert invalid_request_body(errors)["error"] == {
        "code": "invalid_request", "field": "function.name",
        "message": "function.name: Input should be a valid string (and 1 more problem(s))"}
    assert invalid_request_body([{"loc": ("body",), "msg": "Field required"}])["error"]["field"] is None
    assert invalid_request_body([])["error"]["message"] == "invalid request"
