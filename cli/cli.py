"""``sandpit`` command line (typer). Subcommands:

* ``sandpit image build [--force]`` — build the sandbox image offline (content-hash tag).
* ``sandpit image tag`` — print the tag sandboxes will use.
* ``sandpit demo`` — run a real environment class through a sandbox, printing each
  observation and the state.
* ``sandpit sandboxes [--reap]`` — list (or remove) every labeled sandbox container.

Exit codes: 0 success, 1 a Sandpit error (message on stderr), 2 usage error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from sandpit.executor import engine
from sandpit.executor.errors import ExecutorError
from sandpit.executor.images import build_image, sandbox_tag
from sandpit.executor.settings import get_image_settings, get_settings

app = typer.Typer(help="Sandpit: sandboxed execution of LLM-synthesized tool environments.",
                  no_args_is_help=True)
image_app = typer.Typer(help="Build and inspect the sandbox image.", no_args_is_help=True)
app.add_typer(image_app, name="image")
console = Console(stderr=True)


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


@image_app.command("build")
def image_build(force: bool = typer.Option(False, help="Rebuild even if the tag exists.")) -> None:
    """Build the sandbox image (debootstrap base when no registry answers); no-op if up to date."""
    try:
        client = engine.make_client(get_settings())
        with console.status("building sandbox image") as status:
            result = build_image(client, get_image_settings(), force=force,
                                 progress=lambda msg: (console.log(msg), status.update(msg)))
    except ExecutorError as exc:
        _fail(exc)
    typer.echo(result.tag)


@image_app.command("tag")
def image_tag() -> None:
    """Print the content-hash tag of the sandbox image (does not need Docker)."""
    typer.echo(get_settings().image or sandbox_tag(get_image_settings()))


@app.command("sandboxes")
def sandboxes(reap: bool = typer.Option(False, help="Remove sandboxes whose owning process is gone."),
              all_: bool = typer.Option(False, "--all", help="With --reap: remove every sandbox, even live ones.")) -> None:
    """List every container labeled sandpit=1 (optionally reap leftovers)."""
    try:
        client = engine.make_client(get_settings())
        found = engine.list_sandboxes(client)
        table = Table("container", "sandbox", "tenant", "owner", "status")
        for c in found:
            table.add_row(c.short_id, c.labels.get(engine.LABEL_SANDBOX, ""),
                          c.labels.get(engine.LABEL_TENANT, ""), c.labels.get(engine.LABEL_OWNER, ""), c.status)
        Console().print(table)
        if reap:
            typer.echo(f"removed {engine.reap(client, everything=all_)} container(s)")
    except ExecutorError as exc:
        _fail(exc)


@app.command("demo")
def demo(sessions: int = typer.Option(2, min=1, max=32, help="Concurrent episodes to run.")) -> None:
    """Run the bundled demo environment through real sandboxes and print what happens."""
    from sandpit.executor.demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    try:
        run_demo(sessions=sessions, console=Console())
    except ExecutorError as exc:
        _fail(exc)


if __name__ == "__main__":  # pragma: no cover
    app()


db_app = typer.Typer(help="Control database (SQLite file by default, PostgreSQL by URL).", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Apply database migrations (creates the SQLite file and its directory if needed)."""
    from sandpit.api.db import upgrade
    from sandpit.api.settings import get_api_settings

    url = get_api_settings().resolved_database_url()
    upgrade(url, revision)
    console.print(f"database at {revision}: {url}")


@app.command("serve")
def serve(host: str | None = typer.Option(None, help="Bind address (default SANDPIT_HOST)."),
          port: int | None = typer.Option(None, help="Port (default SANDPIT_PORT)."),
          log_level: str = typer.Option("warning", help="uvicorn log level.")) -> None:
    """Run the HTTP API (uvicorn). Refuses to start on an unmigrated database."""
    import uvicorn
    from sandpit.api.app import create_app
    from sandpit.api.db import make_engine, require_current
    from sandpit.api.errors import DatabaseNotMigrated
    from sandpit.api.settings import get_api_settings

    settings = get_api_settings()
    engine = make_engine(settings.resolved_database_url())
    try:
        require_current(engine)
    except DatabaseNotMigrated as exc:
        _fail(exc)
    finally:
        engine.dispose()
    uvicorn.run(create_app(settings), host=host or settings.host, port=port or settings.port,
                log_level=log_level, access_log=False)


import_app = typer.Typer(help="Import third-party environment suites through the API.", no_args_is_help=True)
app.add_typer(import_app, name="import")


