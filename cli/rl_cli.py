"""``sandpit rl demo``: an RL episode loop over scenario-bound envs, as a trainer runs it.

A scripted policy (each scenario's known-good tool calls, then a final reply to the user)
drives Sandpit envs through the RL adapters: ``RLEnv`` (gymnasium) for every scenario of
the input, several envs at once on threads, then a few episodes through the GEM env
(``sandpit:envscaler_non_conv_env``, raw ``<tool_call>`` text as a model writes it), and
the first ``--door-episodes`` scenarios through the MCP and OpenEnv doors with their own
clients (:mod:`sandpit.rl_doors`; rewards printed beside gymnasium's, exit 1 unless
equal). The server computes every reward (the scenarios' checks) and ends every episode. Prints
episodes, mean reward, success rate, steps, step latency (p50/p99, milliseconds) and
steps/s; exit code 1 when an episode failed with an API error.

Input: the replay file ``sandpit import bfcl --scenarios FILE`` writes (JSON lines of
``{"scenario_id", "tool_calls": [{"name", "arguments"}]}``), or any file of that shape.

``sandpit rl envscaler RELEASE_DIR``: an EnvScaler release's recorded episodes (raw model
output per turn) through the GEM env under the ``envscaler`` profile and through
EnvScaler's rules restated, in a sandbox; a table of both rewards and whether every step
agrees (:mod:`sandpit.importers.envscaler_parity`); exit code 1 when any episode differs.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sandpit.output import error, note
from sandpit.rl_doors import EpisodeRun, mcp_episode, openenv_episode

if TYPE_CHECKING:
    from sandpit.importers.envscaler_parity import EpisodeParity, Totals

rl_app = typer.Typer(help="RL episode loops over the API (gymnasium and GEM adapters, MCP and OpenEnv doors).",
                    no_args_is_help=True)
console = Console(stderr=True)
FINAL_REPLY = "Task Completed: every requested change is done."
DEFAULT_MAX_STEPS = 30
"""A new env's episode length when its request names none (``EpisodeConfig.max_steps``)."""


def _load(path: Path, limit: int | None) -> list[dict[str, Any]]:
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise typer.BadParameter(f"{path}:{number} is not JSON: {exc}") from None
        if not isinstance(item, dict) or not isinstance(item.get("scenario_id"), str):
            raise typer.BadParameter(f"{path}:{number} has no scenario_id")
        items.append(item)
    return items[:limit] if limit else items


def _gymnasium_episode(client: Any, item: dict[str, Any], max_steps: int) -> EpisodeRun:
    from sandpit.client import SandpitError
    from sandpit.client.rl import RLEnv

    run = EpisodeRun(item["scenario_id"])
    actions = [*item.get("tool_calls", []), {"name": "chat_with_user", "arguments": {"content": FINAL_REPLY}}]
    try:
        with RLEnv(client, item["scenario_id"], episode={"max_steps": max_steps}) as env:
            env.reset(seed=0)
            for action in actions:
                started = time.perf_counter()
                _, reward, terminated, truncated, info = env.step(action)
                run.record(started, info)
                if terminated or truncated:
                    run.reward, run.ended = float(reward), True
                    break
    except SandpitError as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def _gem_episodes(items: list[dict[str, Any]], max_steps: int) -> list[EpisodeRun]:
    import logging

    import gem
    import sandpit.client.gem_env  # noqa: F401 - registers the sandpit:* GEM ids

    logging.getLogger("httpx").setLevel(logging.WARNING)  # gem sets the root logger to INFO

    runs = []
    env = gem.make("sandpit:envscaler_non_conv_env", scenario_ids=[i["scenario_id"] for i in items],
                   mode="train", episode={"max_steps": max_steps})
    try:
        for index, item in enumerate(items):
            run = EpisodeRun(item["scenario_id"])
            env.reset(task_index=index)
            texts = [f"<think>step {n}</think>\n<tool_call>{json.dumps(call)}</tool_call>"
                     for n, call in enumerate(item.get("tool_calls", []))] + [FINAL_REPLY]
            for text in texts:
                started = time.perf_counter()
                _, reward, terminated, truncated, info = env.step(text)
                run.record(started, info)
                if terminated or truncated:
                    run.reward, run.ended = float(reward), True
                    break
            runs.append(run)
    finally:
        env.close()
    return runs


