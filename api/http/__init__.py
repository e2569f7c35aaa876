"""The HTTP layer: the only code of ``sandpit.api`` that knows FastAPI, Starlette and ASGI.

Requests come in here, are authenticated and parsed, and go to one verb of ``envs`` or
one service; answers and errors go out here (error statuses from the one table in
:mod:`sandpit.api.errors`)."""
