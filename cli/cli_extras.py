"""The ``sandpit`` command on an install without some extras: which extra provides a missing
package, and the one line a command answers with instead of a traceback.

``pip install sandpit`` is the client (``sandpit.client`` and the commands that only talk to
a server over HTTP: ``environments``, ``scenarios``, ``envs``, ``eval``, ``tenants``,
``cluster``). The server's commands (``serve``, ``db``, ``image``, ``demo``, ``sandboxes``,
``synth``) need ``sandpit[server]``, ``import``/``bfcl`` need ``sandpit[importers]`` and
``rl`` needs ``sandpit[rl]`` or ``sandpit[gem]`` (``pyproject.toml`` lists each extra).
Such a command, run without its extra, prints on stderr::

    error: `sandpit serve` needs the 'server' extra (docker is not installed): pip install 'sandpit[server]'

and exits with status 1. A missing module that no extra provides is a bug and is raised
as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NoReturn

import typer

__all__ = ["EXTRA_OF_MODULE", "extra_for", "fail_missing", "missing_message"]

EXTRA_OF_MODULE: Mapping[str, str] = MappingProxyType({
    # the server (its modules import these at module level)
    "alembic": "server",
    "cachetools": "server",
    "cryptography": "server",
    "docker": "server",
    "fastapi": "server",
    "ijson": "importers",
    "jinja2": "server",  # api/http/ui/: the web viewer's templates
    "jsonschema": "server",
    "markupsafe": "server",  # api/http/ui/: escaped HTML of the viewer's values
    "mcp": "server",  # api/http/mcp.py: the MCP servers
    "openai": "server",  # synthesis (`sandpit synth`) and the API; sandpit.client.llm alone: `llm`
    "orjson": "server",
    "prometheus_client": "server",
    "requests": "server",  # executor/docker/engine.py (docker's own HTTP library)
    "pydantic_settings": "server",
    "RestrictedPython": "server",
    "sqlalchemy": "server",
    "starlette": "server",
    "uvicorn": "server",
    # the adapters and backends
    "gem": "gem",
    "gymnasium": "rl",
    "openenv": "openenv",  # openenv-core's client (cli/rl_doors.py)
    "numpy": "rl",
    "skyrl_gym": "skyrl",
    "grpc": "ray",
    "ray": "ray",
    "psycopg": "postgres",
    "verifiers": "verifiers",  # client/verifiers_env.py
    "datasets": "verifiers",  # client/verifiers_env.py: the dataset of scenarios (verifiers requires it)
})
"""Top-level import name -> the extra (``pyproject.toml``) whose install provides it.
``tests/unit/cli/test_cli_extras.py`` holds it to the extras' requirements."""


def extra_for(exc: ModuleNotFoundError) -> str | None:
    """The extra that provides the module ``exc`` did not find (``exc.name``, e.g.
    ``"docker.errors"`` -> ``"server"``); None when no extra provides it."""
    return EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])


def missing_message(command: str, exc: ModuleNotFoundError) -> str | None:
    """The one-line answer of ``sandpit <command>`` to ``exc`` (no rich markup: the brackets
    of ``sandpit[server]`` are printed as they are); None when no extra provides the module."""
    extra = extra_for(exc)
    if extra is None:
        return None
    module = (exc.name or "").partition(".")[0]
    where = f"`sandpit {command}`" if command else "this command"
    return (f"error: {where} needs the '{extra}' extra ({module} is not installed): "
            f"pip install 'sandpit[{extra}]'")


def fail_missing(command: str, exc: ModuleNotFoundError) -> NoReturn:
    """Print :func:`missing_message` on stderr and exit with status 1; re-raise ``exc`` when
    no extra provides the missing module."""
    message = missing_message(command, exc)
    if message is None:
        raise exc
    typer.echo(message, err=True)
    raise typer.Exit(1)