def _row(table: Table, name: str, runs: list[EpisodeRun], wall_s: float) -> None:
    latencies = sorted(ms for r in runs for ms in r.latencies_ms)
    ok = [r for r in runs if r.error is None]
    rewards = [r.reward for r in ok]

    def pct(q: float) -> str:
        return f"{latencies[min(len(latencies) - 1, int(q * len(latencies)))]:.1f}" if latencies else "-"

    steps = sum(r.steps for r in runs)
    not_ok = sum(n for r in runs for status, n in r.statuses.items() if status != "ok")
    table.add_row(name, str(len(runs)), str(len(runs) - len(ok)), str(not_ok),
                  f"{statistics.fmean(rewards):.3f}" if rewards else "-",
                  f"{sum(1 for x in rewards if x == 1.0) / len(rewards):.0%}" if rewards else "-",
                  str(steps), pct(0.5), pct(0.99), f"{steps / wall_s:.0f}" if wall_s else "-")


@rl_app.command("demo")
def demo(replay_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSON lines of "
                                                     "{scenario_id, tool_calls}.")],
         url: Annotated[str | None, typer.Option(envvar="SANDPIT_URL", help="API base URL.")] = None,
         api_key: Annotated[str | None, typer.Option(envvar="SANDPIT_API_KEY", help="Tenant API key.")] = None,
         limit: Annotated[int | None, typer.Option(min=1, help="Scenarios to run (default all).")] = None,
         concurrency: Annotated[int, typer.Option(min=1, max=64, help="Envs stepped at once.")] = 4,
         gem_episodes: Annotated[int, typer.Option(min=0, help="Episodes through the GEM env.")] = 10,
         door_episodes: Annotated[int, typer.Option(min=0, help="Scenarios also run through MCP and OpenEnv.")] = 2,
         max_steps: Annotated[int, typer.Option(min=1, help="Episode step limit.")] = 100) -> None:
    """Drive scenario-bound envs with a scripted policy through RLEnv and the GEM env,
    then the first ``door_episodes`` scenarios (that end within the default 30 steps)
    through MCP and OpenEnv's clients; exit 1 when an episode failed with an API error or
    a door's reward differs from the gymnasium run's."""
    import sandpit.client.rl  # noqa: F401 - without the rl extra, fail before any output (sandpit.cli.main)

    if door_episodes:
        import mcp  # noqa: F401 - the doors' clients: without their extras, fail before any output
        import openenv.core  # noqa: F401
    from sandpit.client import Client

    items = _load(replay_file, limit)
    if not items:
        raise typer.BadParameter(f"{replay_file} has no episodes")
    runs: list[EpisodeRun] = []
    with Client(url, api_key=api_key, timeout=300) as client:
        started = time.perf_counter()
        with Progress(TextColumn("RLEnv episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress, ThreadPoolExecutor(max_workers=concurrency) as workers:
            task = progress.add_task("episodes", total=len(items))
            for run in workers.map(lambda item: _gymnasium_episode(client, item, max_steps), items):
                runs.append(run)
                progress.advance(task)
        gym_wall = time.perf_counter() - started
    started = time.perf_counter()
    gem_runs = _gem_episodes(items[:gem_episodes], max_steps) if gem_episodes else []
    gem_wall = time.perf_counter() - started
    table = Table(title="RL episodes (scripted policy; rewards and ends computed by the server)")
    for column in ("adapter", "episodes", "API errors", "steps not ok", "mean reward", "reward 1.0", "steps",
                   "step p50 ms", "step p99 ms", "steps/s"):
        table.add_column(column, justify="left" if column == "adapter" else "right")
    _row(table, f"RLEnv (gymnasium, {concurrency} at once)", runs, gym_wall)
    if gem_runs:
        _row(table, "GEM sandpit:envscaler_non_conv_env", gem_runs, gem_wall)
    Console().print(table)
    failed = [r for r in runs + gem_runs if r.error is not None or not r.ended]
    for run in failed[:10]:
        note(console, (run.scenario_id, "yellow"), f": {run.error or 'did not end'}")
    doors_agree = True
    if door_episodes:
        from sandpit.client.transport import from_environment

        base_url, key = from_environment(url, api_key)
        doors_agree = _doors(base_url.split(",")[0].strip(), key or "", items, runs, door_episodes)
    if any(r.error is not None for r in failed) or not doors_agree:
        raise typer.Exit(1)


def _doors(url: str, api_key: str, items: list[dict[str, Any]], runs: list[EpisodeRun], count: int) -> bool:
    """The first ``count`` scenarios whose scripted actions end within the default episode
    length (the doors open envs with the scenario's defaults) through MCP and OpenEnv
    (:mod:`sandpit.rl_doors`), their rewards printed beside the gymnasium run's. True when
    every door ended its episodes with the gymnasium run's reward."""
    chosen = [(item, run) for item, run in zip(items, runs, strict=True)
              if run.error is None and run.ended and len(item.get("tool_calls", [])) + 1 < DEFAULT_MAX_STEPS][:count]
    table = Table(title="The same episodes through MCP (mcp SDK client) and OpenEnv (openenv-core client)")
    for column in ("scenario", "gymnasium", "MCP", "OpenEnv", "equal"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    agree = True
    for item, run in chosen:
        actions = [*item.get("tool_calls", []), {"name": "chat_with_user", "arguments": {"content": FINAL_REPLY}}]
        doors = [mcp_episode(url, api_key, item["scenario_id"], actions),
                 openenv_episode(url, api_key, item["scenario_id"], actions)]
        equal = all(d.error is None and d.ended and d.reward == run.reward for d in doors)
        agree = agree and equal
        table.add_row(item["scenario_id"], f"{run.reward:.3f}",
                      *(f"{d.reward:.3f}" if d.error is None and d.ended else "failed" for d in doors),
                      "yes" if equal else "NO")
        for door, name in zip(doors, ("MCP", "OpenEnv"), strict=True):
            if door.error is not None or not door.ended:
                note(console, (f"{name} {item['scenario_id']}", "yellow"), f": {door.error or 'did not end'}")
    Console().print(table)
    return agree


@rl_app.command("envscaler")
def envscaler(release_dir: Annotated[Path, typer.Argument(help="Release directory: environments.json, "
                                                          "rl_scenarios.json, episodes.jsonl.")],
              url: Annotated[str | None, typer.Option(envvar="SANDPIT_URL", help="API base URL.")] = None,
              api_key: Annotated[str | None, typer.Option(envvar="SANDPIT_API_KEY", help="Tenant API key.")] = None,
              seed: Annotated[int | None, typer.Option(min=0, max=2 ** 64 - 1, help="reset seed of every episode "
                                                       "(default: each episode's recorded seed).")] = None,
              json_output: Annotated[bool, typer.Option("--json", help="Print the results as JSON on stdout (no "
                                                        "table, no progress bar).")] = False) -> None:
    """Run a release's recorded episodes through the GEM env (envscaler profile) and through
    EnvScaler's rules in a sandbox; compare rewards and every step. The release must have
    been imported (`sandpit import envscaler`) by the same tenant. Exit code 1 when any
    episode differs or could not run, 2 for a release directory that cannot be read."""
    import logging

    from sandpit.importers import envscaler_parity as parity

    try:
        release = parity.load_release(release_dir)
    except parity.ReleaseError as exc:
        raise typer.BadParameter(str(exc), param_hint="RELEASE_DIR") from None
    import sandpit.client.gem_env  # noqa: F401 - gem configures logging on import: before quieting httpx
    from sandpit.client import Client, SandpitError
    from sandpit.sandbox_images import DEFINITION_DIR

    reference = parity.reference_files(DEFINITION_DIR)

    logging.getLogger("httpx").setLevel(logging.WARNING)  # gem sets the root logger to INFO
    try:
        with Client(url, api_key=api_key, timeout=120) as client:
            scenarios = parity.find_scenarios(client, release)
            with Progress(TextColumn("EnvScaler episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          TextColumn("{task.description}"), console=console, disable=json_output) as progress:
                task = progress.add_task("", total=len(release.episodes))
                results = parity.run_release(client, release, reference, seed=seed, scenarios=scenarios,
                                      on_episode=lambda r: progress.update(task, advance=1, description=r.task_id))
    except SandpitError as exc:
        error(console, exc)
    totals = parity.Totals.of(results)
    if json_output:
        typer.echo(json.dumps({"episodes": [r.to_dict() for r in results], "totals": totals.to_dict()},
                              ensure_ascii=False))
    else:
        _parity_table(results, totals)
    if totals.equal < totals.episodes:
        raise typer.Exit(1)


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _parity_table(results: list[EpisodeParity], totals: Totals) -> None:
    """One row per episode, then the totals (in the footer). A terminal narrower than 150
    columns (or output to a file: rich assumes 80) gets the six columns that say whether
    the runs agree, without the environment and the episode's description."""
    out = Console()
    wide = out.width >= 150
    table = Table(title="EnvScaler episodes: GEM env (envscaler profile) vs EnvScaler's rules in a sandbox",
                  show_footer=True)
    mark = {True: "[green]yes[/green]", False: "[red]no[/red]"}
    columns = (["task id", "environment", "steps", "GEM reward", "reference reward", "reward equal",
                "every step equal", "what the episode shows"] if wide else
               ["task id", "steps", "GEM", "reference", "reward =", "steps ="])
    for column in columns:
        numeric = column in ("steps", "GEM reward", "reference reward", "GEM", "reference")
        table.add_column(column, justify="right" if numeric else "left", overflow="fold",
                         no_wrap=wide and column in ("task id", "steps", "GEM reward", "reference reward"))
    for r in results:
        steps = str(r.gem_steps) if r.gem_steps == r.reference_steps else f"{r.gem_steps} / {r.reference_steps}"
        if r.error is not None:
            detail = f"[red]{r.error}[/red]"
        elif r.difference is not None:
            detail = f"[red]no: {r.difference}[/red]"
        else:
            detail = "[green]yes[/green]" + (f" (reset + {r.gem_steps} step{'s' if r.gem_steps != 1 else ''})"
                                             if wide else "")
        cells = [r.task_id, *([r.environment] if wide else []), steps, _reward(r.gem_reward),
                 _reward(r.reference_reward), mark[r.rewards_equal], detail, *([r.note] if wide else [])]
        table.add_row(*cells)
    mean = totals.to_dict()
    footer = ["total", *([""] if wide else []), str(totals.gem_steps), f"mean {_reward(mean['gem_mean_reward'])}",
              f"mean {_reward(mean['reference_mean_reward'])}", f"{totals.rewards_equal}/{totals.episodes}",
              f"{totals.equal}/{totals.episodes}", *([""] if wide else [])]
    for index, text in enumerate(footer):
        table.columns[index].footer = text
    out.print(table)
    colour = "green" if totals.equal == totals.episodes else "red"
    note(console, (f"{totals.equal} of {totals.episodes} episodes equal", colour), " (introduction, tools, "
         "first observation, and every step's observation, kind, end and reward)")