@import_app.command("bfcl")
def import_bfcl(url: str = typer.Option("http://127.0.0.1:8600", help="Sandpit API base URL."),
                replay: bool = typer.Option(True, help="Replay every ground-truth trajectory in fresh envs."),
                limit: int | None = typer.Option(None, min=1, help="Replay only the first N episodes."),
                concurrency: int = typer.Option(4, min=1, max=64, help="Episodes replayed at once."),
                api_key: str | None = typer.Option(None, envvar="SANDPIT_API_KEY", help="API key, if required.")) -> None:
    """Register BFCL v4 multi-turn environments (bfcl-eval wheel) and replay their ground truth."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from sandpit.api.bfcl import BfclImportError, fetch_wheel, load_suite
    from sandpit.api.bfcl_replay import check_policy, register_environments, replay_suite
    from sandpit.api.client import Client, SandpitError

    try:
        suite = load_suite(fetch_wheel())
        with Client(url, api_key=api_key, timeout=120) as client:
            console.print(f"BFCL {suite.version}: {len(suite.environments)} environments, {len(suite.episodes)} episodes")
            findings = check_policy(suite)
            console.print("static policy `standard` on BFCL's modules: 0 errors; "
                          + ", ".join(f"{n} {rule}" for rule, n in sorted(findings.items())))
            ids = register_environments(client, suite)
            console.print(f"registered {len(ids)} environments (tools derived in sandboxes)")
            if not replay:
                return
            total = min(limit or len(suite.episodes), len(suite.episodes))
            with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console) as progress:
                task = progress.add_task("episodes", total=total)
                summary, _ = replay_suite(client, suite, ids, concurrency=concurrency, limit=limit,
                                          on_episode=lambda _r: progress.advance(task))
    except (BfclImportError, SandpitError) as exc:
        _fail(exc)
        return
    table = Table(title=f"BFCL {suite.version} multi-turn base replay")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("environments", str(summary.environments))
    table.add_row("episodes", str(summary.episodes))
    table.add_row("episodes failed (API errors)", str(len(summary.failed_episodes)))
    table.add_row("steps", str(summary.steps))
    for status_name, count in sorted(summary.statuses.items()):
        table.add_row(f"steps {status_name}", str(count))
    table.add_row("step latency p50 (ms)", f"{summary.step_p50_ms:.1f}")
    table.add_row("step latency p99 (ms)", f"{summary.step_p99_ms:.1f}")
    table.add_row("steps/s", f"{summary.steps_per_s:.0f}")
    table.add_row("wall time (s)", f"{summary.wall_s:.1f}")
    Console().print(table)
    for episode_id, refused in summary.refusals.items():
        console.print(f"[cyan]{episode_id}[/cyan] ground truth refused by the tool schema: {'; '.join(refused)[:300]}")
    for episode_id, error in list(summary.failed_episodes.items())[:10]:
        console.print(f"[yellow]{episode_id}[/yellow]: {error}")
    if summary.failed_episodes:
        raise typer.Exit(1)


@import_app.command("envscaler")
def import_envscaler(
        envs: Annotated[Path, typer.Option(help="EnvScaler environment metadata JSON.")],
        scenarios: Annotated[Path | None, typer.Option(help="EnvScaler scenario metadata JSON.")] = None,
        url: Annotated[str, typer.Option(help="Sandpit API base URL.")] = "http://127.0.0.1:8600",
        check: Annotated[bool, typer.Option(help="Instantiate each scenario and run its checks.")] = True,
        api_key: Annotated[str | None, typer.Option(envvar="SANDPIT_API_KEY", help="API key, if required.")] = None,
) -> None:
    """Import EnvScaler environments and scenarios through the API, validating each item."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from sandpit.api.client import Client, SandpitError
    from sandpit.api.envscaler import EnvScalerFileError, import_files, load_environments, load_scenarios

    try:
        total = len(load_environments(envs)) + (len(load_scenarios(scenarios)) if scenarios else 0)
        with Client(url, api_key=api_key, timeout=120) as client, Progress(
                TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=console) as progress:
            task = progress.add_task("items", total=total)
            reports = import_files(client, envs, scenarios, check=check,
                                   on_item=lambda _r: progress.advance(task))
    except (EnvScalerFileError, SandpitError) as exc:
        _fail(exc)
        return
    table = Table(title="EnvScaler import")
    for column in ("kind", "item", "result", "sandpit id", "reasons"):
        table.add_column(column, overflow="fold")
    for report in reports:
        colour = "green" if report.status == "imported" else "red"
        table.add_row(report.kind, report.key, f"[{colour}]{report.status}[/{colour}]", report.sandpit_id or "",
                      "; ".join(report.reasons)[:400])
    Console().print(table)
    rejected = sum(1 for r in reports if r.status == "rejected")
    console.print(f"{len(reports) - rejected} imported, {rejected} rejected")
