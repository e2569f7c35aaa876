"""The MCP endpoints' routes and the door that builds their server on first use.

The MCP server (:class:`.mcp.McpServer`) is built on the ``mcp`` SDK, whose import costs
about 0.5 s of CPU (a quarter of the API's own import, measured on a 2-core machine): a
server that never gets an MCP request should not pay it at every start. The routes
(:data:`ENV_TEMPLATE`, :data:`SCENARIO_TEMPLATE`) are registered at start; the first MCP
request imports the SDK on a worker thread, builds the server and starts its session
manager in the door's task group (:meth:`McpDoor.server`); later requests go straight
to it. What the endpoints answer is :mod:`.mcp`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Literal, Protocol

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus
from starlette.types import Receive, Scope, Send

ENV_TEMPLATE = "/v1/envs/{env_id}/mcp"
"""The env endpoint's path template."""
SCENARIO_TEMPLATE = "/v1/scenarios/{scenario_id}/mcp"
"""The scenario endpoint's path template."""


class ServesMcp(Protocol):
    """What the door needs of :class:`.mcp.McpServer` (a protocol, so this module never
    imports the SDK): ``run()`` entered while it serves, and the two endpoints."""

    def run(self) -> AbstractAsyncContextManager[None]:
        """Serve while entered."""

    async def env(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/v1/envs/{env_id}/mcp``."""

    async def scenario(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/v1/scenarios/{scenario_id}/mcp``."""


class McpDoor:
    """Builds the MCP server when the first MCP request needs it and serves it while
    :meth:`run` is entered (the app's lifespan enters it).

    Args:
        build: makes the server; it imports :mod:`.mcp` (and so the SDK) itself, and runs
            on a worker thread so the import never holds the event loop.
    """

    def __init__(self, build: Callable[[], ServesMcp]) -> None:
        self._build = build
        self._server: ServesMcp | None = None
        self._tasks: TaskGroup | None = None
        self._lock: anyio.Lock | None = None
        self._stop: anyio.Event | None = None

    @property
    def built(self) -> bool:
        """Whether an MCP request has built the server yet."""
        return self._server is not None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Serve while entered. On exit the server's session manager (if one was started)
        is left, which ends the requests' server tasks, as the SDK's managers do."""
        self._lock, self._stop = anyio.Lock(), anyio.Event()
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                self._tasks = None
                self._stop.set()
        self._server = None

    async def server(self) -> ServesMcp:
        """The MCP server, built and started by the first caller (the others wait for it).

        Raises:
            RuntimeError: :meth:`run` is not entered (before start-up or after shutdown).
            Whatever ``build`` raises; the next request tries again.
        """
        if self._server is not None:
            return self._server
        if self._lock is None or self._tasks is None:
            raise RuntimeError("McpDoor.run() is not entered (the app's lifespan enters it)")
        async with self._lock:
            if self._server is None:
                server = await anyio.to_thread.run_sync(self._build)
                tasks = self._tasks
                if tasks is None:
                    raise RuntimeError("the MCP door closed while its server was built (shutdown)")
                await tasks.start(self._serve, server)
                self._server = server
        return self._server

    async def _serve(self, server: ServesMcp, *, task_status: TaskStatus[None]) -> None:
        """Keep ``server.run()`` entered until :meth:`run` exits."""
        assert self._stop is not None
        async with server.run():
            task_status.started()
            await self._stop.wait()


class McpEndpoint:
    """The ASGI app of one endpoint for the router (an object, so Starlette hands it the
    raw request): it serves through the app's MCP door (``app.state.mcp``, made in the
    lifespan). ``kind``: ``env`` or ``scenario``."""

    def __init__(self, kind: Literal["env", "scenario"]) -> None:
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door: McpDoor = scope["app"].state.mcp
        server = await door.server()
        await (server.env if self.kind == "env" else server.scenario)(scope, receive, send)
