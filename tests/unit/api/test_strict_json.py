"""Strict request JSON (:mod:`sandpit.api.http.strict_json`): lone UTF-16 surrogates are found
(and paired ones are not), non-JSON numbers and deep nesting are refused, and the route
class answers in the API's error shape."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sandpit.api.errors import InvalidRequest, error_body
from sandpit.api.http.deps import json_router
from sandpit.api.json_rules import json_depth_exceeds, lone_surrogate_at, strict_loads


@pytest.mark.parametrize("body, where", [
    (rb'{"a": "\ud800"}', "a"),
    (rb'{"a": "\uDC00x"}', "a"),
    (rb'{"a": [1, {"b": "x\udfff"}]}', "a.1.b"),
    (rb'{"a": {"\ud800": 1}}', "a"),
    (rb'"\ud800"', ""),
    (rb'{"a": "\ud83d\ude00"}', None),  # a pair: one astral character
    (rb'{"a": "\\ud800"}', None),  # an escaped backslash: six ASCII characters
    (rb'{"a": "\u00e9"}', None),
])
def test_lone_surrogate_at(body: bytes, where: str | None) -> None:
    assert lone_surrogate_at(body, strict_loads(body, 64)) == where


def test_error_bodies_are_always_encodable() -> None:
    body = error_body("invalid_request", "bad \ud800 value", "init_config.\udc00")
    assert body["error"]["message"].encode("utf-8") and body["error"]["field"].encode("utf-8")


# -- strict parsing and the route class ---------------------------------------------------------


@pytest.mark.parametrize("body", [b'{"a": NaN}', b"[Infinity]", b'{"a": -Infinity}', b'{"a": 1', b"{'a': 1}", b""])
def test_non_json_numbers_and_malformed_json_are_invalid(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        strict_loads(body, 64)


def test_depth_is_counted_outside_strings_only() -> None:
    assert not json_depth_exceeds(b'{"a": "[[[[[[[[[[{{{{{{"}', 2)
    assert not json_depth_exceeds(b'{"a": "\\"[[[["}', 2)  # an escaped quote does not end the string
    assert json_depth_exceeds(b"[[[1]]]", 2) and not json_depth_exceeds(b"[[1]]", 2)
    with pytest.raises(InvalidRequest, match="nested deeper than 4"):
        strict_loads(b"[" * 5 + b"]" * 5, 4)
    assert strict_loads(b"[" * 4 + b"]" * 4, 4) == [[[[]]]]


def echo_app() -> FastAPI:
    app = FastAPI()
    app.state.settings = SimpleNamespace(max_body_bytes=256, max_json_depth=8)
    router = json_router(prefix="/echo")

    @router.post("")
    def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    app.include_router(router)
    return app


def post_all(bodies: list[bytes]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=echo_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.post("/echo", content=b, headers={"content-type": "application/json"})
                    for b in bodies]

    return asyncio.run(run())


def test_the_route_class_answers_in_the_api_error_shape() -> None:
    ok, nan, deep, lone, big = post_all([b'{"a": 1}', b'{"a": NaN}', b'{"a":' + b"[" * 9 + b"]" * 9 + b"}",
                                         rb'{"name": "\ud800"}', b'{"a": "' + b"x" * 300 + b'"}'])
    assert ok.json() == {"a": 1}
    assert nan.status_code == 422 and nan.json()["error"]["code"] == "invalid_request"
    assert deep.status_code == 422 and "nested deeper" in deep.json()["error"]["message"]
    assert lone.status_code == 422 and lone.json()["error"]["field"] == "name"
    assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
