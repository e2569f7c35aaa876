"""``sandpit eval``: batch evaluations on a Sandpit server (``/v1/evaluations``).

Subcommands:

* ``replay FILE`` — score trajectories: FILE is JSON lines ``{"scenario_id", "tool_calls":
  [...]}`` (tool calls as ``{"name", "arguments"}`` or OpenAI tool calls);
* ``rollout --model M [--base-url URL] (-s ID ... | --scenarios FILE | --environment-id E)``
  — the server runs the EnvScaler agent loop with the model on each scenario;
* ``watch ID`` — follow a running evaluation, then print its summary;
* ``list``, ``cancel ID``, ``results ID [--transcript] [-o FILE]``.

``replay`` and ``rollout`` follow the evaluation with a progress bar (``done/total``, mean
reward so far) unless ``--detach``, then print the summary table (mean reward, success
rate, per environment, errors by status, tokens); ``--results FILE`` also writes every
episode as JSON lines. Ctrl-C stops following, not the evaluation (``sandpit eval watch
ID`` resumes; ``sandpit eval cancel ID`` stops it). The model API key comes from
``--model-api-key`` / ``SANDPIT_MODEL_API_KEY`` or the tenant's stored default and is sent
once, never printed.

Exit codes: 0 the evaluation completed; 1 it was cancelled or failed, or the API refused
(message on stderr); 2 bad input (unreadable or malformed file, no scenarios).
"""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sandpit.client import Client, EvaluationJob, SandpitError, every_item
from sandpit.output import error, id_column, note, out, show

eval_app = typer.Typer(help="Batch evaluations (replay or rollout) on a Sandpit server, with rewards from "
                            "the scenarios' check functions.", no_args_is_help=True)
console = Console(stderr=True)

DEFAULT_URL = "http://127.0.0.1:8600"
UrlOpt = Annotated[str, typer.Option("--url", envvar="SANDPIT_URL", help="Sandpit API base URL.")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="SANDPIT_API_KEY", show_default=False,
                                            help="Sandpit API key (Bearer).")]
ConcurrencyOpt = Annotated[int | None, typer.Option(
    "--concurrency", min=1, help="Episodes at once (default: the tenant's max_evaluation_concurrency).")]
KeepOpt = Annotated[bool, typer.Option("--keep-envs", help="Keep each episode's env instead of deleting it.")]
DetachOpt = Annotated[bool, typer.Option("--detach", help="Print the evaluation id and return at once.")]
ResultsOpt = Annotated[Path | None, typer.Option("--results", help="Write every episode's result here (JSON lines).")]
PollOpt = Annotated[float, typer.Option("--poll", min=0.05, help="Seconds between progress polls.")]


def _fail(message: str, code: int = 1) -> NoReturn:
    error(console, message, code)


def _client(url: str, api_key: str | None) -> Client:
    return Client(url, api_key=api_key, timeout=120)


def _json_lines(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}", 2)
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except ValueError as exc:
            _fail(f"{path}:{number}: not JSON: {exc}", 2)
    return items


def _scenario_ids_from(path: Path) -> list[str]:
    """Ids from a file: one per line, bare or as JSON lines with ``scenario_id`` or ``id``."""
    ids: list[str] = []
    for number, item in enumerate(_json_lines(path) if path.suffix in (".jsonl", ".json") else
                                  [line.strip() for line in _read_lines(path)], start=1):
        value = item.get("scenario_id", item.get("id")) if isinstance(item, dict) else item
        if not isinstance(value, str) or not value:
            _fail(f"{path}: entry {number} has no scenario id", 2)
        ids.append(value)
    return ids


def _read_lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}", 2)


def _follow(client: Client, job: EvaluationJob, poll_s: float) -> EvaluationJob:
    """Progress bar until the evaluation finishes (Ctrl-C stops following only)."""
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[info]}"), console=console, transient=False) as progress:
            task = progress.add_task(f"{job.mode} {job.id}", total=job.total, info="")

            def show(current: EvaluationJob) -> None:
                p = current.progress
                mean = "-" if p.mean_reward is None else f"{p.mean_reward:.3f}"
                progress.update(task, completed=p.done + p.errors + p.cancelled,
                                info=f"mean reward {mean}  success {p.success}  errors {p.errors}  running {p.running}")

            return client.evaluations.wait(job.id, poll_s=poll_s, on_progress=show)
    except KeyboardInterrupt:
        note(console, f"stopped following; evaluation {job.id} keeps running on the server "
                      f"(`sandpit eval watch {job.id}`, `sandpit eval cancel {job.id}`)")
        raise typer.Exit(130) from None


