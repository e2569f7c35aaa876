"""The web viewer: server-rendered pages under ``/ui`` over the API's own services.

::

    web.py         templates (autoescaped), security headers, sessions, form tokens, error pages
    viewer.py      the services the pages read (``app.state.viewer``)
    render.py      state values ($-tags readable), diffs and actions as escaped HTML
    highlight.py   environment source code highlighted (Pygments)
    account.py     sign in, sign out, home; the operator's tenants page
    episodes.py    episode listing, timeline, step diff, state at a step, comparison
    catalog.py     environments: listing with search, one environment
    evaluations.py evaluations: listing, one evaluation (live progress), one episode's result
    templates/     Jinja2 pages
    static/        the one stylesheet and the one script (no inline script or style)

:func:`install` adds the routes, the static files and the security headers to an app;
the app's lifespan puts a :class:`~.viewer.Viewer` on ``app.state.viewer``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from . import account, catalog, episodes, evaluations
from .viewer import Viewer
from .web import HERE, SecurityHeaders, error_page

__all__ = ["Viewer", "install"]


def install(app: FastAPI) -> None:
    """Mount the viewer on ``app``: ``/ui`` pages, ``/ui/static`` files, an HTML 404 page
    for any other path under ``/ui`` (registered last: it matches what nothing before it
    did), and the security headers on every ``/ui`` response."""
    for module in (account, episodes, catalog, evaluations):
        app.include_router(module.router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.add_api_route("/ui/{rest:path}", page_not_found, methods=["GET", "HEAD", "POST"], include_in_schema=False,
                      response_class=HTMLResponse)
    app.add_middleware(SecurityHeaders)


async def page_not_found(request: Request, rest: str) -> Response:
    """404 as the viewer's error page for a path under ``/ui`` that no page has (signed in
    or not: it says nothing about any tenant's objects); ``/ui/`` itself is the home page
    (307 to ``/ui``, as the router's trailing-slash redirect would answer)."""
    if not rest:
        return RedirectResponse("/ui", status_code=307)
    return error_page(request, 404, "There is no such page.")
