"""``sandpit import bfcl|envscaler`` (third-party suites through the API, with
:mod:`sandpit.importers`) and ``sandpit bfcl fetch`` (cache the BFCL wheel; ``scripts/setup``
runs it so tests and imports never need the network).

Exit codes: 0 success, 1 an import or API error (message on stderr), 2 usage error.
"""

from __future__ import annotations

import enum
import itertools
import json
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
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
from sandpit.importers.envscaler import EnvScalerFileError, ImportReport, import_release
from sandpit.output import error, note

__all__ = ["bfcl_app", "import_app"]

import_app = typer.Typer(help="Import third-party environment suites through the API.", no_args_is_help=True)
bfcl_app = typer.Typer(help="The BFCL wheel the importer reads.", no_args_is_help=True)
console = Console(stderr=True)


class Policy(enum.StrEnum):
    """Static policies (``sandpit.policy``)."""

    strict = "strict"
    standard = "standard"
    audit = "audit"


def _fail(exc: Exception) -> NoReturn:
    error(console, exc)


@import_app.command("bfcl")
def import_bfcl(url: str = typer.Option("http://127.0.0.1:8600", envvar="SANDPIT_URL", help="Sandpit API base URL."),
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
            note(console, f"BFCL {suite.version}: {len(suite.environments)} environments, {len(suite.episodes)} episodes")
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
    for episode_id, failure in list(summary.failed_episodes.items())[:10]:
        note(console, (episode_id, "yellow"), f": {failure}")
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
    note(console, f"{len(items)} scenarios (BFCL state checks); replay evaluation input: {path}"
         + (f"; {len(failed)} failed, e.g. {failed[0].episode.id}: {failed[0].error}" if failed else ""))


ENVSCALER_HELP = (
    "Import an EnvScaler release (environments and RL/SFT scenarios) through the API.\n\n"
    "Every environment is registered (static --policy, tools derived in a sandbox, the released tools "
    "as the tools the agent is shown, checked against the class); every scenario is stored with "
    "episode_profile envscaler and, with --check, instantiated and its checks run on the initial "
    "state. Re-importing reuses identical items. Files are read one record at a time.")

ENVSCALER_EPILOG = """\b
Files: a JSON list of records, a JSON object keyed by id, or JSON Lines
(*.jsonl). tools, init_config, checklist, checklist_with_func and
constraints_rules may be JSON or JSON text. A scenario's env_id is a
record's env_id, or an index into the environment list.

\b
Environment record (EnvScaler-191-Env):
  {"env_id": "env_001", "env_class_name": "Clinic",
   "env_class_code": "class Clinic:\\n  def __init__(self, c): ...",
   "environment_introduction": "A clinic's front desk.",
   "constraints_rules": ["A patient needs an id."],
   "tools": [{"type": "function", "function": {"name": "book",
     "description": "Book a visit.",
     "parameters": {"type": "object", "required": ["patient_id"],
       "properties": {"patient_id": {"type": "string"}}}}}]}

\b
Scenario record (EnvScaler-RL-Scenario; SFT ones lack checklist_with_func):
  {"env_id": "env_001", "env_class_name": "Clinic", "task_id": "t1",
   "task": "Book a visit for P1.",
   "init_config": "{\\"patients\\": {\\"P1\\": {}}}",
   "checklist": ["P1 has a visit"],
   "checklist_with_func": [{"check_item": "P1 has a visit",
     "check_func": "def check_func(final_state):\\n  return ..."}]}

\b
Example:
  sandpit import envscaler --envs 191_env_metadata.json \\
    --scenarios rl_scenarios.json --scenarios sft_scenarios.json

\b
Exit status: 0 done (refused items are listed), 1 a file or the API
failed, 2 usage.
"""


@import_app.command("envscaler", help=ENVSCALER_HELP, epilog=ENVSCALER_EPILOG)
def import_envscaler(
        envs: Annotated[Path, typer.Option(help="Environment file (EnvScaler-191-Env's metadata).")],
        scenarios: Annotated[list[Path] | None, typer.Option(
            help="Scenario file (RL or SFT); repeat for several.")] = None,
        url: Annotated[str, typer.Option(envvar="SANDPIT_URL", help="Sandpit API base URL.")] = "http://127.0.0.1:8600",
        policy: Annotated[Policy, typer.Option(help="Static policy environments are registered under.")] =
        Policy.standard,
        check: Annotated[bool, typer.Option(help="Instantiate each new scenario and run its checks.")] = True,
        limit: Annotated[int | None, typer.Option(
            min=1, help="Import only the first N scenarios (and their environments); without "
                        "--scenarios, the first N environments.")] = None,
        concurrency: Annotated[int, typer.Option(min=1, max=64, help="Scenarios imported at once.")] = 4,
        json_output: Annotated[bool, typer.Option(
            "--json", help="Print the report as JSON on stdout (no table, no progress bar).")] = False,
        api_key: Annotated[str | None, typer.Option(envvar="SANDPIT_API_KEY", help="API key, if required.")] = None,
) -> None:
    """See ENVSCALER_HELP."""
    paths = [envs, *(scenarios or [])]
    total = sum(p.stat().st_size for p in paths if p.is_file())
    started = time.monotonic()
    try:
        with Client(url, api_key=api_key, timeout=300) as client, Progress(
                TextColumn("importing"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[items]} items"),
                TimeElapsedColumn(), console=console, disable=json_output) as progress:
            task = progress.add_task("files", total=total or None, items=0)
            finished = itertools.count(1)
            report = import_release(
                client, envs, scenarios or [], policy=policy.value, check=check, limit=limit,
                concurrency=concurrency, on_bytes=lambda n: progress.advance(task, n),
                on_item=lambda _item: progress.update(task, items=next(finished)))
    except (EnvScalerFileError, SandpitError) as exc:
        _fail(exc)
    elapsed = time.monotonic() - started
    if json_output:
        typer.echo(json.dumps({**report.to_dict(), "elapsed_s": round(elapsed, 2)}, ensure_ascii=False))
    else:
        _envscaler_table(report)
        for file_error in report.file_errors:
            note(console, ("file error: ", "red"), str(file_error))
        for kind, c in report.counts().items():
            note(console, f"{kind}s: {c['imported']} imported, {c['reused']} reused, {c['refused']} refused")
        console.print(f"({elapsed:.1f} s)")
    if report.file_errors:
        raise typer.Exit(1)


def _envscaler_table(report: ImportReport) -> None:
    """Refused items and notes as a table (imported and reused items without notes are
    only counted)."""
    shown = [item for item in report.items if item.status == "refused" or item.notes]
    if not shown:
        return
    table = Table(title="EnvScaler import: refused items and notes")
    for column in ("kind", "item", "file:record", "result", "sandpit id", "why / notes"):
        table.add_column(column, overflow="fold")
    colours = {"imported": "green", "reused": "cyan", "refused": "red"}
    for item in shown:
        colour = colours[item.status]
        table.add_row(item.kind, item.key, f"{item.file}:{item.index}", f"[{colour}]{item.status}[/{colour}]",
                      item.sandpit_id or "", "; ".join(item.reasons + item.notes)[:600])
    Console().print(table)


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
