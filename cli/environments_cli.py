"""``sandpit environments``: registered environment code (``/v1/environments``).

* ``create FILE --class-name C`` — register a Python module whose class ``C`` is the
  environment: the static policy runs, then a sandbox loads it, derives the tools and
  instantiates it once (``--sample-init-config``); prints the tools and the policy findings;
* ``list``, ``get ID`` (tools as a table, the policy report's findings), ``delete ID``;
* ``stats ID [--kind K] [--since TIME] [--recent N]``: per scenario and in total, attempts,
  finished episodes, passes (reward 1.0), pass rate, mean reward, newest rewards.

The file is read as text and sent; it never runs on this machine. Exit codes as in
:mod:`sandpit.api_cli`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

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
    kv_table,
    out,
    read_text,
    stats_table,
    text_value,
    tools_table,
    when,
)
from sandpit.client import Environment
from sandpit.output import show

environments_app = typer.Typer(help="Registered environment code (a class whose public methods are the tools).",
                               no_args_is_help=True)

SourceArg = Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Python module defining the class.")]


def _rules(path: Path) -> list[str]:
    """``--rules-file``: a JSON list of strings (``.json``), else one rule per non-empty line."""
    text = read_text(str(path))
    if path.suffix == ".json":
        try:
            rules = json.loads(text)
        except ValueError as exc:
            raise typer.BadParameter(f"{path}: not valid JSON: {exc}", param_hint="--rules-file") from None
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise typer.BadParameter(f"{path}: must be a JSON list of strings", param_hint="--rules-file")
        return rules
    return [line.strip() for line in text.splitlines() if line.strip()]


def _findings_table(report: dict[str, Any]) -> Table:
    findings = report.get("findings") or []
    table = Table(title=f"policy {report.get('policy', '')}: {'passed' if report.get('passed') else 'refused'}, "
                        f"{report.get('errors', 0)} error(s), {report.get('warnings', 0)} warning(s), "
                        f"{len(findings)} finding(s)")
    for column in ("severity", "rule", "line", "message"):
        table.add_column(column, overflow="fold", no_wrap=column == "line")
    colours = {"error": "red", "warning": "yellow"}
    for finding in findings:
        severity = str(finding.get("severity", ""))
        column = finding.get("col", finding.get("column"))
        where = "" if finding.get("line") is None else f"{finding['line']}" + (f":{column}" if column is not None
                                                                                else "")
        table.add_row(Text(severity, style=colours.get(severity, "")), Text(str(finding.get("rule", ""))),
                      where, Text(str(finding.get("message", ""))))
    return table


def print_environment(environment: Environment) -> None:
    """An environment: its metadata, tools and the policy report's findings."""
    screen = out()  # one console for everything this prints
    rows: list[tuple[str, str | Text]] = [("environment", environment.id)]
    if environment.name:
        rows.append(("name", environment.name))
    rows += [
        ("class", environment.class_name), ("code sha256", environment.code_sha256), ("policy", environment.policy),
        ("argument checking", environment.argument_checking),
        ("created", when(environment.created_at))]
    if environment.description:
        rows.append(("description", environment.description))
    if environment.introduction:
        rows.append(("introduction", environment.introduction))
    for number, rule in enumerate(environment.rules or [], start=1):
        rows.append((f"rule {number}", rule))
    screen.print(kv_table(rows))
    screen.print(tools_table(environment.tools))
    if environment.policy_report is not None:
        screen.print(_findings_table(environment.policy_report))


