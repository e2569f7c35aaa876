"""``sandpit tenants ...``: tenants and API keys through the admin API
(``client.admin``, the operator key from ``SANDPIT_OPERATOR_KEY`` or ``--operator-key``).

Exit codes: 0 success; 1 no operator key, the server unreachable or refusing (one line on
stderr: ``error: <status>: <message>``); 2 usage error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sandpit.client import Client, SandpitConnectionError, SandpitError
from sandpit.client.admin import Admin
from sandpit.output import error, id_column, note, show

__all__ = ["tenants_app"]

tenants_app = typer.Typer(help="Tenants and API keys (admin API; needs SANDPIT_OPERATOR_KEY).", no_args_is_help=True)
console = Console(stderr=True)
UrlOption = Annotated[str, typer.Option(envvar="SANDPIT_URL", help="Sandpit API base URL.")]
OperatorOption = Annotated[str | None, typer.Option(
    envvar="SANDPIT_OPERATOR_KEY", show_envvar=True, help="The operator key (prefer the environment variable).")]
TIMEOUT_S = 30.0


def _fail(message: str) -> NoReturn:
    error(console, message)


@contextmanager
def _admin(url: str, operator_key: str | None) -> Iterator[Admin]:
    """``client.admin`` of a client to ``url`` with the operator key; a `SandpitError` in
    the block exits 1 with the server's message."""
    if not operator_key:
        _fail("no operator key: set SANDPIT_OPERATOR_KEY")
    try:
        with Client(url, timeout=TIMEOUT_S, operator_key=operator_key) as client:
            yield client.admin
    except SandpitConnectionError as exc:
        _fail(f"cannot reach {url}: {exc}")
    except SandpitError as exc:
        _fail(f"{exc.status_code}: {exc.message}")


def _quota_options(values: list[str] | None) -> dict[str, Any] | None:
    """``--quota name=value`` (``max_profile.memory_mib=512`` for nested) as a dict."""
    if not values:
        return None
    quotas: dict[str, Any] = {}
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


def _seconds(days: float | None) -> float | None:
    return days * 86400 if days else None


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
    quotas = _quota_options(quota)
    with _admin(url, operator_key) as admin:
        tenant = admin.tenants.create(tenant_id, quotas=quotas, key_name=key_name,
                                      key_expires_in_s=_seconds(expires_in_days))
    if tenant.api_key is None or tenant.api_key.key is None:
        _fail(f"the server created tenant {tenant.id} without returning its first key")
    key = tenant.api_key.model_dump(mode="json")  # the server's JSON rendering (times as it sends them)
    if quiet:
        typer.echo(key["key"])
        return
    note(console, "tenant ", (tenant.id, "bold"), f" created; API key {key['id']} "
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
    with _admin(url, operator_key) as admin:
        key = admin.keys.create(tenant_id, name=name, expires_in_s=_seconds(expires_in_days)).model_dump(mode="json")
    note(console, f"API key {key['id']} for {tenant_id} (expires {key['expires_at'] or 'never'}):")
    typer.echo(key["key"])


@tenants_app.command("list")
def tenants_list(url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None,
                 keys: Annotated[bool, typer.Option(help="Also list every tenant's keys.")] = False,
                 as_json: Annotated[bool, typer.Option(
                     "--json", help="Print the API's page of tenants as JSON (with --keys: each tenant's "
                                    "page of keys under \"keys\", by tenant id).")] = False) -> None:
    """Tenants with their quota overrides and active keys."""
    with _admin(url, operator_key) as admin:
        page = admin.tenants.list()
        tenants = [t.model_dump(mode="json") for t in page.data]  # times as the server sends them
        key_pages = {t["id"]: admin.keys.list(t["id"]) for t in tenants} if keys else {}
    if as_json:
        document: dict[str, Any] = page.model_dump(mode="json")
        if keys:
            document["keys"] = {tenant: p.model_dump(mode="json") for tenant, p in key_pages.items()}
        typer.echo(json.dumps(document, indent=2))
        return
    table = Table()
    id_column(table, "tenant", [t["id"] for t in tenants])
    for column in ("active keys", "quota overrides", "created"):
        table.add_column(column)
    for tenant in tenants:
        overrides = ", ".join(f"{k}={v}" for k, v in tenant["quota_overrides"].items()) or "-"
        table.add_row(Text(tenant["id"]), str(tenant["active_keys"]), Text(overrides), tenant["created_at"][:19])
    show(Console(), table)
    if keys:
        key_table = Table()
        id_column(key_table, "key id", [k.id for p in key_pages.values() for k in p.data])
        for column in ("tenant", "name", "prefix", "expires", "revoked"):
            key_table.add_column(column)
        for key_page in key_pages.values():
            for row in key_page.data:
                key = row.model_dump(mode="json")
                key_table.add_row(Text(key["id"]), Text(key["tenant"]), Text(key["name"] or ""),
                                  Text(key["prefix"] + "…"), (key["expires_at"] or "never")[:19],
                                  (key["revoked_at"] or "")[:19])
        show(Console(), key_table)


@tenants_app.command("revoke-key")
def tenants_revoke_key(key_id: Annotated[str, typer.Argument(help="Key id (key_...), see `tenants list --keys`.")],
                       url: UrlOption = "http://127.0.0.1:8600", operator_key: OperatorOption = None) -> None:
    """Revoke an API key: requests with it get 401 from now on."""
    with _admin(url, operator_key) as admin:
        key = admin.keys.revoke(key_id).model_dump(mode="json")
    note(console, f"revoked {key['id']} of tenant {key['tenant']} at {key['revoked_at']}")
