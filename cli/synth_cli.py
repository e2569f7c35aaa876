"""``sandpit synth``: EnvScaler-style synthesis (SkelBuilder, ScenGenerator) as a client of
the Sandpit API. Subcommands (each resumable from ``--run-dir``):

* ``run --seeds FILE [--register]`` — every stage in order, skipping finished ones;
* ``describe [--seeds FILE]`` — SkelBuilder stage 1 (stateful? environment description, dedup);
* ``build`` — SkelBuilder stage 2 (logic modeling, tools derived via ``/v1/validate``);
* ``check`` — SkelBuilder stage 3 (dual-agent quality evaluation on real envs);
* ``scenarios`` — ScenGenerator (init configs, tasks, checklists, check functions);
* ``register`` — register kept environments and scenarios in Sandpit;
* ``report`` — print the final table of a run.

The model endpoint comes from ``SANDPIT_SYNTH_*`` settings (see
``sandpit.synthesis.settings``). Exit codes: 0 done, 1 a stage left unfinished items
(rerun to resume) or the API failed, 2 bad input (seed file, missing stage output).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from sandpit.client import Client, SandpitError
from sandpit.output import error, note
from sandpit.synthesis.pipeline import Pipeline, SeedFileError, StageInputMissing, summarize
from sandpit.synthesis.rundir import RunDir
from sandpit.synthesis.settings import SynthSettings

synth_app = typer.Typer(help="Synthesize environments and scenarios (EnvScaler SkelBuilder + ScenGenerator) "
                             "through the Sandpit API.", no_args_is_help=True)
console = Console(stderr=True)

RunDirOpt = Annotated[Path, typer.Option("--run-dir", help="Run directory (outputs, manifest, model cache).")]
UrlOpt = Annotated[str, typer.Option("--url", help="Sandpit API base URL.")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="SANDPIT_API_KEY", show_default=False,
                                            help="Sandpit API key (Bearer).")]
SeedsOpt = Annotated[Path | None, typer.Option("--seeds", help="Seed tasks, JSON lines with a 'task' field.")]
DEFAULT_URL = "http://127.0.0.1:8600"


@contextmanager
def _pipeline(run_dir: Path, url: str, api_key: str | None) -> Iterator[Pipeline]:
    settings = SynthSettings()
    with Client(url, api_key=api_key, timeout=settings.api_timeout_s) as client, Progress(
            TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=False) as progress:
        def factory(stage: str, total: int) -> Callable[[], None]:
            task = progress.add_task(stage, total=total)
            return lambda: progress.advance(task)

        pipeline = Pipeline(RunDir(run_dir), settings, client, progress=factory)
        try:
            yield pipeline
        except (SeedFileError, StageInputMissing) as exc:
            error(console, exc, 2)
        except SandpitError as exc:
            error(console, f"Sandpit API: {exc}")
        finally:
            pipeline.close()
    _print_summary(pipeline)


def _print_summary(pipeline: Pipeline) -> None:
    _print_table(pipeline.run.path, pipeline.summary())


def _print_table(path: Path, summary: dict[str, Any]) -> None:
    table = Table(title=Text(f"sandpit synth: {path}"))
    table.add_column("", style="bold")
    table.add_column("count", justify="right")
    rows: list[tuple[str, Any]] = [
        ("seed tasks", summary["seeds"]), ("environment candidates", summary["candidates"]),
        ("built (stage 2)", summary["built"]), ("kept (quality check)", summary["kept"])]
    rows += [(f"rejected: {reason}", n) for reason, n in summary["rejected"].items()]
    rows += [("scenarios", summary["scenarios"]),
             ("check functions valid", f"{summary['checks_valid']}/{summary['checks_total']}"),
             ("check functions flagged", summary["checks_flagged"]),
             ("unfinished items (rerun)", summary["unfinished"]),
             ("registered environments", summary["registered_environments"]),
             ("registered scenarios", summary["registered_scenarios"])]
    for label, usage in (("this run", summary.get("usage")), ("all runs", summary.get("usage_total"))):
        if usage:
            rows += [(f"model requests, {label} (live / cached)",
                      f"{usage.get('requests', 0)} / {usage.get('cached', 0)}"),
                     (f"tokens, {label} (prompt / completion)",
                      f"{usage.get('prompt_tokens', 0)} / {usage.get('completion_tokens', 0)}")]
    for label, value in rows:
        table.add_row(Text(label), Text(str(value)))
    Console().print(table)


SHOWN_CAUSES = 10
"""Unfinished items whose cause ``sandpit synth`` prints (the rest are counted)."""


def _unfinished(run: RunDir, stage: str) -> NoReturn:
    """Why ``stage`` is partial: each unfinished item and its recorded cause (the first
    :data:`SHOWN_CAUSES`), then the rerun advice; exit 1."""
    causes = run.unfinished(stage)
    for cause in causes[:SHOWN_CAUSES]:
        note(console, "  ", (cause["key"], "yellow"), ": ", " ".join(cause["error"].splitlines()))
    if len(causes) > SHOWN_CAUSES:
        note(console, f"  ... and {len(causes) - SHOWN_CAUSES} more (errors in {run.file(stage + '.json')})")
    note(console, (f"stage {stage} has {len(causes) or 'some'} unfinished item(s): rerun to resume", "yellow"))
    raise typer.Exit(1)


def _exit_for(pipeline: Pipeline, stage: str) -> None:
    if (pipeline.run.manifest["stages"].get(stage) or {}).get("status") == "partial":
        _unfinished(pipeline.run, stage)


@synth_app.command("run")
def run(run_dir: RunDirOpt, seeds: SeedsOpt = None, register: Annotated[bool, typer.Option(
            "--register", help="Register kept environments and scenarios in Sandpit.")] = False,
        url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
    """Every stage in order; finished stages of the run directory are skipped."""
    with _pipeline(run_dir, url, api_key) as pipeline:
        if seeds is not None:
            pipeline.set_seeds(seeds)
        outcome = pipeline.run_all(register=register)
    partial = [stage for stage, status in outcome.items() if status == "partial"]
    if partial:
        _unfinished(pipeline.run, partial[0])


def _stage(name: str, method: str, doc: str) -> None:
    def command(run_dir: RunDirOpt, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
                force: Annotated[bool, typer.Option(help="Run even if the stage is done.")] = False) -> None:
        with _pipeline(run_dir, url, api_key) as pipeline:
            if force or not pipeline.run.stage_done(name):
                getattr(pipeline, method)()
            else:
                note(console, f"stage {name} is done (use --force to run it again)")
        _exit_for(pipeline, name)

    command.__doc__ = doc
    synth_app.command(method)(command)


@synth_app.command("describe")
def describe(run_dir: RunDirOpt, seeds: SeedsOpt = None, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None,
             force: Annotated[bool, typer.Option(help="Run even if the stage is done.")] = False) -> None:
    """SkelBuilder stage 1: judge seed tasks, infer environment descriptions, de-duplicate."""
    with _pipeline(run_dir, url, api_key) as pipeline:
        if seeds is not None:
            pipeline.set_seeds(seeds)
        if force or not pipeline.run.stage_done("skel_1_descriptions"):
            pipeline.describe()
        else:
            console.print("stage skel_1_descriptions is done (use --force to run it again)")
    _exit_for(pipeline, "skel_1_descriptions")


_stage("skel_2_candidates", "build", "SkelBuilder stage 2: logic modeling -> environment classes, tools via the API.")
_stage("skel_3_quality", "check", "SkelBuilder stage 3: dual-agent quality check on real envs; keep by pass rates.")
_stage("scen_scenarios", "scenarios", "ScenGenerator: init configs, tasks, checklists, validated check functions.")
_stage("register", "register", "Register kept environments and scenarios in Sandpit.")


@synth_app.command("report")
def report(run_dir: RunDirOpt) -> None:
    """Print the final table of a run directory (no model or API call)."""
    if not (run_dir / "manifest.json").exists():
        error(console, f"{run_dir} is not a run directory", 2)
    _print_table(run_dir, summarize(RunDir(run_dir)))
