"""The route class of strict request JSON (:mod:`sandpit.api.http.strict_json`) answers
in the API's error shape: 413 over the body cap, 422 for what the JSON rules refuse."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
from fastapi import FastAPI
from sandpit.api.http.deps import json_router


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
