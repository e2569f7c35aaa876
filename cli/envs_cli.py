"""``sandpit envs``: live env instances (``/v1/envs``), for poking at an env from a shell.

* ``create (--environment-id ID | --scenario-id ID | --source FILE --class-name C)
  [--init-config JSON|@file] [--max-steps N] [--mode M] [--episode JSON]`` — prints the
  env id, the initial observation and the tools;
* ``step ID TOOL [key=value ...] [--args JSON] [--text RAW] [--include state_diff,state]``
  — one action; ``key=value`` values are JSON when they parse (``by=5``, ``flag=true``,
  ``tags='["a"]'``), else strings (``name=Ada``; ``n='"5"'`` for the string ``"5"``);
  ``--args`` gives the whole argument object (``key=value`` pairs override its keys);
  ``--text`` sends raw model output for the server to parse (``<tool_call>`` format, or
  plain text as ``chat_with_user``). A ``rejected`` step is a result (exit 0) printed
  with the server's reason;
* ``list``, ``get ID``, ``state ID [--step K] [--episode E]``, ``trajectory ID``,
  ``episodes ID``, ``reset ID``, ``restore ID STEP``, ``fork ID``, ``evaluate ID``,
  ``delete ID``.

Exit codes as in :mod:`sandpit.api_cli` (a tool that raised, timed out or was rejected is
exit 0: it is the env's answer).
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
    LimitOpt,
    OffsetOpt,
    QuietOpt,
    UrlOpt,
    checks_table,
    connect,
    console,
    emit_json,
    id_column,
    json_object,
    json_or_text,
    json_value,
    kv_table,
    out,
    read_text,
    tools_table,
)
from sandpit.client import Env, Include, StepResult, Trajectory
from sandpit.output import show
from sandpit.scenarios_cli import ChecksOpt, read_checks

envs_app = typer.Typer(help="Live envs (instances of an environment): create, step, inspect, rewind, fork, score.",
                       no_args_is_help=True)

EnvArg = Annotated[str, typer.Argument(help="env_... id.")]
InitConfigOpt = Annotated[dict[str, Any] | None, typer.Option(
    "--init-config", parser=json_object, metavar="JSON|@FILE",
    help="The environment's initial configuration (default: the scenario's, else {}).")]
STATUS_STYLES = {"ok": "green", "error": "yellow", "rejected": "magenta", "timeout": "red", "oom": "red",
                 "crashed": "red"}
INCLUDES = ("state_diff", "state")


def _reward(reward: float | None) -> str:
    return "" if reward is None else str(reward)


def _status(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(status, ""))


def format_action(action: Any) -> str:
    """``bump(by=5, key="a")`` for a well-formed action; the raw recording otherwise."""
    if not isinstance(action, dict):
        return "" if action is None else json.dumps(action, ensure_ascii=False)
    arguments = action.get("arguments")
    if isinstance(arguments, dict):
        inner = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    else:
        inner = json.dumps(arguments, ensure_ascii=False)
    return f"{action.get('name', '')}({inner})"


def print_env(env: Env, *, tools: bool = True) -> None:
    """An env and its current episode: ids, status, initial observation, introduction, tools."""
    screen = out()  # one console for everything this prints
    rows: list[tuple[str, str | Text]] = [("env", env.id), ("environment", env.environment_id or "")]
    if env.scenario_id:
        rows.append(("scenario", env.scenario_id))
    if env.forked_from:
        rows.append(("forked from", f"{env.forked_from} at step {env.forked_at_step}"))
    episode = f"{env.episode} ({env.episode_status}), at step {env.step}"
    if env.reward is not None:
        episode += f", reward {env.reward}"
    rows += [("episode", episode), ("status", env.status)]
    if env.episode_config.get("max_steps") is not None:
        rows.append(("max steps", str(env.episode_config["max_steps"])))
    rows.append(("observation", env.observation))
    if env.introduction:
        rows.append(("introduction", env.introduction))
    screen.print(kv_table(rows))
    if tools and env.tools:
        screen.print(tools_table(env.tools))


def print_step(result: StepResult) -> None:
    """A step's outcome; a rejected one says why, an error shows its traceback."""
    screen = out()  # one console for everything this prints
    head = Text(f"step {result.step} of episode {result.episode}: ") + _status(result.status)
    head += Text(f"  ({result.duration_ms:.0f} ms{', env recovered from its last snapshot' if result.recovered else ''})")
    screen.print(head, soft_wrap=True)
    rows: list[tuple[str, str | Text]] = [("action", format_action(result.action))]
    if result.status == "rejected":
        rows.append(("rejected", Text(result.error or "(no reason given)", style="magenta")))
    rows.append(("observation", result.observation))
    for name in ("stdout", "stderr"):
        if getattr(result, name):
            rows.append((name, getattr(result, name).rstrip()))
    if result.traceback:
        rows.append(("traceback", Text(result.traceback.rstrip(), style="dim")))
    for finding in result.argument_findings or []:
        rows.append(("argument finding", finding))
    yes_no = {True: "yes", False: "no"}
    rows.append(("reward", f"{result.reward}   terminated {yes_no[result.terminated]}   "
                           f"truncated {yes_no[result.truncated]}"))
    screen.print(kv_table(rows))
    if result.checks:
        screen.print(checks_table(result.checks, "checks at the end of the episode"))
    if result.state_diff is not None:
        screen.print(Text("state diff" + ("" if result.state_diff else ": no change"), style="bold"))
        if result.state_diff:
            screen.print_json(data=result.state_diff)
    if result.state is not None:
        screen.print(Text("state", style="bold"))
        screen.print_json(data=result.state)


