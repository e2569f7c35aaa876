"""The viewer's sign-in, sign-out, home and the operator's read-only tenants page.

Signing in posts an API key (a tenant's, or the operator key) with the sign-in form's
token (:data:`~.web.PRE_COOKIE`); a good key opens a session (cookie :data:`~.web.COOKIE`)
and redirects (303) to the page asked for; a bad one re-renders the form with 401 and a
message that never repeats the key. Signing out (a POST carrying the session's form
token) deletes the session's row and the cookie.
"""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from ...errors import Unauthorized
from .web import (
    COOKIE,
    PRE_COOKIE,
    OperatorDep,
    SessionDep,
    UiRoute,
    ViewerDep,
    form_of,
    local_path,
    new_pre_token,
    page,
    set_cookie,
)

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
Next = Annotated[str, Query(max_length=2000)]


def sign_in_form(request: Request, target: str, status: int = 200, message: str | None = None) -> Response:
    """The sign-in form with a fresh form token (also set as :data:`PRE_COOKIE`)."""
    token = new_pre_token()
    response = page(request, "signin.html", http_status=status, pre=token, next=local_path(target), message=message)
    set_cookie(response, request, PRE_COOKIE, token, max_age=3600)
    return response


@router.get("", response_class=HTMLResponse)
def home(session: SessionDep) -> Response:
    """``/ui``: the episodes (a tenant) or the tenants (the operator)."""
    return RedirectResponse("/ui/tenants" if session.operator else "/ui/episodes", status_code=303)


@router.get("/signin", response_class=HTMLResponse)
def sign_in_page(request: Request, next: Next = "/ui") -> Response:
    """The sign-in form (``next``: the local page to go to afterwards)."""
    return sign_in_form(request, next)


@router.post("/signin", response_class=HTMLResponse)
async def sign_in(request: Request, viewer: ViewerDep) -> Response:
    """Check the posted ``key`` as the API does and open a session; 401 with the form
    again for a bad key, 403 without the form's token."""
    fields = await form_of(request, request.cookies.get(PRE_COOKIE, ""))
    target = local_path(fields.get("next"))
    try:
        token, _ = await to_thread.run_sync(viewer.sessions.sign_in, fields.get("key", ""))
    except Unauthorized as exc:
        return sign_in_form(request, target, status=401, message=exc.message)
    response = RedirectResponse(target, status_code=303)
    set_cookie(response, request, COOKIE, token, max_age=int(viewer.sessions.ttl_s))
    response.delete_cookie(PRE_COOKIE, path="/ui")
    return response


@router.post("/signout", response_class=HTMLResponse)
async def sign_out(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    """End the session (the form's token required) and go back to the sign-in form."""
    await form_of(request, session.csrf)
    await to_thread.run_sync(viewer.sessions.end, request.cookies.get(COOKIE, ""))
    response = RedirectResponse("/ui/signin", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


@router.get("/tenants", response_class=HTMLResponse)
def tenants(request: Request, _: OperatorDep, viewer: ViewerDep) -> Response:
    """The operator's view: every tenant with its active keys and effective quotas
    (read-only: changes go through ``/v1/admin``)."""
    rows = [viewer.tenants.public(row, active) for row, active in viewer.tenants.list_tenants()]
    return page(request, "tenants.html", tenants=rows)
