"""``sandpit cluster status``: nodes, sandbox hosts, sandboxes, sessions and capacity;
``sandpit cluster drain HOST [--wait] [--timeout S] [--force]``: drain a sandbox host (Ray
backend); ``sandpit cluster undrain HOST``: let a draining or drained host take work again.
All through the admin API (``client.admin.cluster``; the operator key from
``SANDPIT_OPERATOR_KEY``).

Exit codes: 0 success (for ``drain --wait``: the host is drained; for ``undrain``: the host
takes work, also when it was not drained); 1 no operator key, the server unreachable or
refusing (unknown host, the last host, a host whose node is gone), or ``--wait`` timed out
(one line on stderr); 2 usage error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sandpit.client import Client, SandpitConnectionError, SandpitError
from sandpit.client.cluster_models import HostDrain, HostUndrain
from sandpit.output import error, id_column, note, show

__all__ = ["cluster_app"]

cluster_app = typer.Typer(help="The cluster behind the API (admin API; needs SANDPIT_OPERATOR_KEY).",
                          no_args_is_help=True)
console = Console(stderr=True)
UrlOption = Annotated[str, typer.Option(envvar="SANDPIT_URL", help="Sandpit API base URL.")]
OperatorOption = Annotated[str | None, typer.Option(
    envvar="SANDPIT_OPERATOR_KEY", show_envvar=True, help="The operator key (prefer the environment variable).")]
TIMEOUT_S = 30.0
T = TypeVar("T")


def _admin_call(url: str, operator_key: str | None, request: Callable[[Client], T]) -> T:
    """``request(client)`` on an operator-keyed client of ``url``; a missing key, an
    unreachable server or a refusal is one line on stderr and exit code 1."""
    if not operator_key:
        error(console, "no operator key: set SANDPIT_OPERATOR_KEY")
    try:
        with Client(url, timeout=TIMEOUT_S, operator_key=operator_key) as client:
            return request(client)
    except SandpitConnectionError as exc:
        error(console, f"cannot reach {url}: {exc}")
    except SandpitError as exc:
        error(console, f"{exc.status_code or exc.code}: {exc.message}")


@cluster_app.command("status")
def status(url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None,
           as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False) -> None:
    """Backend, nodes, per-host sandboxes/sessions/capacity/envs placed, and the replicas."""
    answer = _admin_call(url, operator_key, lambda client: client.admin.cluster.status())
    if as_json:
        typer.echo(json.dumps(answer.model_dump(mode="json"), indent=2))
        return
    out = Console()
    capacity = answer.capacity_sessions if answer.capacity_sessions is not None else "?"
    note(out, "backend ", (answer.backend, "bold"), f" · {answer.nodes} node(s) · {answer.sandboxes} sandboxes · "
         f"{answer.sessions}/{capacity} sessions · answered by {answer.replica}")
    hosts = Table()
    id_column(hosts, "host", [h.host for h in answer.hosts])
    id_column(hosts, "node", [h.node_id or "-" for h in answer.hosts])
    for column in ("state", "sandboxes", "idle", "active", "starting", "sessions", "capacity", "envs placed"):
        hosts.add_column(column)
    for h in answer.hosts:
        hosts.add_row(Text(h.host), Text(h.node_id or "-"), h.drain or "active", str(h.sandboxes), str(h.idle),
                      str(h.active), str(h.starting), str(h.sessions),
                      str(h.capacity_sessions if h.capacity_sessions is not None else "?"), str(h.envs_placed))
    show(out, hosts)
    replicas = Table()
    id_column(replicas, "replica", [r.id for r in answer.replicas])
    for column in ("started", "last heartbeat"):
        replicas.add_column(column, no_wrap=True)
    for r in answer.replicas:
        replicas.add_row(r.id, r.started_at.isoformat(timespec="seconds"), r.heartbeat_at.isoformat(timespec="seconds"))
    show(out, replicas)


@cluster_app.command("drain")
def drain(host: Annotated[str, typer.Argument(help="The host, as `sandpit cluster status` lists it.")],
          url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None,
          wait: Annotated[bool, typer.Option("--wait", help="Wait until the host is drained.")] = False,
          timeout: Annotated[float, typer.Option("--timeout", min=0, help="Seconds --wait waits at most.")] = 600.0,
          force: Annotated[bool, typer.Option("--force", help="Drain even the last host taking envs.")] = False,
          as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False) -> None:
    """Drain a sandbox host: no new envs on it, calls in flight finish, its envs resume on other
    hosts from their last committed step, then its pool shuts down (idempotent)."""
    answer: HostDrain = _admin_call(url, operator_key, lambda client: client.admin.cluster.drain(
        host, force=force, wait_s=timeout if wait else None))
    if as_json:
        typer.echo(json.dumps(answer.model_dump(mode="json"), indent=2))
        return
    run_by = f" (run by {answer.owner})" if answer.owner and answer.status == "draining" else ""
    note(Console(), "host ", (answer.host, "bold"), f" {answer.status}{run_by}: {answer.sessions} session(s) left, "
         f"{answer.envs_placed} env(s) placed, {answer.envs_moved} moved")



@cluster_app.command("undrain")
def undrain(host: Annotated[str, typer.Argument(help="The host, as `sandpit cluster status` lists it.")],
            url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None,
            as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False) -> None:
    """Let a draining or drained sandbox host take new envs again: a running drain stops where it
    is; a drained host is re-created on its node if the node is still alive (a no-op for a host
    that was not drained)."""
    answer: HostUndrain = _admin_call(url, operator_key, lambda client: client.admin.cluster.undrain(host))
    if as_json:
        typer.echo(json.dumps(answer.model_dump(mode="json"), indent=2))
        return
    was = answer.previous or "not drained"
    note(Console(), "host ", (answer.host, "bold"), f" {answer.status} (was {was})")
