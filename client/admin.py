"""`client.admin`: the operator's API (`/v1/admin`): tenants, their API keys, the audit log.

Every call carries the operator key given to the client (`Client(..., operator_key=...)`;
the `sandpit tenants` commands read `SANDPIT_OPERATOR_KEY`), never the tenant key; without
one a call raises `Unauthorized` (code `no_operator_key`) before anything is sent.

Usage::

    with Client(url, operator_key=key) as client:
        tenant = client.admin.tenants.create("team-a", quotas={"max_live_envs": 64})
        tenant.api_key.key                      # the first API key, shown only here
        client.admin.keys.create("team-a", name="ci").key
        client.admin.audit.list(tenant="team-a", limit=20).data
        client.admin.cluster.drain("sandpit-host-0123abcd", wait_s=300)   # Ray backend
        client.admin.cluster.undrain("sandpit-host-0123abcd")             # takes work again
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from . import calls
from .cluster_models import ClusterHost, ClusterStatus, HostDrain, HostUndrain
from .errors import NotFound, SandpitError
from .models import ApiKey, AuditEvent, Page, Tenant
from .transport import AsyncTransport, SyncTransport

__all__ = ["Admin", "AsyncAdmin"]


def _tenant_fields(display_name: str | None, quotas: Mapping[str, Any] | None, create_key: bool | None,
                   key_name: str | None, key_expires_in_s: float | None) -> dict[str, Any]:
    return {"display_name": display_name, "quotas": dict(quotas) if quotas is not None else None,
            "create_key": create_key, "key_name": key_name, "key_expires_in_s": key_expires_in_s}


def _update_fields(display_name: str | None, quotas: Mapping[str, Any] | None, model_base_url: str | None,
                   model_api_key: str | None) -> dict[str, Any]:
    return {"display_name": display_name, "quotas": dict(quotas) if quotas is not None else None,
            "model_base_url": model_base_url, "model_api_key": model_api_key}


class Tenants:
    """`client.admin.tenants`."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, tenant_id: str, *, display_name: str | None = None, quotas: Mapping[str, Any] | None = None,
               create_key: bool = True, key_name: str | None = None,
               key_expires_in_s: float | None = None) -> Tenant:
        """Create a tenant and (unless `create_key` is False) its first API key, whose
        secret is in `api_key.key` of the result and nowhere else, ever.

        Args:
            tenant_id: `[a-z0-9][a-z0-9_-]{0,63}`.
            quotas: overrides of the server's default quotas (`max_profile` may be partial).
            key_expires_in_s: the first key stops working after this many seconds.

        Raises:
            Conflict: the id exists. InvalidRequest: a bad id or unknown quota fields.
        """
        return self._t.run(calls.tenant_create(tenant_id, _tenant_fields(display_name, quotas, create_key, key_name,
                                                                         key_expires_in_s)))

    def list(self) -> Page[Tenant]:
        """Every tenant with its effective quotas and number of active keys."""
        return self._t.run(calls.tenant_list())

    def get(self, tenant_id: str) -> Tenant:
        """One tenant. Raises `NotFound`."""
        return self._t.run(calls.tenant_get(tenant_id))

    def update(self, tenant_id: str, *, display_name: str | None = None, quotas: Mapping[str, Any] | None = None,
               model_base_url: str | None = None, model_api_key: str | None = None) -> Tenant:
        """Change only what is given: `quotas` replaces the overrides, `model_base_url` /
        `model_api_key` are the default rollout model endpoint (the key is stored
        encrypted and never returned; `""` removes it). Raises `NotFound`, `InvalidRequest`."""
        return self._t.run(calls.tenant_update(tenant_id, _update_fields(display_name, quotas, model_base_url,
                                                                         model_api_key)))


class Keys:
    """`client.admin.keys`: tenants' API keys."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, tenant_id: str, *, name: str | None = None, expires_in_s: float | None = None) -> ApiKey:
        """A new key for the tenant; its secret (`key`) is in this result only. Raises `NotFound`."""
        return self._t.run(calls.key_create(tenant_id, name, expires_in_s))

    def list(self, tenant_id: str) -> Page[ApiKey]:
        """The tenant's keys (prefix and dates; never the secret). Raises `NotFound`."""
        return self._t.run(calls.key_list(tenant_id))

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key: requests with it get 401 from now on (idempotent). Raises `NotFound`."""
        return self._t.run(calls.key_revoke(key_id))


class Audit:
    """`client.admin.audit`: the audit log of every tenant."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def list(self, *, tenant: str | None = None, action: str | None = None, limit: int | None = None,
             offset: int | None = None) -> Page[AuditEvent]:
        """A page of events, newest first, of one `tenant` (or all) and one `action` (or all)."""
        return self._t.run(calls.audit_list(tenant, action, limit, offset))


DRAIN_POLL_S = 1.0
"""Seconds between two looks at the cluster while waiting for a drain."""


def _host_of(status: ClusterStatus, host: str) -> ClusterHost:
    for entry in status.hosts:
        if entry.host == host:
            return entry
    raise NotFound(f"sandbox host {host!r} is not listed by the cluster any more", status_code=404, code="not_found")