def print_summary(job: EvaluationJob) -> None:
    """The summary table of a finished evaluation (and its per-environment breakdown)."""
    screen = out()  # one console for everything this prints
    summary = job.summary
    table = Table(title=f"evaluation {job.id} ({job.mode}): {job.status}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    if summary is None:
        table.add_row("episodes", f"{job.progress.done + job.progress.errors}/{job.total}")
        screen.print(table)
        return

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    table.add_row("episodes", f"{summary.episodes}/{job.total}")
    table.add_row("scored", str(summary.scored))
    table.add_row("mean reward", fmt(summary.mean_reward))
    table.add_row("success rate (reward 1.0)", fmt(summary.success_rate))
    if summary.cancelled:
        table.add_row("cancelled", str(summary.cancelled))
    for status, count in summary.errors_by_status.items():
        table.add_row(f"errors: {status}", str(count))
    for failure, count in summary.by_failure.items():  # docs/failures.md: infrastructure and verifier are masked
        if failure != "none" and count:
            table.add_row(f"failure: {failure}" + (" (masked)" if failure in ("infrastructure", "verifier") else ""),
                          str(count))
    for name in ("prompt_tokens", "completion_tokens", "requests", "retries"):
        if summary.usage.get(name):
            table.add_row(name.replace("_", " "), str(summary.usage[name]))
    screen.print(table)
    if summary.by_environment:
        per_env = Table(title="per environment")
        for column in ("environment", "episodes", "mean reward", "success rate"):
            per_env.add_column(column, justify="left" if column == "environment" else "right")
        for environment, row in summary.by_environment.items():
            label = f"{row['name']} ({environment})" if row.get("name") else environment
            per_env.add_row(label, str(row.get("episodes", 0)), fmt(row.get("mean_reward")),
                            fmt(row.get("success_rate")))
        screen.print(per_env)
    if summary.by_scenario:
        per_scenario = Table(title="per scenario (overall: every episode of the scenario, training and evaluations)")
        id_column(per_scenario, "scenario", summary.by_scenario)
        for column in ("episodes", "mean reward", "success rate", "overall pass rate", "overall finished"):
            per_scenario.add_column(column, justify="right", no_wrap=True)
        for scenario_id, row in summary.by_scenario.items():
            per_scenario.add_row(scenario_id, str(row.get("episodes", 0)), fmt(row.get("mean_reward")),
                                 fmt(row.get("success_rate")), fmt(row.get("overall_pass_rate")),
                                 str(row.get("overall_finished", 0)))
        show(screen, per_scenario)


def _finish(client: Client, job: EvaluationJob, detach: bool, poll_s: float, results: Path | None) -> None:
    if detach:
        out().print(job.id)
        return
    job = _follow(client, job, poll_s)
    print_summary(job)
    if results is not None:
        _write_results(client, job.id, results, transcript=job.mode == "rollout")
    if job.status != "completed":
        raise typer.Exit(1)


def _write_results(client: Client, evaluation_id: str, path: Path | None, transcript: bool) -> None:
    lines = [r.model_dump_json() for r in client.evaluations.results(evaluation_id, include_transcript=transcript)]
    text = "".join(line + "\n" for line in lines)
    if path is None:
        typer.echo(text, nl=False)
    else:
        path.write_text(text, encoding="utf-8")
        note(console, f"{len(lines)} episode result(s) written to {path}")


@eval_app.command("replay")
def replay(file: Annotated[Path, typer.Argument(help="JSON lines: {scenario_id, tool_calls}.")],
           url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, concurrency: ConcurrencyOpt = None,
           keep_envs: KeepOpt = False, detach: DetachOpt = False, results: ResultsOpt = None,
           poll: PollOpt = 1.0) -> None:
    """Replay each trajectory in a fresh env of its scenario and score it with the scenario's checks."""
    episodes = _json_lines(file)
    if not episodes:
        _fail(f"{file} has no episodes", 2)
    if not all(isinstance(e, dict) for e in episodes):
        _fail(f"{file}: every line must be an object {{scenario_id, tool_calls}}", 2)
    try:
        with _client(url, api_key) as client:
            job = client.evaluations.replay(episodes, concurrency=concurrency, keep_envs=keep_envs or None)
            _finish(client, job, detach, poll, results)
    except SandpitError as exc:
        _fail(str(exc))


@eval_app.command("rollout")
def rollout(model: Annotated[str, typer.Option("--model", help="Model name sent to the endpoint.")],
            scenario_id: Annotated[list[str] | None, typer.Option("--scenario-id", "-s",
                                                                   help="A scenario to run (repeatable).")] = None,
            scenarios: Annotated[Path | None, typer.Option(
                "--scenarios", help="File of scenario ids (one per line, or JSON lines with scenario_id).")] = None,
            environment_id: Annotated[str | None, typer.Option(
                "--environment-id", help="Run every scenario of this environment.")] = None,
            repeat: Annotated[int, typer.Option("--repeat", min=1, max=100, help="Episodes per scenario.")] = 1,
            base_url: Annotated[str | None, typer.Option(
                "--base-url", help="OpenAI-compatible endpoint (default: the tenant's).")] = None,
            model_api_key: Annotated[str | None, typer.Option(
                "--model-api-key", envvar="SANDPIT_MODEL_API_KEY", show_default=False,
                help="Model API key (default: the tenant's stored key).")] = None,
            max_steps: Annotated[int, typer.Option("--max-steps", min=1, max=200)] = 30,
            temperature: Annotated[float | None, typer.Option("--temperature", min=0, max=2)] = None,
            retries: Annotated[int, typer.Option("--retries", min=0, max=10)] = 4,
            url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, concurrency: ConcurrencyOpt = None,
            keep_envs: KeepOpt = False, detach: DetachOpt = False, results: ResultsOpt = None,
            poll: PollOpt = 1.0) -> None:
    """Let the server run the agent loop (EnvScaler style) with a model on each scenario, then score it."""
    ids = list(scenario_id or [])
    if scenarios is not None:
        ids += _scenario_ids_from(scenarios)
    try:
        with _client(url, api_key) as client:
            if environment_id is not None:
                ids += _environment_scenarios(client, environment_id)
            if not ids:
                _fail("no scenarios: give --scenario-id, --scenarios or --environment-id", 2)
            job = client.evaluations.rollout([i for i in ids for _ in range(repeat)], model=model, base_url=base_url,
                                             api_key=model_api_key, max_steps=max_steps, temperature=temperature,
                                             retries=retries, concurrency=concurrency, keep_envs=keep_envs or None)
            _finish(client, job, detach, poll, results)
    except SandpitError as exc:
        _fail(str(exc))


def _environment_scenarios(client: Client, environment_id: str) -> list[str]:
    return [s.id for s in every_item(client.scenarios.list, 1000) if s.environment_id == environment_id]


@eval_app.command("watch")
def watch(evaluation_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None, poll: PollOpt = 1.0,
          results: ResultsOpt = None) -> None:
    """Follow an evaluation until it finishes, then print its summary."""
    try:
        with _client(url, api_key) as client:
            _finish(client, client.evaluations.get(evaluation_id), False, poll, results)
    except SandpitError as exc:
        _fail(str(exc))


@eval_app.command("list")
def list_(url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
          limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 20,
          json_: Annotated[bool, typer.Option("--json", help="Print the API's page as JSON (for scripts).")] = False,
          ) -> None:
    """The tenant's evaluations, newest first."""
    try:
        with _client(url, api_key) as client:
            page = client.evaluations.list(limit=limit)
    except SandpitError as exc:
        _fail(str(exc))
    if json_:
        typer.echo(page.model_dump_json(indent=2))
        return
    table = Table(title=f"evaluations ({len(page.data)} of {page.count})")
    id_column(table, "id", [job.id for job in page.data])
    for column in ("mode", "status", "done/total", "errors", "mean reward", "created (UTC)"):
        table.add_column(column, no_wrap=column in ("mode", "status"), overflow="fold")
    for job in page.data:
        p = job.progress
        table.add_row(job.id, job.mode, job.status, f"{p.done}/{job.total}", str(p.errors),
                      "-" if p.mean_reward is None else f"{p.mean_reward:.3f}",
                      job.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"))
    show(out(), table)


@eval_app.command("cancel")
def cancel(evaluation_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
    """Cancel an evaluation (pending episodes are dropped, running ones stop at their next step)."""
    try:
        with _client(url, api_key) as client:
            job = client.evaluations.cancel(evaluation_id)
    except SandpitError as exc:
        _fail(str(exc))
    note(console, f"evaluation {job.id}: {job.status}")


@eval_app.command("results")
def results_(evaluation_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
             transcript: Annotated[bool, typer.Option("--transcript", help="Include rollout transcripts.")] = False,
             output: Annotated[Path | None, typer.Option("--output", "-o", help="File (default stdout).")] = None) -> None:
    """Every finished episode as JSON lines (index order)."""
    try:
        with _client(url, api_key) as client:
            _write_results(client, evaluation_id, output, transcript)
    except SandpitError as exc:
        _fail(str(exc))