def _episode_options(max_steps: int | None, mode: str | None, episode: dict[str, Any] | None) -> dict[str, Any] | None:
    options = dict(episode or {})
    if max_steps is not None:
        options["max_steps"] = max_steps
    if mode is not None:
        options["mode"] = mode
    return options or None


@envs_app.command("create")
def create(environment_id: Annotated[str | None, typer.Option("--environment-id", help="From a registered "
                                                                                      "environment.")] = None,
           scenario_id: Annotated[str | None, typer.Option("--scenario-id", help="As an episode of a scenario (its "
                                                                                 "environment, task, checks).")] = None,
           source: Annotated[Path | None, typer.Option("--source", exists=True, dir_okay=False,
                                                       help="From inline code (with --class-name).")] = None,
           class_name: Annotated[str | None, typer.Option("--class-name", help="The class in --source.")] = None,
           init_config: InitConfigOpt = None,
           max_steps: Annotated[int | None, typer.Option("--max-steps", min=1, help="Truncate the episode after N "
                                                                                    "steps (default 30).")] = None,
           mode: Annotated[Literal["non_conversational", "conversational"] | None, typer.Option(
               "--mode", help="conversational needs a simulated user: --episode '{\"user\": {\"model\": ...}}'.")] = None,
           episode: Annotated[dict[str, Any] | None, typer.Option(
               "--episode", parser=json_object, metavar="JSON|@FILE",
               help="Every episode option (termination_action, on_tool_error, user, ...); "
                    "--max-steps/--mode override it.")] = None,
           argument_checking: Annotated[Literal["off", "warn", "strict"] | None, typer.Option(
               "--argument-checking", help="Override the environment's.")] = None,
           url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, json_: JsonOpt = False, quiet: QuietOpt = False) -> None:
    """Start an env; prints its id, the initial observation and the tools."""
    if sum(x is not None for x in (environment_id, scenario_id, source)) != 1:
        raise typer.BadParameter("give exactly one of --environment-id, --scenario-id or --source")
    if (source is None) != (class_name is None):
        raise typer.BadParameter("--source and --class-name go together")
    code = read_text(str(source)) if source is not None else None
    with connect(url, api_key) as client:
        handle = client.envs.create(environment_id, source_code=code, class_name=class_name, init_config=init_config,
                                    scenario_id=scenario_id, episode=_episode_options(max_steps, mode, episode),
                                    argument_checking=argument_checking)
    if json_:
        emit_json(handle.env)
    elif quiet:
        typer.echo(handle.id)
    else:
        print_env(handle.env)


@envs_app.command("list")
def list_(url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, limit: LimitOpt = 50, offset: OffsetOpt = 0,
          json_: JsonOpt = False) -> None:
    """The tenant's envs, newest first."""
    with connect(url, api_key) as client:
        page = client.envs.list(limit=limit, offset=offset)
    if json_:
        emit_json(page)
        return
    table = Table(title=f"envs ({len(page.data)} of {page.count})")
    id_column(table, "id", [env.id for env in page.data])
    id_column(table, "scenario / environment", [env.scenario_id or env.environment_id or "" for env in page.data])
    for column in ("episode", "step", "status"):
        table.add_column(column, justify="right" if column == "step" else "left")
    for env in page.data:
        table.add_row(env.id, env.scenario_id or env.environment_id or "", f"{env.episode} {env.episode_status}",
                      str(env.step), env.status)
    show(out(), table)


@envs_app.command("get")
def get(env_id: EnvArg, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, json_: JsonOpt = False) -> None:
    """One env: its current episode, observation and tools."""
    with connect(url, api_key) as client:
        env = client.envs.get(env_id).env
    if json_:
        emit_json(env)
    else:
        print_env(env)