class Cluster:
    """`client.admin.cluster`."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def status(self) -> ClusterStatus:
        """Nodes, sandbox hosts (per-host sandboxes, sessions, capacity, envs placed, drain
        state) and the API replicas sharing the database (`sandpit cluster status`)."""
        return self._t.run(calls.cluster_status())

    def drain(self, host: str, *, force: bool = False, wait_s: float | None = None) -> HostDrain:
        """Drain sandbox host `host` (Ray backend): nothing new is placed on it, its calls in
        flight finish and are acknowledged, its envs resume on other hosts from their last
        committed step on next use, then its pool is shut down. Idempotent.

        Args:
            force: drain it even when it is the last host taking envs (they then wait for
                a new host: 503 until one joins).
            wait_s: seconds to wait until the host is `drained` (None: return at once, the
                drain goes on in the server), polling `status()` every second.

        Raises:
            NotFound: unknown host. Conflict: the last host (without `force`), or the local
            backend. SandpitError (code `drain_timeout`): still draining after `wait_s`.
        """
        answer = self._t.run(calls.cluster_drain(host, force))
        if wait_s is None or answer.status == "drained":
            return answer
        deadline = time.monotonic() + wait_s
        while _host_of(self.status(), host).drain != "drained":
            if time.monotonic() > deadline:
                raise SandpitError(f"host {host!r} is still draining after {wait_s:g} s", code="drain_timeout")
            time.sleep(DRAIN_POLL_S)
        return self._t.run(calls.cluster_drain(host, force))

    def undrain(self, host: str) -> HostUndrain:
        """Let sandbox host `host` take new envs again (Ray backend): a running drain stops
        where it is (envs it already moved stay where they re-opened); a drained host whose
        Ray node is still alive is re-created there with a new pool. A host that was never
        drained: a no-op (`previous` None).

        Raises:
            NotFound: unknown host. Conflict: the host's Ray node is gone.
        """
        return self._t.run(calls.cluster_undrain(host))


class AsyncCluster:
    """`AsyncClient.admin.cluster`: see `Cluster`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def status(self) -> ClusterStatus:
        """See `Cluster.status`."""
        return await self._t.run(calls.cluster_status())

    async def drain(self, host: str, *, force: bool = False, wait_s: float | None = None) -> HostDrain:
        """See `Cluster.drain`."""
        answer = await self._t.run(calls.cluster_drain(host, force))
        if wait_s is None or answer.status == "drained":
            return answer
        deadline = time.monotonic() + wait_s
        while _host_of(await self.status(), host).drain != "drained":
            if time.monotonic() > deadline:
                raise SandpitError(f"host {host!r} is still draining after {wait_s:g} s", code="drain_timeout")
            await asyncio.sleep(DRAIN_POLL_S)
        return await self._t.run(calls.cluster_drain(host, force))

    async def undrain(self, host: str) -> HostUndrain:
        """See `Cluster.undrain`."""
        return await self._t.run(calls.cluster_undrain(host))


class Admin:
    """`client.admin`: `tenants`, `keys`, `audit`, `cluster` (see the module docstring)."""

    def __init__(self, transport: SyncTransport) -> None:
        self.tenants = Tenants(transport)
        self.keys = Keys(transport)
        self.audit = Audit(transport)
        self.cluster = Cluster(transport)


class AsyncTenants:
    """`AsyncClient.admin.tenants`: see `Tenants`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, tenant_id: str, *, display_name: str | None = None,
                     quotas: Mapping[str, Any] | None = None, create_key: bool = True, key_name: str | None = None,
                     key_expires_in_s: float | None = None) -> Tenant:
        """See `Tenants.create`."""
        return await self._t.run(calls.tenant_create(tenant_id, _tenant_fields(display_name, quotas, create_key,
                                                                               key_name, key_expires_in_s)))

    async def list(self) -> Page[Tenant]:
        """See `Tenants.list`."""
        return await self._t.run(calls.tenant_list())

    async def get(self, tenant_id: str) -> Tenant:
        """See `Tenants.get`."""
        return await self._t.run(calls.tenant_get(tenant_id))

    async def update(self, tenant_id: str, *, display_name: str | None = None,
                     quotas: Mapping[str, Any] | None = None, model_base_url: str | None = None,
                     model_api_key: str | None = None) -> Tenant:
        """See `Tenants.update`."""
        return await self._t.run(calls.tenant_update(tenant_id, _update_fields(display_name, quotas, model_base_url,
                                                                               model_api_key)))


class AsyncKeys:
    """`AsyncClient.admin.keys`: see `Keys`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, tenant_id: str, *, name: str | None = None, expires_in_s: float | None = None) -> ApiKey:
        """See `Keys.create`."""
        return await self._t.run(calls.key_create(tenant_id, name, expires_in_s))

    async def list(self, tenant_id: str) -> Page[ApiKey]:
        """See `Keys.list`."""
        return await self._t.run(calls.key_list(tenant_id))

    async def revoke(self, key_id: str) -> ApiKey:
        """See `Keys.revoke`."""
        return await self._t.run(calls.key_revoke(key_id))


class AsyncAudit:
    """`AsyncClient.admin.audit`: see `Audit`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def list(self, *, tenant: str | None = None, action: str | None = None, limit: int | None = None,
                   offset: int | None = None) -> Page[AuditEvent]:
        """See `Audit.list`."""
        return await self._t.run(calls.audit_list(tenant, action, limit, offset))


class AsyncAdmin:
    """`AsyncClient.admin`: see `Admin`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self.tenants = AsyncTenants(transport)
        self.keys = AsyncKeys(transport)
        self.audit = AsyncAudit(transport)
        self.cluster = AsyncCluster(transport)
