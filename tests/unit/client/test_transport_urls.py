"""The transports' absolute URLs (``client/transport.py``'s ``_Urls``) are the ones httpx
builds from a path string: on a ``base_url`` with and without a path prefix, for hostile
ids (percent-encoded by the calls), for both clients; a new ``base_url`` is honoured at once,
and the cache stays bounded."""

from __future__ import annotations

import asyncio
import sys
import threading
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sandpit.client import AsyncClient, Client, EnvHandle
from sandpit.client import transport as transport_module
from sandpit.client.calls import env_state, env_step
from sandpit.client.models import Env
from sandpit.client.transport import _Urls

STEP_REPLY = {"env_id": "e1", "episode": 1, "step": 1, "tool": "add", "status": "ok", "observation": "1",
              "done": False, "reward": 0.0, "duration_ms": 0.1}
HOSTILE_IDS = ["e1", "../environments", "a b", "x?y=1#z", "%2e%2e", "é/…", "a;b", "//evil.example/x"]


def _handler(seen: list[httpx.URL]) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        if request.url.path.endswith("/step"):
            return httpx.Response(200, json=STEP_REPLY)
        return httpx.Response(200, json={"env_id": "e1", "episode": 1, "step": 0, "state": {}})
    return handler


def _env(transport: Any) -> EnvHandle:
    return EnvHandle(transport, Env(id="e1", step=0, episode=1, status="live", created_at=datetime.now(UTC)))


@pytest.mark.parametrize("base", ["http://127.0.0.1:9", "http://127.0.0.1:9/", "http://127.0.0.1:9/prefix/sandpit",
                                  "http://127.0.0.1:9/prefix/sandpit/", "https://user:pw@host.example:8443/a%20b/"])
@pytest.mark.parametrize("env_id", HOSTILE_IDS)
def test_each_path_goes_where_httpx_would_send_it(base: str, env_id: str) -> None:
    plain = httpx.Client(base_url=base)
    urls = _Urls()
    for call in (env_step(env_id, {"name": "add", "arguments": {}}, None), env_state(env_id, 3, None)):
        expected = plain.build_request(call.method, call.path, params=call.params).url
        built = urls.url(plain.base_url, call.path)
        assert built == plain.build_request(call.method, call.path).url, (base, env_id, call.path)
        sent = plain.build_request(call.method, built, params=call.params).url
        assert sent == expected and str(sent) == str(expected), (base, env_id, call.path)
        assert urls.url(plain.base_url, call.path) is built  # built once
        assert expected.host == plain.base_url.host and expected.port == plain.base_url.port  # never elsewhere


def test_an_absolute_path_is_left_as_it_is_and_not_kept() -> None:
    urls = _Urls()
    base = httpx.URL("http://127.0.0.1:9/")
    assert urls.url(base, "http://other.example/x") == httpx.URL("http://other.example/x")
    assert urls._cache[1] == {}


def test_the_sync_client_sends_to_the_same_urls_and_follows_a_new_base_url() -> None:
    seen: list[httpx.URL] = []
    with Client("http://127.0.0.1:9/api", transport=httpx.MockTransport(_handler(seen))) as client:
        env = _env(client._t)
        env.step("add")
        env.step("add")
        assert env.state(2) == {}
        client._t.http.base_url = "http://127.0.0.1:10/other/"
        env.step("add")
    assert [str(url) for url in seen] == ["http://127.0.0.1:9/api/v1/envs/e1/step"] * 2 + [
        "http://127.0.0.1:9/api/v1/envs/e1/state?step=2", "http://127.0.0.1:10/other/v1/envs/e1/step"]


def test_the_async_client_sends_to_the_same_urls() -> None:
    seen: list[httpx.URL] = []

    async def run() -> None:
        async with AsyncClient("http://127.0.0.1:9/api/", transport=httpx.MockTransport(_handler(seen))) as client:
            for env_id in ("e1", "../environments"):
                await client._t.run(env_step(env_id, {"name": "add", "arguments": {}}, None))

    asyncio.run(run())
    assert [str(url) for url in seen] == ["http://127.0.0.1:9/api/v1/envs/e1/step",
                                          "http://127.0.0.1:9/api/v1/envs/..%2Fenvironments/step"]


def test_the_cache_starts_over_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "URL_CACHE_SIZE", 8)
    urls = _Urls()
    base = httpx.URL("http://127.0.0.1:9/")
    for n in range(50):
        assert urls.url(base, f"/v1/envs/e{n}/step") == httpx.URL(f"http://127.0.0.1:9/v1/envs/e{n}/step")
        assert len(urls._cache[1]) <= 8


def test_callers_on_two_base_urls_at_once_each_get_their_own() -> None:
    """Threads sharing one cache, half on each of two bases (a client whose base_url is
    changed while others send): every URL is on its caller's base (a cache that kept
    paths whatever their base would hand callers the other base's URLs)."""
    urls = _Urls()
    bases = [httpx.URL("http://127.0.0.1:9/a/"), httpx.URL("http://127.0.0.2:10/b/")]
    wrong: list[str] = []
    start = threading.Barrier(8)

    def caller(base: httpx.URL) -> None:
        start.wait()
        for n in range(3000):
            url = urls.url(base, f"/v1/envs/e{n % 7}/step")
            if not str(url).startswith(str(base)):
                wrong.append(f"{base} -> {url}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=caller, args=(bases[i % 2],)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
