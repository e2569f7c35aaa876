"""The MCP door (``sandpit.api.http.mcp_door.McpDoor``): the server is built once, by the
first request that needs it, on a worker thread; a failed build is tried again by the next
request; the server's ``run()`` is entered while it serves and left at shutdown; a request
outside the door's ``run()`` gets a clear error. The server here is a stand-in with the
two things the door uses (``run()`` and identity); the real one is tested over HTTP in
``tests/integration/api/test_mcp.py``."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from sandpit.api.http.mcp_door import McpDoor


class StandIn:
    """Records whether its ``run()`` is entered."""

    def __init__(self) -> None:
        self.running = False
        self.runs = 0

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        self.running, self.runs = True, self.runs + 1
        try:
            yield
        finally:
            self.running = False


class Builds:
    """A ``build`` callable that counts its calls, notes its thread, waits ``delay_s``
    (seconds) so concurrent first requests overlap, and fails its first ``failures``
    calls."""

    def __init__(self, delay_s: float = 0.2, failures: int = 0) -> None:
        self.calls = 0
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self.failures = failures
        self.made: list[StandIn] = []

    def __call__(self) -> Any:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        threading.Event().wait(self.delay_s)
        if self.calls <= self.failures:
            raise ImportError("the SDK is broken")
        self.made.append(StandIn())
        return self.made[-1]


def test_concurrent_first_requests_build_one_server_off_the_event_loop() -> None:
    builds = Builds()
    door = McpDoor(builds)
    got: list[Any] = []

    async def main() -> None:
        loop_thread = threading.current_thread().name
        async with door.run():
            assert not door.built
            async with anyio.create_task_group() as requests:
                for _ in range(8):
                    requests.start_soon(_take, door, got)
            assert door.built and builds.calls == 1 and loop_thread not in builds.threads
            assert got == [builds.made[0]] * 8 and builds.made[0].running
            assert await door.server() is builds.made[0]
        assert not builds.made[0].running and builds.made[0].runs == 1  # left at shutdown

    anyio.run(main)


async def _take(door: McpDoor, into: list[Any]) -> None:
    into.append(await door.server())


def test_a_failed_build_raises_to_its_request_and_the_next_request_builds_again() -> None:
    builds = Builds(delay_s=0, failures=1)
    door = McpDoor(builds)

    async def main() -> None:
        async with door.run():
            with pytest.raises(ImportError, match="the SDK is broken"):
                await door.server()
            assert not door.built
            server = await door.server()
            assert builds.calls == 2 and server is builds.made[0] and server.running

    anyio.run(main)


def test_a_request_outside_the_doors_run_is_a_clear_error_and_builds_nothing() -> None:
    builds = Builds(delay_s=0)
    door = McpDoor(builds)

    async def before_and_after() -> None:
        with pytest.raises(RuntimeError, match=r"McpDoor.run\(\) is not entered"):
            await door.server()
        async with door.run():
            pass  # a server that got no MCP request shuts down without building one
        with pytest.raises(RuntimeError, match=r"McpDoor.run\(\) is not entered"):
            await door.server()

    anyio.run(before_and_after)
    assert builds.calls == 0


def test_a_shutdown_while_the_first_build_runs_is_a_clear_error() -> None:
    builds = Builds(delay_s=0.3)
    door = McpDoor(builds)
    errors: list[BaseException] = []

    async def main() -> None:
        async def first_request() -> None:
            try:
                await door.server()
            except RuntimeError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as requests:
            async with door.run():
                requests.start_soon(first_request)
                await anyio.sleep(0.05)  # the build is under way on its thread
        assert builds.calls == 1 and not builds.made[0].running

    anyio.run(main)
    assert [str(e) for e in errors] == ["the MCP door closed while its server was built (shutdown)"]
