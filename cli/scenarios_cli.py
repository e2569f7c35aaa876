"""``sandpit scenarios``: EnvScaler scenarios (``/v1/scenarios``): an environment, a task,
an ``init_config`` and check functions that turn a finished episode into a reward.

* ``create --environment-id ID --task TEXT [--init-config JSON|@file] [--checks FILE]``
  (FILE: a JSON list of ``{"check_item", "check_func"}``; each ``check_func`` is Python
  source defining ``check_func(final_state) -> bool``, checked by the static policy and
  run only in sandboxes);
* ``list [--environment-id ID]``, ``get ID``, ``delete ID``;
* ``stats ID [--kind K] [--since TIME] [--recent N]``: attempts, finished episodes, passes
  (reward 1.0), pass rate, mean reward and the newest rewards.

Exit codes as in :mod:`sandpit.api_cli`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text
from sandpit.api_cli import (
    DEFAULT_URL,
    JsonOpt,
    KeyOpt,
    KindOpt,
    LimitOpt,
    OffsetOpt,
    QuietOpt,
    RecentOpt,
    SinceOpt,
    UrlOpt,
    connect,
    console,
    emit_json,
    id_column,
    json_object,
    json_value,
    kv_table,
    out,
    stats_table,
    text_value,
    when,
)
from sandpit.client import Scenario
from sandpit.output import show

scenarios_app = typer.Typer(help="EnvScaler scenarios: task, init_config and check functions of an environment.",
                            no_args_is_help=True)

ChecksOpt = Annotated[Path | None, typer.Option(
    "--checks", exists=True, dir_okay=False,
    help='JSON list of {"check_item", "check_func"} (check_func: Python source of check_func(final_state)).')]


def read_checks(path: Path) -> list[Any]:
    """``--checks FILE``: must be a JSON list; the server judges its items (422 naming the
    offending ``checklist_with_func.N`` field)."""
    try:
        checks = json_value(f"@{path}")
    except typer.BadParameter as exc:
        raise typer.BadParameter(exc.message, param_hint="--checks") from None
    if not isinstance(checks, list):
        raise typer.BadParameter(f"{path} must hold a JSON list of {{check_item, check_func}}", param_hint="--checks")
    return checks


def print_scenario(scenario: Scenario) -> None:
    """A scenario: task, initial config and its checks (items and their code)."""
    screen = out()  # one console for everything this prints
    rows: list[tuple[str, str | Text]] = [("scenario", scenario.id), ("environment", scenario.environment_id)]
    if scenario.external_id:
        rows.append(("external id", scenario.external_id))
    rows += [("created", when(scenario.created_at)), ("task", scenario.task)]
    screen.print(kv_table(rows))
    screen.print(Text("init_config", style="bold"))
    screen.print_json(data=scenario.init_config)
    table = Table(title=f"checks ({len(scenario.checklist_with_func)})")
    table.add_column("check", overflow="fold")
    table.add_column("check_func", overflow="fold")
    for check in scenario.checklist_with_func:
        table.add_row(Text(str(check.get("check_item", ""))), Text(str(check.get("check_func", "")).rstrip()))
    screen.print(table)
    for item in scenario.checklist:
        screen.print(Text(f"checklist: {item}"))


@scenarios_app.command("create")
def create(environment_id: Annotated[str, typer.Option("--environment-id", help="envr_... id.")],
           task: Annotated[str, typer.Option("--task", parser=text_value, help="The task (TEXT or @file).")],
           init_config: Annotated[dict[str, Any] | None, typer.Option(
               "--init-config", parser=json_object, metavar="JSON|@FILE",
               help="The environment's initial configuration (default {}).")] = None,
           checks: ChecksOpt = None,
           external_id: Annotated[str | None, typer.Option("--external-id", help="Your own id for it.")] = None,
           url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, json_: JsonOpt = False, quiet: QuietOpt = False) -> None:
    """Store a scenario of a registered environment (check functions pass the static policy)."""
    body: dict[str, Any] = {"environment_id": environment_id, "task": task, "init_config": init_config or {}}
    if checks is not None:
        body["checklist_with_func"] = read_checks(checks)
    if external_id is not None:
        body["external_id"] = external_id
    with connect(url, api_key) as client:
        scenario = client.scenarios.create(body)
    if json_:
        emit_json(scenario)
    elif quiet:
        typer.echo(scenario.id)
    else:
        print_scenario(scenario)


@scenarios_app.command("list")
def list_(environment_id: Annotated[str | None, typer.Option("--environment-id",
                                                             help="Only this environment's scenarios.")] = None,
          url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, limit: LimitOpt = 50, offset: OffsetOpt = 0,
          json_: JsonOpt = False) -> None:
    """The tenant's scenarios, newest first."""
    with connect(url, api_key) as client:
        page = client.scenarios.list(limit=limit, offset=offset, environment_id=environment_id)
    if json_:
        emit_json(page)
        return
    table = Table(title=Text(f"scenarios ({len(page.data)} of {page.count})"
                             + (f" of {environment_id}" if environment_id else "")))
    id_column(table, "id", [scenario.id for scenario in page.data])
    if environment_id is None:
        id_column(table, "environment", [scenario.environment_id for scenario in page.data])
    table.add_column("checks", justify="right")
    table.add_column("task", overflow="fold")
    for scenario in page.data:
        task = scenario.task if len(scenario.task) <= 200 else scenario.task[:199] + "…"
        cells = [scenario.id, scenario.environment_id] if environment_id is None else [scenario.id]
        table.add_row(*cells, str(len(scenario.checklist_with_func)), Text(task))
    show(out(), table)


@scenarios_app.command("get")
def get(scenario_id: Annotated[str, typer.Argument(help="scn_... id.")], url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None, json_: JsonOpt = False) -> None:
    """One scenario: task, init_config and checks."""
    with connect(url, api_key) as client:
        scenario = client.scenarios.get(scenario_id)
    if json_:
        emit_json(scenario)
    else:
        print_scenario(scenario)


@scenarios_app.command("stats")
def stats(scenario_id: Annotated[str, typer.Argument(help="scn_... id.")], kind: KindOpt = "all",
          since: SinceOpt = None, recent: RecentOpt = 20, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
          json_: JsonOpt = False) -> None:
    """The scenario's statistics: attempts, finished, passed (reward 1.0), pass rate, mean
    reward, newest rewards."""
    with connect(url, api_key) as client:
        figures = client.scenarios.stats(scenario_id, kind=kind, since=since, recent=recent)
    if json_:
        emit_json(figures)
        return
    scope = f"{kind} episodes" + (f" started since {since.isoformat()}" if since else "")
    show(out(), stats_table(f"scenario statistics ({scope})", [figures]))


@scenarios_app.command("delete")
def delete(scenario_id: Annotated[str, typer.Argument(help="scn_... id.")], url: UrlOpt = DEFAULT_URL,
           api_key: KeyOpt = None) -> None:
    """Delete a scenario."""
    with connect(url, api_key) as client:
        client.scenarios.delete(scenario_id)
    console.print(f"deleted scenario {scenario_id}", soft_wrap=True, markup=False, highlight=False)
