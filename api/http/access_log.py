"""The access log: one line per HTTP request on the ``sandpit.access`` logger at INFO.

A line reads ``POST /v1/envs/{env_id}/step 200 1.84ms tenant=acme``: the method, the
route's path *template* (``-`` for a request no route matched: a raw path is text the
client chose), the status sent (``-`` when none was: the client went away), the
milliseconds from the request's arrival at the app to the end of its response, and the
tenant whose API key authenticated it (``-`` for none: health, metrics, admin, a refused
key). Never the query string, a header or a key.

:class:`AccessLog` wraps the whole application, the doors (:mod:`.step`, :mod:`.batch_step`,
:mod:`.create_env`) included, so every request gets its line whichever door answered it.
Who authenticated is noted in the request's ASGI scope by :func:`note_tenant`, called
where a key is checked (``deps.get_caller``, the doors); a door, which has no
router, names its route with :func:`note_route`. When the logger does not
emit INFO (``sandpit serve --log-level warning``, the default) a request costs one level
check; ``ApiSettings.access_log`` false removes the wrapper altogether. The line is
formatted once, by the handler, from a constant format and five values.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("sandpit.access")

TENANT_KEY = "sandpit.tenant"
"""ASGI scope key holding the authenticated tenant's id (:func:`note_tenant`)."""
ROUTE_KEY = "sandpit.route"
"""ASGI scope key holding the path template of a request answered without the router."""
FORMAT = "%s %s %s %.2fms tenant=%s"


class AccessFormatter(logging.Formatter):
    """``<local time, to the millisecond> <message>`` (``2026-01-31 14:05:09,123 POST ...``),
    the time's seconds rendered once per second rather than once per line, since
    ``strftime`` is a large part of a line's cost.
    ``sandpit serve`` formats ``sandpit.access`` with it."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(message)s")
        self._second = -1
        self._rendered = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - stdlib name
        """``YYYY-MM-DD HH:MM:SS,mmm`` of ``record.created`` in local time (``datefmt`` ignored)."""
        second = int(record.created)
        if second != self._second:  # handlers call format under their lock: no race here
            self._rendered = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
            self._second = second
        return f"{self._rendered},{int(record.msecs):03d}"


def note_tenant(scope: Scope, tenant: str) -> None:
    """Record that ``tenant``'s key authenticated the request of ``scope`` (for its line)."""
    scope[TENANT_KEY] = tenant


def note_route(scope: Scope, path_template: str) -> None:
    """Record the path template of a request answered without the router (by a door)."""
    scope[ROUTE_KEY] = path_template


def template(scope: Scope) -> str:
    """The path template of the route that took the request (Starlette's router puts the
    route in ``scope["route"]``), else the one noted by :func:`note_route`, else ``-``."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    noted = scope.get(ROUTE_KEY)
    return noted if isinstance(noted, str) else "-"


class AccessLog:
    """ASGI middleware writing one :data:`log` line per HTTP request (module docstring).

    Args:
        app: the application it wraps (for Sandpit: the doors and FastAPI behind them).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        except Exception:
            if status is None:
                status = 500  # what the server answers for an exception no handler took
            raise
        finally:
            log.info(FORMAT, scope["method"], template(scope), "-" if status is None else status,
                     (time.perf_counter() - started) * 1000.0, scope.get(TENANT_KEY, "-"))

