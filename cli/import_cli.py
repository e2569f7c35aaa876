"""``sandpit import bfcl|envscaler`` (third-party suites through the API, with
:mod:`sandpit.importers`) and ``sandpit bfcl fetch`` (cache the BFCL wheel; ``scripts/setup``
runs it so tests and imports never need the network).

Exit codes: 0 success, 1 an import or API error (message on stderr), 2 usage error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sandpit.client import Client, SandpitError
from sandpit.importers.bfcl import (
    BFCL_VERSION,
    CACHE_ENV,
    BfclImportError,
    BfclSuite,
    fetch_wheel,
    load_suite,
)
from sandpit.importers.bfcl.replay import check_policy, register_environments, replay_suite
from sandpit.importers.bfcl.scenarios import make_scenarios, replay_items
from sandpit.importers.envscaler import EnvScalerFileError, import_files, load_environments, load_scenarios

__all__ = ["bfcl_app", "import_app"]

import_app = typer.Typer(help="Import third-party environment suites through the API.", no_args_is_help=True)
bfcl_app = typer.Typer(help="The BFCL wheel the importer reads.", no_args_is_help=True)
console = Console(stderr=True)


def _fail(exc: Exception) -> NoReturn:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


@import_app.command("bfcl")
def import_bfcl(url: str = typer.Option("http://127.0.0.1:8600", help="Sandpit API base URL."),
                replay: bool = typer.Option(True, help="Replay every ground-truth trajectory in fresh envs."),
                limit: int | None = typer.Option(None, min=1, help="Replay only the first N episodes."),
                concurrency: int = typer.Option(4, min=1, max=64, help="Episodes replayed at once."),
                api_key: str | None = typer.Option(None, envvar="SANDPIT_API_KEY", help="Tenant API key."),
                scenarios: Annotated[Path | None, typer.Option(
                    help="Also make one scenario per episode (state checks from the ground truth) and "
                         "write the replay evaluation input (JSON lines) to this file.")] = None) -> None:
    """Register BFCL v4 multi-turn environments (bfcl-eval wheel) and replay their ground truth."""
    try:
        suite = load_suite(fetch_wheel())
        with Client(url, api_key=api_key, timeout=120) as client:
            console.print(f"BFCL {suite.version}: {len(suite.environments)} environments, {len(suite.episodes)} episodes")
            findings = check_policy(client, suite)
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
            if scenarios is not None:
                _bfcl_scenarios(client, suite, ids, scenarios, limit, concurrency)
    except (BfclImportError, SandpitError) as exc:
        _fail(exc)
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
    for episode_id, error in list(summary.failed_episodes.items())[:10]:
        console.print(f"[yellow]{episode_id}[/yellow]: {error}")
    if summary.failed_episodes:
        raise typer.Exit(1)


def _bfcl_scenarios(client: Client, suite: BfclSuite, ids: dict[str, str], path: Path, limit: int | None,
                    concurrency: int) -> None:
    """``import bfcl --scenarios FILE``: scenarios per episode, evaluation input to FILE."""
    total = min(limit or len(suite.episodes), len(suite.episodes))
    with Progress(TextColumn("scenarios"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("scenarios", total=total)
        made = make_scenarios(client, suite, ids, concurrency=concurrency, limit=limit,
                              on_episode=lambda _m: progress.advance(task))
    items = replay_items(made)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    failed = [m for m in made if m.error]
    console.print(f"{len(items)} scenarios (BFCL state checks); replay evaluation input: {path}"
                  + (f"; {len(failed)} failed, e.g. {failed[0].episode.id}: {failed[0].error}" if failed else ""))


@import_app.command("envscaler")
def import_envscaler(
        envs: Annotated[Path, typer.Option(help="EnvScaler environment metadata JSON.")],
        scenarios: Annotated[Path | None, typer.Option(help="EnvScaler scenario metadata JSON.")] = None,
        url: Annotated[str, typer.Option(help="Sandpit API base URL.")] = "http://127.0.0.1:8600",
        check: Annotated[bool, typer.Option(help="Instantiate each scenario and run its checks.")] = True,
        api_key: Annotated[str | None, typer.Option(envvar="SANDPIT_API_KEY", help="API key, if required.")] = None,
) -> None:
    """Import EnvScaler environments and scenarios through the API, validating each item."""
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


@bfcl_app.command("fetch", help=f"Download bfcl-eval=={BFCL_VERSION} into the cache if missing "
                                 "(pip download, sha256-checked); print the wheel's path.")
def bfcl_fetch(cache: Annotated[Path | None, typer.Option(
        help=f"Cache directory (default: ${CACHE_ENV} or ~/.cache/sandpit/bfcl).")] = None) -> None:
    """Cache the BFCL wheel; exit 1 with the reason on stderr when it cannot be had."""
    try:
        typer.echo(fetch_wheel(cache))
    except BfclImportError as exc:
        typer.echo(f"bfcl: {exc}", err=True)
        raise typer.Exit(1) from None
