"""``sandpit`` command line (typer). Subcommands:

* ``sandpit image build [--force]`` — build the sandbox image offline (content-hash tag).
* ``sandpit image tag`` — print the tag sandboxes will use.
* ``sandpit demo`` — run a real environment class through a sandbox, printing each
  observation and the state.
* ``sandpit sandboxes [--reap]`` — list (or remove) every labeled sandbox container.
* ``sandpit db upgrade``, ``sandpit serve`` — migrate the control database, run the API.
* ``sandpit import bfcl|envscaler``, ``sandpit bfcl fetch`` — third-party suites through the
  API (:mod:`sandpit.import_cli`).
* ``sandpit tenants ...`` — tenants and API keys with the operator key (:mod:`sandpit.tenants_cli`).
* ``sandpit environments|scenarios|envs ...`` — poke at a server's environments, scenarios
  and live envs through the Python client (``--url``/``SANDPIT_URL``,
  ``--api-key``/``SANDPIT_API_KEY``); see :mod:`sandpit.envs_cli`.
* ``sandpit synth``, ``sandpit eval``, ``sandpit rl`` — synthesis, batch evaluations, RL demo.

Exit codes: 0 success, 1 a Sandpit error (message on stderr), 2 usage error.

The console script is :func:`main`. On an install without the ``server`` extra the
server's commands (``image``, ``sandboxes``, ``demo``, ``db``, ``serve``, ``synth``) and the
commands of the other extras answer with the extra to install
(:mod:`sandpit.cli_extras`); the server's packages are imported only by those commands.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sandpit.cli_extras import fail_missing, missing_message
from sandpit.output import error, id_column, note, show

if TYPE_CHECKING:
    from sandpit.api.settings import ApiSettings
    from sandpit.executor.settings import ExecutorSettings

app = typer.Typer(help="Sandpit: sandboxed execution of LLM-synthesized tool environments.",
                  no_args_is_help=True)
image_app = typer.Typer(help="Build and inspect the sandbox image.", no_args_is_help=True)
app.add_typer(image_app, name="image")
console = Console(stderr=True)


def _fail(exc: Exception) -> NoReturn:
    error(console, exc)


@image_app.command("build")
def image_build(force: bool = typer.Option(False, help="Rebuild even if the tag exists.")) -> None:
    """Build the sandbox image (debootstrap base when no registry answers); no-op if up to date."""
    from sandpit.executor.docker import engine
    from sandpit.executor.docker.images import build_image
    from sandpit.executor.errors import ExecutorError
    from sandpit.executor.settings import get_image_settings, get_settings

    try:
        client = engine.make_client(get_settings())
        with console.status("building sandbox image") as status:
            def progress(message: str) -> None:
                console.log(message)
                status.update(message)

            result = build_image(client, get_image_settings(), force=force, progress=progress)
    except ExecutorError as exc:
        _fail(exc)
    typer.echo(result.tag)


@image_app.command("tag")
def image_tag() -> None:
    """Print the content-hash tag of the sandbox image (does not need a Docker Engine)."""
    from sandpit.executor.docker.images import sandbox_tag
    from sandpit.executor.settings import get_image_settings, get_settings

    typer.echo(get_settings().image or sandbox_tag(get_image_settings()))


@app.command("sandboxes")
def sandboxes(reap: bool = typer.Option(False, help="Remove sandboxes whose owner is dead (process gone or lease "
                                                    "expired) or not a Sandpit process."),
              all_: bool = typer.Option(False, "--all", help="With --reap: remove every sandbox, even live ones."),
              as_json: bool = typer.Option(False, "--json", help="Print the list as JSON: one object per "
                                                                 "container (container, sandbox, tenant, owner, "
                                                                 "status).")) -> None:
    """List every container labeled sandpit=1, full container ids (optionally reap leftovers)."""
    from sandpit.executor.docker import engine, owners
    from sandpit.executor.errors import ExecutorError
    from sandpit.executor.settings import get_settings

    try:
        settings = get_settings()
        client = engine.make_client(settings)
        rows = [{"container": c.id, "sandbox": c.labels.get(engine.LABEL_SANDBOX, ""),
                 "tenant": c.labels.get(engine.LABEL_TENANT, ""), "owner": c.labels.get(engine.LABEL_OWNER, ""),
                 "status": c.status} for c in engine.list_sandboxes(client)]
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
        else:
            table = Table()
            id_column(table, "container", [r["container"] for r in rows])
            id_column(table, "sandbox", [r["sandbox"] for r in rows])
            for column in ("tenant", "owner", "status"):
                table.add_column(column)
            for r in rows:
                table.add_row(*(Text(r[k]) for k in ("container", "sandbox", "tenant", "owner", "status")))
            show(Console(), table)
        if reap:
            leases = owners.LeaseView(settings.resolved_lease_dir(), time.time())
            typer.echo(f"removed {engine.reap(client, everything=all_, leases=leases)} container(s)")
    except ExecutorError as exc:
        _fail(exc)


@app.command("demo")
def demo(sessions: int = typer.Option(2, min=1, max=32, help="Concurrent episodes to run.")) -> None:
    """Run the bundled demo environment through real sandboxes and print what happens."""
    from sandpit.executor.errors import ExecutorError

    from .demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    try:
        run_demo(sessions=sessions, console=Console())
    except ExecutorError as exc:
        _fail(exc)


db_app = typer.Typer(help="Control database (SQLite file by default, PostgreSQL by URL).", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Apply database migrations (creates the SQLite file and its directory if needed)."""
    from sandpit.api.db.engine import upgrade
    from sandpit.api.settings import get_api_settings

    url = get_api_settings().resolved_database_url()
    upgrade(url, revision)
    note(console, f"database at {revision}: {masked_url(url)}")