@environments_app.command("create")
def create(file: SourceArg,
           class_name: Annotated[str, typer.Option("--class-name", help="The environment class in FILE.")],
           name: Annotated[str | None, typer.Option("--name", help="A label for listings.")] = None,
           description: Annotated[str | None, typer.Option("--description", help="TEXT or @file.",
                                                           parser=text_value)] = None,
           policy: Annotated[Literal["strict", "standard", "audit"], typer.Option(
               "--policy", help="Static policy: standard refuses errors and reports warnings.")] = "standard",
           introduction: Annotated[str | None, typer.Option(
               "--introduction", parser=text_value,
               help="EnvScaler environment introduction shown to agents (TEXT or @file).")] = None,
           rules_file: Annotated[Path | None, typer.Option(
               "--rules-file", help="EnvScaler constraints/rules: one per line, or a JSON list (.json).")] = None,
           argument_checking: Annotated[Literal["off", "warn", "strict"] | None, typer.Option(
               "--argument-checking", help="Default for its envs: off (Python decides), warn or strict "
                                           "(calls not fitting the tool schema are rejected).")] = None,
           sample_init_config: Annotated[dict[str, Any] | None, typer.Option(
               "--sample-init-config", parser=json_object, metavar="JSON|@FILE",
               help="init_config for the one instantiation at registration (default {}).")] = None,
           url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, json_: JsonOpt = False, quiet: QuietOpt = False) -> None:
    """Register FILE's class CLASS_NAME as an environment (policy, then tools derived in a sandbox)."""
    source = read_text(str(file))
    rules = _rules(rules_file) if rules_file is not None else None
    with connect(url, api_key) as client:
        environment = client.environments.create(
            source, class_name, name=name, description=description, policy=policy, introduction=introduction,
            rules=rules, argument_checking=argument_checking, sample_init_config=sample_init_config)
    if json_:
        emit_json(environment)
    elif quiet:
        typer.echo(environment.id)
    else:
        print_environment(environment)


@environments_app.command("list")
def list_(url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, limit: LimitOpt = 50, offset: OffsetOpt = 0,
          json_: JsonOpt = False) -> None:
    """The tenant's environments, newest first."""
    with connect(url, api_key) as client:
        page = client.environments.list(limit=limit, offset=offset)
    if json_:
        emit_json(page)
        return
    table = Table(title=f"environments ({len(page.data)} of {page.count})")
    id_column(table, "id", [environment.id for environment in page.data])
    for column in ("name", "class", "tools", "policy"):
        table.add_column(column, overflow="fold", justify="right" if column == "tools" else "left")
    for environment in page.data:
        report = environment.policy_report or {}
        table.add_row(environment.id, Text(environment.name or ""), environment.class_name,
                      str(len(environment.tools)),
                      f"{environment.policy} {report.get('errors', 0)}E {report.get('warnings', 0)}W")
    show(out(), table)


@environments_app.command("get")
def get(environment_id: Annotated[str, typer.Argument(help="envr_... id.")], url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None, json_: JsonOpt = False) -> None:
    """One environment: metadata, tools and the static policy's findings."""
    with connect(url, api_key) as client:
        environment = client.environments.get(environment_id)
    if json_:
        emit_json(environment)
    else:
        print_environment(environment)


@environments_app.command("stats")
def stats(environment_id: Annotated[str, typer.Argument(help="envr_... id.")], kind: KindOpt = "all",
          since: SinceOpt = None, recent: RecentOpt = 20, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
          limit: LimitOpt = 50, offset: OffsetOpt = 0, json_: JsonOpt = False) -> None:
    """Statistics of the environment's scenarios (a page of them, newest first) and the
    totals over all of them."""
    with connect(url, api_key) as client:
        figures = client.environments.stats(environment_id, kind=kind, since=since, recent=recent, limit=limit,
                                            offset=offset)
    if json_:
        emit_json(figures)
        return
    scope = f"{kind} episodes" + (f" started since {since.isoformat()}" if since else "")
    show(out(), stats_table(f"{environment_id}: {len(figures.data)} of {figures.count} scenarios ({scope})",
                          figures.data, figures.totals))


@environments_app.command("delete")
def delete(environment_id: Annotated[str, typer.Argument(help="envr_... id.")], url: UrlOpt = DEFAULT_URL,
           api_key: KeyOpt = None) -> None:
    """Delete an environment (refused with 409 while envs or scenarios use it)."""
    with connect(url, api_key) as client:
        client.environments.delete(environment_id)
    console.print(f"deleted environment {environment_id}", soft_wrap=True, markup=False, highlight=False)
