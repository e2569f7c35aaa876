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