def _arguments(pairs: list[str], args: Any) -> Any:
    """``--args`` with ``key=value`` pairs laid over it. A non-object ``--args`` is sent
    as given (the server records it as a rejected step) unless pairs need merging."""
    if not pairs:
        return {} if args is None else args
    if args is not None and not isinstance(args, dict):
        raise typer.BadParameter("key=value pairs need --args to be a JSON object", param_hint="--args")
    merged = dict(args or {})
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"arguments are key=value, got {pair!r}", param_hint="[KEY=VALUE]...")
        merged[key] = json_or_text(raw)
    return merged


def _includes(values: list[str] | None) -> list[Include]:
    wanted = [v.strip() for value in values or [] for v in value.split(",") if v.strip()]
    unknown = sorted(set(wanted) - set(INCLUDES))
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: may be {' or '.join(INCLUDES)}", param_hint="--include")
    return [v for v in INCLUDES if v in wanted]  # type: ignore[misc]


@envs_app.command("step")
def step(env_id: EnvArg,
         tool: Annotated[str | None, typer.Argument(help="The tool to call (not with --text).")] = None,
         pairs: Annotated[list[str] | None, typer.Argument(metavar="[KEY=VALUE]...",
                                                           help="Arguments; values JSON when they parse.")] = None,
         args: Annotated[Any, typer.Option("--args", parser=json_value, metavar="JSON|@FILE",
                                           help="The arguments as one JSON object.")] = None,
         text: Annotated[str | None, typer.Option("--text", help="Raw model output instead of TOOL: "
                                                                "<tool_call>{...}</tool_call>, or plain "
                                                                "text for chat_with_user.")] = None,
         include: Annotated[list[str] | None, typer.Option("--include", help="state_diff and/or state "
                                                                            "(comma-separated or repeated).")] = None,
         url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, json_: JsonOpt = False) -> None:
    """Take one action; prints the observation, status, reward/terminated/truncated."""
    if text is not None and (tool is not None or pairs or args is not None):
        raise typer.BadParameter("--text is the whole action: no TOOL, key=value or --args with it")
    if text is None and tool is None:
        raise typer.BadParameter("give TOOL [key=value ...] or --text")
    action: object = text if text is not None else {"name": tool, "arguments": _arguments(list(pairs or []), args)}
    wanted = _includes(include)
    with connect(url, api_key) as client:
        result = client.envs.get(env_id).step_call(action, include=wanted)
    if json_:
        emit_json(result)
    else:
        print_step(result)


@envs_app.command("state")
def state(env_id: EnvArg,
          step_: Annotated[int | None, typer.Option("--step", min=0, help="After this step (default: the "
                                                                         "latest).")] = None,
          episode: Annotated[int | None, typer.Option("--episode", min=1, help="Of this episode (default: the "
                                                                              "current one).")] = None,
          url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, json_: JsonOpt = False) -> None:
    """The state (every public attribute) as pretty JSON; non-JSON values are $ tags."""
    with connect(url, api_key) as client:
        view = client.envs.get(env_id).state_view(step_, episode=episode)
    if json_:
        emit_json(view)
        return
    console.print(f"state of {view.env_id}, episode {view.episode}, after step {view.step}"
                  + (" (some values truncated: $truncated tags)" if view.truncated else ""),
                  soft_wrap=True, markup=False, highlight=False)
    out().print_json(data=view.state)


def _trajectory_table(trajectory: Trajectory, offset: int) -> Table:
    shown = len(trajectory.steps)
    span = f"steps {offset + 1}-{offset + shown} of {trajectory.count}" if shown else f"{trajectory.count} steps"
    reward = "" if trajectory.reward is None else f", reward {trajectory.reward}"
    table = Table(title=f"{trajectory.env_id} episode {trajectory.episode} ({trajectory.status}{reward}): {span}")
    table.add_column("step", justify="right", no_wrap=True)
    for column in ("action", "status", "observation"):
        table.add_column(column, overflow="fold")
    table.add_column("reward", justify="right")
    table.add_column("ms", justify="right")
    for row in trajectory.steps:
        action = format_action(row.action.model_dump() if row.action is not None else None)
        observation = Text(row.observation)
        error = (row.info or {}).get("error")
        if row.status == "rejected" and error:
            observation.append(f"\nrejected: {error}", style="magenta")
        status = _status(row.status) + (Text(f" {row.done}") if row.done else Text(""))
        table.add_row(str(row.step), Text(action), status, observation,
                      _reward(row.reward), f"{row.duration_ms:.0f}")
    return table


