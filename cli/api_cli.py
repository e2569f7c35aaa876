"""What the command groups that poke at a server through the Python client share
(``sandpit environments``, ``sandpit scenarios``, ``sandpit envs``): connection options,
the error edge, ``JSON|@file`` option parsing and the renderings used by more than one group.

Exit codes: 0 success (a tool that raised or a ``rejected`` step is a result, not a
failure); 1 the API refused or could not be reached — every ``SandpitError`` of the client
becomes one line on stderr (``error: HTTP 404 not_found: ...``); 2 a usage error as typer
reports it (unknown option, JSON that does not parse, a file that cannot be read).

Output: rich tables on stdout for people; ``--json`` prints the client's model of the
answer as JSON (for scripts); notes and errors go to stderr.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sandpit.client import DEFAULT_URL, Client, SandpitError
from sandpit.client.models import ScenarioStats, StatsTotals
from sandpit.output import error, id_column, out

__all__ = ["DEFAULT_URL", "JsonOpt", "KeyOpt", "KindOpt", "LimitOpt", "OffsetOpt", "QuietOpt", "RecentOpt", "SinceOpt",
           "UrlOpt", "checks_table", "connect", "console", "emit_json", "fail", "id_column", "json_object",
           "json_or_text", "json_value", "kv_table", "out", "rate", "read_text", "since_value", "stats_table",
           "text_value", "tools_table", "when"]

TIMEOUT_S = 120.0
"""Per request; above the default per-call limit of a tool (60 s), so a slow step is a
result (``timeout``) rather than a dropped connection."""

console = Console(stderr=True)

UrlOpt = Annotated[str, typer.Option("--url", envvar="SANDPIT_URL", help="Sandpit API base URL.")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="SANDPIT_API_KEY", show_default=False,
                                            help="Sandpit API key (Bearer).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON (for scripts).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the new id.")]
LimitOpt = Annotated[int, typer.Option("--limit", min=1, max=1000, help="Items per page.")]
OffsetOpt = Annotated[int, typer.Option("--offset", min=0, help="Items to skip (newest first).")]
KindOpt = Annotated[Literal["all", "training", "evaluation"], typer.Option(
    "--kind", help="Which episodes count: training (envs), evaluation (batch "
                                           "evaluations) or all.")]
RecentOpt = Annotated[int, typer.Option("--recent", min=0, max=100,
                                        help="Newest rewards to list per scenario, newest first.")]


def since_value(raw: str) -> datetime:
    """typer ``parser`` of ``--since``: an ISO 8601 date or time (``2026-01-31``,
    ``2026-01-31T14:05:00+02:00``); UTC when it names no zone. Raises BadParameter."""
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise typer.BadParameter(f"not an ISO 8601 date or time: {raw!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


SinceOpt = Annotated[datetime | None, typer.Option(
    "--since", parser=since_value, metavar="ISO-8601",
    help="Count only episodes started at or after this time (UTC unless it names a zone).")]


def fail(message: str, code: int = 1) -> NoReturn:
    """One line ``error: message`` on stderr (never read as markup), then exit with ``code``."""
    error(console, message, code)


@contextmanager
def connect(url: str, api_key: str | None) -> Iterator[Client]:
    """A client for one command; a `SandpitError` anywhere in the block exits 1 with its
    message, a `ValueError` the client raises before sending (an empty id) exits 2."""
    try:
        with Client(url, api_key=api_key, timeout=TIMEOUT_S) as client:
            yield client
    except SandpitError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc), 2)


def read_text(path: str) -> str:
    """A UTF-8 text file for an option; unreadable is a usage error (exit 2)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise typer.BadParameter(f"cannot read {path}: not UTF-8 text ({exc.reason})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_value(raw: str) -> Any:
    """typer ``parser`` for ``JSON|@file`` options: the JSON text, or ``@path`` for a file
    holding it. NaN/Infinity and nesting deeper than Python's recursion limit are refused."""
    text = read_text(raw[1:]) if raw.startswith("@") else raw
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        where = f" in {raw[1:]}" if raw.startswith("@") else ""
        raise typer.BadParameter(f"not valid JSON{where}: {exc}") from None


def json_or_text(raw: str) -> Any:
    """A ``key=value`` value: its JSON when it parses (``5``, ``true``, ``["a"]``), else the
    text itself (``Ada``, ``NaN``)."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return raw


def json_object(raw: str) -> dict[str, Any]:
    """Like `json_value`, for options that must be a JSON object (``init_config``...)."""
    value = json_value(raw)
    if not isinstance(value, dict):
        raise typer.BadParameter(f"must be a JSON object, not {type(value).__name__}")
    return value


def text_value(raw: str) -> str:
    """typer ``parser`` for ``TEXT|@file`` options."""
    return read_text(raw[1:]) if raw.startswith("@") else raw


def when(moment: datetime | None) -> str:
    """A timestamp for a table cell: ``2026-01-31 14:05`` in its own zone (UTC from the API)."""
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M")


def emit_json(model: BaseModel) -> None:
    """The client's model of an answer as indented JSON on stdout (never wrapped)."""
    typer.echo(model.model_dump_json(indent=2))


def kv_table(rows: list[tuple[str, str | Text]]) -> Table:
    """A two-column grid of ``name  value`` lines; values are never read as markup."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for name, value in rows:
        grid.add_row(name, value if isinstance(value, Text) else Text(value))
    return grid


def _parameters(schema: dict[str, Any]) -> str:
    """``key*: string, size: integer`` (``*`` marks required) from a JSON schema."""
    required = set(schema.get("required") or [])
    parts = []
    for name, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
        kind = "|".join(kind) if isinstance(kind, list) else str(kind)
        parts.append(f"{name}{'*' if name in required else ''}: {kind}")
    return ", ".join(parts)


def tools_table(tools: list[dict[str, Any]], title: str = "tools") -> Table:
    """OpenAI function-calling schemas as ``tool | parameters | description``."""
    table = Table(title=f"{title} ({len(tools)}; * = required)")
    table.add_column("tool", no_wrap=True)
    table.add_column("parameters", overflow="fold")
    table.add_column("description", overflow="fold")
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        description = str(function.get("description") or "").strip()
        table.add_row(Text(str(function.get("name", "?"))), Text(_parameters(function.get("parameters") or {})),
                      Text(description.splitlines()[0] if description else ""))
    return table


def checks_table(results: list[Any], title: str) -> Table:
    """Check outcomes (models or dicts with ``check_item``, ``passed``, ``status``, ``error``)."""
    table = Table(title=title)
    for column in ("check", "passed", "status", "error"):
        table.add_column(column, overflow="fold")
    for result in results:
        row = result if isinstance(result, dict) else result.model_dump()
        passed = bool(row.get("passed"))
        table.add_row(Text(str(row.get("check_item", ""))), Text("yes" if passed else "no",
                                                                   style="green" if passed else "red"),
                      Text(str(row.get("status", ""))), Text(str(row.get("error") or "")))
    return table


def rate(value: float | None) -> str:
    """A pass rate or mean reward for a table cell (``-`` when nothing finished)."""
    return "-" if value is None else f"{value:.4g}"


def stats_table(title: str, rows: list[ScenarioStats], totals: StatsTotals | None = None) -> Table:
    """Scenario statistics, one row per scenario (full ids), then the totals when given:
    attempts, finished, passed, pass rate, mean reward, last end and the newest rewards."""
    table = Table(title=Text(title))
    id_column(table, "scenario", [r.scenario_id for r in rows])
    for column in ("attempts", "finished", "passed", "pass rate", "mean reward"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("last ended", no_wrap=True)
    table.add_column("recent rewards (newest first)", overflow="fold")
    for row in rows:
        table.add_row(row.scenario_id, str(row.attempts), str(row.finished), str(row.passed), rate(row.pass_rate),
                      rate(row.mean_reward), when(row.last_ended_at),
                      " ".join(f"{r.reward:g}" for r in row.recent))
    if totals is not None:
        table.add_row(Text(f"all {totals.scenarios}", style="bold"), str(totals.attempts), str(totals.finished),
                      str(totals.passed), rate(totals.pass_rate), rate(totals.mean_reward), "", "", end_section=True)
    return table
