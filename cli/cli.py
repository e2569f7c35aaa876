"""``sandpit`` command line (typer). Subcommands:

* ``sandpit image build [--force]`` — build the sandbox image offline (content-hash tag).
* ``sandpit image tag`` — print the tag sandboxes will use.
* ``sandpit demo`` — run a real environment class through a sandbox, printing each
  observation and the state.
* ``sandpit sandboxes [--reap]`` — list (or remove) every labeled sandbox container.
* ``sandpit environments|scenarios|envs ...`` — poke at a server's environments, scenarios
  and live envs through the Python client (``--url``/``SANDPIT_URL``,
  ``--api-key``/``SANDPIT_API_KEY``); see :mod:`sandpit.envs_cli`.

Exit codes: 0 success, 1 a Sandpit error (message on stderr), 2 usage error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

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


db_app = typer.Typer(help="Control database (SQLite file by default, PostgreSQL by URL).", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Apply database migrations (creates the SQLite file and its directory if needed)."""
    from sandpit.api.db.engine import upgrade
    from sandpit.api.settings import get_api_settings

    url = get_api_settings().resolved_database_url()
    upgrade(url, revision)
    console.print(f"database at {revision}: {url}")


@app.command("serve")
def serve(host: str | None = typer.Option(None, help="Bind address (default SANDPIT_HOST)."),
          port: int | None = typer.Option(None, help="Port (default SANDPIT_PORT)."),
          log_level: str = typer.Option("warning", help="uvicorn log level.")) -> None:
    """Run the HTTP API (uvicorn). Refuses to start on an unmigrated database or with a
    placeholder operator key."""
    import uvicorn
    from pydantic import ValidationError
    from sandpit.api.app import create_app
    from sandpit.api.db.engine import make_engine, require_current
    from sandpit.api.errors import DatabaseNotMigrated
    from sandpit.api.settings import get_api_settings

    try:
        settings = get_api_settings()
    except ValidationError as exc:  # e.g. a placeholder SANDPIT_OPERATOR_KEY: refuse to start
        _fail(RuntimeError("invalid settings: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())))
        return
    engine = make_engine(settings.resolved_database_url())
    try:
        require_current(engine)
    except DatabaseNotMigrated as exc:
        _fail(exc)
    finally:
        engine.dispose()
    uvicorn.run(create_app(settings), host=host or settings.host, port=port or settings.port,
                log_level=log_level, access_log=False, timeout_graceful_shutdown=15)


import_app = typer.Typer(help="Import third-party environment suites through the API.", no_args_is_help=True)
app.add_typer(import_app, name="import")


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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from sandpit.api.bfcl import BfclImportError, fetch_wheel, load_suite
    from sandpit.api.bfcl_replay import check_policy, register_environments, replay_suite
    from sandpit.api.client import Client, SandpitError

    try:
        suite = load_suite(fetch_wheel())
        with Client(url, api_key=api_key, timeout=120) as client:
            console.print(f"BFCL {suite.version}: {len(suite.environments)} environments, {len(suite.episodes)} episodes")
            findings = check_policy(suite)
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
        return
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


def _bfcl_scenarios(client, suite, ids: dict[str, str], path: Path, limit: int | None, concurrency: int) -> None:
    """``import bfcl --scenarios FILE``: scenarios per episode, evaluation input to FILE."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from sandpit.api.bfcl_scenarios import make_scenarios, replay_items

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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from sandpit.api.client import Client, SandpitError
    from sandpit.api.envscaler import EnvScalerFileError, import_files, load_environments, load_scenarios

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
        return
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


tenants_app = typer.Typer(help="Tenants and API keys (admin API; needs SANDPIT_OPERATOR_KEY).", no_args_is_help=True)
app.add_typer(tenants_app, name="tenants")
UrlOption = Annotated[str, typer.Option(envvar="SANDPIT_URL", help="Sandpit API base URL.")]
OperatorOption = Annotated[str | None, typer.Option(
    envvar="SANDPIT_OPERATOR_KEY", show_envvar=True, help="The operator key (prefer the environment variable).")]


def _admin(url: str, operator_key: str | None, method: str, path: str, **kwargs: object) -> dict:
    """One admin API request; exits 1 with the server's message on an error."""
    import httpx

    if not operator_key:
        _fail(RuntimeError("no operator key: set SANDPIT_OPERATOR_KEY"))
    try:
        response = httpx.request(method, f"{url.rstrip('/')}/v1/admin{path}", timeout=30,
                                 headers={"Authorization": f"Bearer {operator_key}"}, **kwargs)
    except httpx.HTTPError as exc:
        _fail(RuntimeError(f"cannot reach {url}: {exc}"))
        raise
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        _fail(RuntimeError(f"{response.status_code}: {message}"))
    return response.json()


def _quota_options(values: list[str] | None) -> dict | None:
    """``--quota name=value`` (``max_profile.memory_mib=512`` for nested) as a dict."""
    import json

    if not values:
        return None
    quotas: dict = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"--quota wants name=value, got {item!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if "." in name:
            outer, inner = name.split(".", 1)
            quotas.setdefault(outer, {})[inner] = value
        else:
            quotas[name] = value
    return quotas


@tenants_app.command("create")
def tenants_create(
        tenant_id: Annotated[str, typer.Argument(help="Tenant id: [a-z0-9][a-z0-9_-]{0,63}.")],
        url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None,
        quota: Annotated[list[str] | None, typer.Option(help="Quota override name=value (repeatable).")] = None,
        key_name: Annotated[str | None, typer.Option(help="Name of the first API key.")] = None,
        expires_in_days: Annotated[float | None, typer.Option(min=0.001, help="The key expires after this.")] = None,
        quiet: Annotated[bool, typer.Option(help="Print only the API key (for scripts).")] = False,
) -> None:
    """Create a tenant and its first API key; the key is printed once and never again."""
    body = {"id": tenant_id, "quotas": _quota_options(quota), "key_name": key_name,
            "key_expires_in_s": expires_in_days * 86400 if expires_in_days else None}
    tenant = _admin(url, operator_key, "POST", "/tenants", json=body)
    key = tenant["api_key"]
    if quiet:
        typer.echo(key["key"])
        return
    console.print(f"tenant [bold]{tenant['id']}[/bold] created; API key {key['id']} "
                  f"(expires {key['expires_at'] or 'never'}). Store it now, it is not shown again:")
    typer.echo(key["key"])


@tenants_app.command("create-key")
def tenants_create_key(
        tenant_id: Annotated[str, typer.Argument(help="Tenant id.")],
        url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None,
        name: Annotated[str | None, typer.Option(help="Key name.")] = None,
        expires_in_days: Annotated[float | None, typer.Option(min=0.001, help="The key expires after this.")] = None,
) -> None:
    """Another API key for a tenant (printed once)."""
    key = _admin(url, operator_key, "POST", f"/tenants/{tenant_id}/keys",
                 json={"name": name, "expires_in_s": expires_in_days * 86400 if expires_in_days else None})
    console.print(f"API key {key['id']} for {tenant_id} (expires {key['expires_at'] or 'never'}):")
    typer.echo(key["key"])


@tenants_app.command("list")
def tenants_list(url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None,
                 keys: Annotated[bool, typer.Option(help="Also list every tenant's keys.")] = False) -> None:
    """Tenants with their quota overrides and active keys."""
    tenants = _admin(url, operator_key, "GET", "/tenants")["data"]
    table = Table("tenant", "active keys", "quota overrides", "created")
    for tenant in tenants:
        overrides = ", ".join(f"{k}={v}" for k, v in tenant["quota_overrides"].items()) or "-"
        table.add_row(tenant["id"], str(tenant["active_keys"]), overrides, tenant["created_at"][:19])
    Console().print(table)
    if keys:
        key_table = Table("key id", "tenant", "name", "prefix", "expires", "revoked")
        for tenant in tenants:
            for key in _admin(url, operator_key, "GET", f"/tenants/{tenant['id']}/keys")["data"]:
                key_table.add_row(key["id"], key["tenant"], key["name"] or "", key["prefix"] + "…",
                                  (key["expires_at"] or "never")[:19], (key["revoked_at"] or "")[:19])
        Console().print(key_table)


@tenants_app.command("revoke-key")
def tenants_revoke_key(key_id: Annotated[str, typer.Argument(help="Key id (key_...), see `tenants list --keys`.")],
                       url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None) -> None:
    """Revoke an API key: requests with it get 401 from now on."""
    key = _admin(url, operator_key, "POST", f"/keys/{key_id}/revoke")
    console.print(f"revoked {key['id']} of tenant {key['tenant']} at {key['revoked_at']}")


def _register_feature_apps() -> None:
    """Sub-apps that live in their own modules (``sandpit synth``, ``sandpit eval``,
    ``sandpit environments``, ``sandpit scenarios``, ``sandpit envs``, ``sandpit rl``)."""
    from sandpit.environments_cli import environments_app
    from sandpit.envs_cli import envs_app
    from sandpit.eval_cli import eval_app
    from sandpit.rl_cli import rl_app
    from sandpit.scenarios_cli import scenarios_app
    from sandpit.synth_cli import synth_app

    app.add_typer(synth_app, name="synth")
    app.add_typer(eval_app, name="eval")
    app.add_typer(environments_app, name="environments")
    app.add_typer(scenarios_app, name="scenarios")
    app.add_typer(envs_app, name="envs")
    app.add_typer(rl_app, name="rl")


_register_feature_apps()