@envs_app.command("trajectory")
def trajectory(env_id: EnvArg,
               episode: Annotated[int | None, typer.Option("--episode", min=1, help="Default: the current one.")] = None,
               limit: Annotated[int | None, typer.Option("--limit", min=1, help="Steps per page.")] = None,
               offset: OffsetOpt = 0, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
               json_: JsonOpt = False) -> None:
    """The steps of an episode: action, status, observation, reward, duration."""
    with connect(url, api_key) as client:
        page = client.envs.get(env_id).trajectory(episode, limit=limit, offset=offset or None)
    if json_:
        emit_json(page)
    else:
        out().print(_trajectory_table(page, offset))


@envs_app.command("episodes")
def episodes(env_id: EnvArg, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, limit: LimitOpt = 100,
             offset: OffsetOpt = 0, json_: JsonOpt = False) -> None:
    """Every episode of the env, oldest first: scenario, status, steps, reward."""
    with connect(url, api_key) as client:
        page = client.envs.get(env_id).episodes(limit=limit, offset=offset)
    if json_:
        emit_json(page)
        return
    table = Table(title=Text(f"{env_id}: {page.count} episode(s)"))
    table.add_column("episode", justify="right")
    id_column(table, "scenario", [item.scenario_id or "" for item in page.data])
    table.add_column("status")
    table.add_column("steps", justify="right")
    table.add_column("reward", justify="right")
    table.add_column("task", overflow="fold")
    for item in page.data:
        task = item.task or ""
        table.add_row(str(item.episode), item.scenario_id or "", item.status, str(item.steps), _reward(item.reward),
                      Text(task if len(task) <= 200 else task[:199] + "…"))
    show(out(), table)


@envs_app.command("reset")
def reset(env_id: EnvArg,
          scenario_id: Annotated[str | None, typer.Option("--scenario-id", help="Bind the new episode to this "
                                                                               "scenario.")] = None,
          init_config: InitConfigOpt = None, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
          json_: JsonOpt = False) -> None:
    """Start the next episode (the previous one stays readable with --episode)."""
    with connect(url, api_key) as client:
        env = client.envs.get(env_id).reset(init_config, scenario_id=scenario_id)
    if json_:
        emit_json(env)
    else:
        print_env(env, tools=False)


@envs_app.command("restore")
def restore(env_id: EnvArg, step_: Annotated[int, typer.Argument(metavar="STEP", min=0,
                                                                 help="Rewind to right after this step (0: the "
                                                                      "initial state).")],
            url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, json_: JsonOpt = False) -> None:
    """Rewind the current episode to a step; later steps are dropped."""
    with connect(url, api_key) as client:
        env = client.envs.get(env_id).restore(step_)
    if json_:
        emit_json(env)
    else:
        console.print(f"{env.id}: episode {env.episode} restored to step {env.step}", soft_wrap=True, markup=False,
                      highlight=False)


@envs_app.command("fork")
def fork(env_id: EnvArg,
         step_: Annotated[int | None, typer.Option("--step", min=0, help="Fork point (default: the latest "
                                                                        "step).")] = None,
         count: Annotated[int, typer.Option("--count", min=1, help="How many copies.")] = 1,
         url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, json_: JsonOpt = False, quiet: QuietOpt = False) -> None:
    """New envs, each a copy of this one as of a step; prints their ids."""
    with connect(url, api_key) as client:
        forks = client.envs.get(env_id).fork(step_, count)
    if json_:
        typer.echo(json.dumps([f.env.model_dump(mode="json") for f in forks], indent=2))
    elif quiet:
        typer.echo("\n".join(f.id for f in forks))
    else:
        table = Table(title=Text(f"{len(forks)} fork(s) of {env_id}"))
        table.add_column("env", no_wrap=True)
        table.add_column("at step", justify="right")
        for handle in forks:
            table.add_row(handle.id, str(handle.env.forked_at_step))
        out().print(table)


@envs_app.command("evaluate")
def evaluate(env_id: EnvArg, checks: ChecksOpt = None, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
             json_: JsonOpt = False) -> None:
    """Run the checks (the scenario's, or --checks FILE) on the env's initial and current state."""
    given = read_checks(checks) if checks is not None else None
    with connect(url, api_key) as client:
        result = client.envs.get(env_id).evaluate(given)
    if json_:
        emit_json(result)
        return
    out().print(checks_table(result.results, f"{result.env_id} episode {result.episode} at step {result.step}: "
                                             f"reward {result.reward} ({result.passed}/{result.total} passed)"))


@envs_app.command("delete")
def delete(env_id: EnvArg, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
    """Close an env and delete its trajectory and snapshots."""
    with connect(url, api_key) as client:
        client.envs.delete(env_id)
    console.print(f"deleted env {env_id}", soft_wrap=True, markup=False, highlight=False)