def masked_url(url: str) -> str:
    """A database URL fit to print: as given when it holds no password, else
    SQLAlchemy's rendering with the password replaced by ``***``; a URL SQLAlchemy cannot
    parse is shown as ``<unparsable URL>`` (it might hold a password in a place we do not
    know)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        return url if parsed.password is None else parsed.render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparsable URL>"


def serve_summary(api: ApiSettings, executor: ExecutorSettings, backend: str, image: str, host: str,
                  port: int) -> list[tuple[str, str]]:
    """What ``sandpit serve`` prints before it serves, as ``(name, value)`` lines: the
    data directory, the database (password masked), the executor backend, the sandbox
    image and OCI runtime, the warm pool (sandboxes kept ready per tenant and profile) and
    the sandbox cap, the execution slots, and the URL it listens on."""
    where = f"[{host}]" if ":" in host else host
    return [("data dir", str(api.data_dir)), ("database", masked_url(api.resolved_database_url())),
            ("backend", backend), ("image", image), ("runtime", executor.runtime),
            ("warm pool", f"{executor.pool_size} per tenant and profile (max {executor.max_sandboxes} sandboxes)"),
            ("call slots", str(api.resolved_call_slots())), ("url", f"http://{where}:{port}")]


def serve_log_config(level: str) -> dict[str, Any]:
    """``logging.config.dictConfig`` settings of ``sandpit serve``: uvicorn's own, plus the
    ``sandpit`` loggers at ``level`` (a uvicorn level name: critical, error, warning,
    info, debug, trace) on uvicorn's stderr handler, and the access log
    (``sandpit.access``: one line per request at INFO, :mod:`sandpit.api.http.access_log`) on
    stdout with a timestamp. Raises KeyError for an unknown level name."""
    from uvicorn.config import LOG_LEVELS, LOGGING_CONFIG

    number = LOG_LEVELS[level.lower()]
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["sandpit_access"] = {"()": "sandpit.api.http.access_log.AccessFormatter"}
    config["handlers"]["sandpit_access"] = {"formatter": "sandpit_access", "class": "logging.StreamHandler",
                                            "stream": "ext://sys.stdout"}
    config["loggers"]["sandpit"] = {"handlers": ["default"], "level": number, "propagate": False}
    config["loggers"]["sandpit.access"] = {"handlers": ["sandpit_access"], "level": number, "propagate": False}
    return config


NOFILE_CEILING = 1 << 20
"""Highest soft RLIMIT_NOFILE ``sandpit serve`` asks for when its hard limit is unlimited
(Linux's default ``fs.nr_open``)."""


def raise_open_files() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (at most
    :data:`NOFILE_CEILING`) and return the soft limit it has then. The server holds a
    descriptor per client connection and per sandbox channel: a thousand stepping clients
    would exhaust the common soft limit of 1,024, whose hard limit allows far more. A
    limit that cannot be raised is left as it is (never lowered)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_CEILING if hard == resource.RLIM_INFINITY else min(hard, NOFILE_CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@app.command("serve")
def serve(host: str | None = typer.Option(None, help="Bind address (default SANDPIT_HOST)."),
          port: int | None = typer.Option(None, help="Port (default SANDPIT_PORT)."),
          log_level: str = typer.Option("warning", envvar="SANDPIT_LOG_LEVEL",
                                        help="Log level of uvicorn and Sandpit: critical, error, warning, info "
                                             "(adds one access log line per request, unless SANDPIT_ACCESS_LOG="
                                             "false), debug, trace.")) -> None:
    """Run the HTTP API (uvicorn), its soft limit of open files raised to the hard one
    (:func:`raise_open_files`), idle keep-alive connections kept ``SANDPIT_KEEP_ALIVE_S``
    seconds. Refuses to start on an unmigrated database or with a placeholder operator key."""
    from pydantic import ValidationError
    from sandpit.api.settings import get_api_settings
    from sandpit.executor.config import configured

    try:
        log_config = serve_log_config(log_level)
    except KeyError:
        raise typer.BadParameter(f"unknown log level {log_level!r}; one of critical, error, warning, info, "
                                 "debug, trace", param_hint="--log-level") from None
    try:
        settings = get_api_settings()
        backend = configured().type
    except ValidationError as exc:  # e.g. a placeholder SANDPIT_OPERATOR_KEY: refuse to start
        _fail(RuntimeError("invalid settings: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())))
    # the application and the server only once the settings are known to be good: a refusal
    # answers without importing them (seconds of imports)
    import uvicorn
    from sandpit.api.app import create_app, tune_gc
    from sandpit.api.db.engine import make_engine, require_current
    from sandpit.api.errors import DatabaseNotMigrated
    from sandpit.api.http.coalesce import CoalescingHttpProtocol
    from sandpit.executor.docker.images import sandbox_tag
    from sandpit.executor.settings import get_image_settings, get_settings

    executor_settings = get_settings()
    image = executor_settings.image or sandbox_tag(get_image_settings())
    bind_host, bind_port = host or settings.host, port or settings.port
    for name, value in serve_summary(settings, executor_settings, backend, image, bind_host, bind_port):
        note(console, (f"{name:<11}", "bold"), value)
    engine = make_engine(settings.resolved_database_url())
    try:
        require_current(engine)
    except DatabaseNotMigrated as exc:
        _fail(exc)
    finally:
        engine.dispose()
    note(console, (f"{'open files':<11}", "bold"), str(raise_open_files()))
    app = create_app(settings)
    tune_gc(settings.gc_young_threshold, app)
    uvicorn.run(app, host=bind_host, port=bind_port, log_config=log_config,
                log_level=log_level.lower(), access_log=False,  # ours: sandpit.access
                timeout_keep_alive=settings.keep_alive_s,
                timeout_graceful_shutdown=15, http=CoalescingHttpProtocol)  # one socket write per response


def _unavailable(name: str, exc: ModuleNotFoundError) -> None:
    """Register ``sandpit <name>`` as a command that answers only with the extra it needs
    (any arguments accepted, so ``sandpit synth run ...`` gets the same one line); re-raises
    ``exc`` when no extra provides the missing module."""
    message = missing_message(name, exc)
    if message is None:
        raise exc
    summary = message.partition(" needs ")[2].partition(": pip install")[0]  # no brackets: help is rich markup

    @app.command(name, help=f"Needs {summary}.", add_help_option=False,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def unavailable(ctx: typer.Context) -> None:
        fail_missing(name, exc)


def _register_feature_apps() -> None:
    """Sub-apps that live in their own modules (``sandpit import``, ``sandpit bfcl``,
    ``sandpit tenants``, ``sandpit synth``, ``sandpit eval``, ``sandpit environments``,
    ``sandpit scenarios``, ``sandpit envs``, ``sandpit rl``, ``sandpit cluster``). The
    modules of ``import``/``bfcl`` and ``synth`` import their extras' packages; without
    them those names answer with the extra to install (:func:`_unavailable`)."""
    from sandpit.cluster_cli import cluster_app
    from sandpit.environments_cli import environments_app
    from sandpit.envs_cli import envs_app
    from sandpit.eval_cli import eval_app
    from sandpit.rl_cli import rl_app
    from sandpit.scenarios_cli import scenarios_app
    from sandpit.tenants_cli import tenants_app

    try:
        from sandpit.import_cli import bfcl_app, import_app
    except ModuleNotFoundError as exc:
        _unavailable("import", exc)
        _unavailable("bfcl", exc)
    else:
        app.add_typer(import_app, name="import")
        app.add_typer(bfcl_app, name="bfcl")
    app.add_typer(tenants_app, name="tenants")
    app.add_typer(cluster_app, name="cluster")
    try:
        from sandpit.synth_cli import synth_app
    except ModuleNotFoundError as exc:
        _unavailable("synth", exc)
    else:
        app.add_typer(synth_app, name="synth")
    app.add_typer(eval_app, name="eval")
    app.add_typer(environments_app, name="environments")
    app.add_typer(scenarios_app, name="scenarios")
    app.add_typer(envs_app, name="envs")
    app.add_typer(rl_app, name="rl")


_register_feature_apps()


def main() -> None:
    """The ``sandpit`` console script: runs :data:`app`; a command that imports a package of
    an extra that is not installed exits 1 with the one line of
    :func:`sandpit.cli_extras.missing_message` (naming ``sys.argv[1]``) instead of a
    traceback. Any other missing module is raised."""
    try:
        app()
    except ModuleNotFoundError as exc:  # raised out of click: typer.Exit would not be handled here
        message = missing_message(next((arg for arg in sys.argv[1:] if not arg.startswith("-")), ""), exc)
        if message is None:
            raise
        typer.echo(message, err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":  # pragma: no cover
    main()
