"""The viewer's HTTP plumbing: templates, the security headers, the signed-in session of a
request, form tokens (CSRF) and error pages.

* Templates are Jinja2 with autoescaping on for every template: LLM-written text is
  escaped wherever it lands. Values that need structure come as ``Markup`` from
  :mod:`.render`, which escapes every piece of text itself.
* Every ``/ui`` response carries :data:`SECURITY_HEADERS`: a Content-Security-Policy
  allowing scripts and styles only from ``/ui/static`` (no inline script or style),
  ``frame-ancestors 'none'``, ``nosniff`` and ``Referrer-Policy: same-origin``.
* The session cookie (:data:`COOKIE`) holds a random token; it is ``HttpOnly``,
  ``SameSite=Strict``, ``Path=/ui`` and ``Secure`` on HTTPS. Every POST must carry the
  session's form token in a ``csrf`` field (the sign-in form: the pre-session token of
  :data:`PRE_COOKIE`), else 403.
* Routes use :class:`UiRoute`: an ``ApiError`` (404 for another tenant's object, ...) or a
  malformed query becomes an HTML error page with the API's status; a request without a
  live session is redirected (303) to the sign-in page.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, cast
from urllib.parse import parse_qs, quote

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import ApiError, status_of
from ...services.quotas import TenantContext
from ...services.ui_sessions import UiSession
from .render import action_text, milliseconds, value_html
from .viewer import Viewer

HERE = Path(__file__).resolve().parent
COOKIE = "sandpit_ui"
"""The session cookie's name."""
PRE_COOKIE = "sandpit_ui_pre"
"""The sign-in form's token cookie (login CSRF: the form posts the same value back)."""
FORM_MAX_BYTES = 8192
"""Largest form body the viewer reads, bytes (a longer one is refused with 413)."""
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
"""Headers on every ``/ui`` response (static files too)."""

templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                        trim_blocks=True, lstrip_blocks=True)
"""The viewer's templates: autoescaping on whatever the file name."""
templates.globals.update(value_html=value_html, action_text=action_text, milliseconds=milliseconds)


class SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every response under ``/ui``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/ui"):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.decode("latin-1").lower()
                           not in SECURITY_HEADERS]
                headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class SignInRequired(Exception):
    """The request has no live viewer session (answered by a redirect to sign in)."""


class Refused(Exception):
    """A POST without the right form token, or a malformed form (answered 403 or 413)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def viewer(request: Request) -> Viewer:
    """The app's :class:`Viewer` (created in the lifespan)."""
    return cast(Viewer, request.app.state.viewer)


def session_of(request: Request) -> UiSession:
    """The request's live session. Raises SignInRequired."""
    found = viewer(request).sessions.lookup(request.cookies.get(COOKIE))
    if found is None:
        raise SignInRequired()
    request.state.ui_session = found
    return found


def tenant_of(session: Annotated[UiSession, Depends(session_of)]) -> TenantContext:
    """The tenant of the request's session. Raises Refused (403) for the operator, whose
    session opens the tenants and quotas pages only."""
    if session.context is None:
        raise Refused(403, "the operator sees tenants and quotas only; sign in with a tenant's API key")
    return session.context


def operator_of(session: Annotated[UiSession, Depends(session_of)]) -> UiSession:
    """The request's session when it is the operator's. Raises Refused (403)."""
    if not session.operator:
        raise Refused(403, "this page is the operator's")
    return session


SessionDep = Annotated[UiSession, Depends(session_of)]
TenantDep = Annotated[TenantContext, Depends(tenant_of)]
OperatorDep = Annotated[UiSession, Depends(operator_of)]
ViewerDep = Annotated[Viewer, Depends(viewer)]


async def form_of(request: Request, expected: str) -> dict[str, str]:
    """The urlencoded form of a POST (first value of each field) after checking its
    ``csrf`` field equals ``expected`` (constant time). Raises Refused: 413 over
    :data:`FORM_MAX_BYTES`, 403 without the right token."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX_BYTES:
            raise Refused(413, "form too large")
    fields = {name: values[0] for name, values in parse_qs(body.decode("utf-8", "replace")).items()}
    given = fields.get("csrf", "")
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Refused(403, "the form's token is missing or stale: reload the page and try again")
    return fields


def page(request: Request, template: str, http_status: int = 200, **context: Any) -> HTMLResponse:
    """``template`` rendered with ``context`` plus ``session`` (the request's, if any) and
    ``request``, answered with ``http_status``."""
    html = templates.get_template(template).render(request=request, session=getattr(request.state, "ui_session",
                                                                                    None), **context)
    return HTMLResponse(html, status_code=http_status)


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """The error page (``status`` and ``message`` shown escaped)."""
    return page(request, "error.html", http_status=status, status_code=status, message=message)


def sign_in_redirect(request: Request) -> RedirectResponse:
    """303 to the sign-in page, remembering the path asked for (``next``, a local path)."""
    wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/ui/signin?next={quote(wanted, safe='')}", status_code=303)


def local_path(target: str | None) -> str:
    """``target`` when it is a path under ``/ui`` on this site, else ``/ui`` (no open
    redirect: ``//host``, schemes and backslashes are refused)."""
    if not target or not target.startswith("/ui") or target.startswith("//") or "\\" in target:
        return "/ui"
    return target


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int | None) -> None:
    """An ``HttpOnly``, ``SameSite=Strict``, ``Path=/ui`` cookie, ``Secure`` on HTTPS."""
    response.set_cookie(name, value, max_age=max_age, path="/ui", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


def new_pre_token() -> str:
    """A random sign-in form token (hex, 64 characters)."""
    return secrets.token_hex(32)


class UiRoute(APIRoute):
    """A viewer route: errors become HTML pages (see the module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler of the route, wrapped: sign-in redirect, refusals, API
        errors and malformed parameters answered as HTML pages."""
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired:
                return sign_in_redirect(request)
            except Refused as exc:
                return error_page(request, exc.status, exc.message)
            except ApiError as exc:
                return error_page(request, status_of(exc)[0], exc.message)
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                where = ".".join(str(p) for p in first.get("loc", ()))
                return error_page(request, 422, f"{where}: {first.get('msg', 'invalid')}")

        return handle
