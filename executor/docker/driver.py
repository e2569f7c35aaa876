"""The Docker backend's :class:`~sandpit.executor.pool.driver.SandboxDriver`: sandboxes are
hardened containers on one Docker Engine (:class:`~.sandbox.Sandbox`), and a pool's
leftovers are found and removed by label.

* **Open.** Connect (``docker_host`` or the environment's default), refuse a runtime Sandpit's
  isolation does not hold under (:func:`~.engine.check_runtime`), resolve the image, take
  the pool's owner lease (:class:`~.owners.OwnerLease`, before any container of the pool
  exists) and, with ``reap_on_start``, remove the sandboxes of owners proven dead.
* **Start.** One container per sandbox, labelled with its tenant, the pool and its owner;
  the lease is renewed first when a renewal is due, so a container being created is
  always covered by a fresh lease.
* **Maintain.** Renew the lease when due (a file touch, never an engine call); every
  ``reap_interval_s`` hand the pool a *sweep* to run on its start workers: it removes the
  sandboxes of owners proven dead while every live owner's keep running
  (:func:`~.engine.reap`), so a slow engine never delays the lease renewal.
* **Close.** Remove every container labelled with the pool, then give up the lease (mark
  it expired instead when a removal failed, so that another pool's sweep removes what is
  left).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import docker

from ..errors import ExecutorError
from ..profiles import ResourceProfile
from ..settings import ExecutorSettings, ImageSettings, get_image_settings, get_settings
from . import engine, owners
from .images import resolve_image
from .sandbox import Sandbox

log = logging.getLogger("sandpit.executor.docker")


class DockerDriver:
    """Starts sandbox containers for one pool on a Docker Engine (module docstring).

    Args:
        settings: the engine (``docker_host``, ``runtime``, ``image``), container limits,
            uids, leases and sweeps (default: this process's ``SANDPIT_EXECUTOR_*``).
        image_settings: how the default image tag is computed (``SANDPIT_IMAGE_*``).
        client: a Docker client to use instead of connecting in :meth:`open`.
    """

    def __init__(self, settings: ExecutorSettings | None = None, image_settings: ImageSettings | None = None,
                 client: docker.DockerClient | None = None) -> None:
        self.settings = settings or get_settings()
        self.image_settings = image_settings or get_image_settings()
        self._client = client
        self.image = ""
        """The sandbox image reference, resolved by :meth:`open`."""
        self.pool_id = ""
        self._lease: owners.OwnerLease | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._sweeping = False
        self._next_sweep = 0.0
        self.reaped = 0
        """Containers of dead owners this driver removed (start-up reap and sweeps)."""
        self.sweeps = 0
        """Periodic sweeps of the engine finished (``reap_interval_s``)."""

    @property
    def client(self) -> docker.DockerClient:
        """The Docker client. Raises ExecutorError before :meth:`open`."""
        if self._client is None:
            raise ExecutorError("pool not started")
        return self._client

    @property
    def maintenance_s(self) -> float:
        """Half the lease's renewal period, and ``reap_interval_s`` when sweeps are on."""
        periods = [60.0]
        if self._lease is not None:
            periods.append(self._lease.renew_period_s / 2)
        if self.settings.reap_interval_s:
            periods.append(self.settings.reap_interval_s)
        return min(periods)

    def open(self, pool_id: str) -> None:
        """Connect, check the runtime, resolve the image, take the lease, reap leftovers.

        Raises:
            DockerUnavailable: engine unreachable, or ``settings.runtime`` not registered as
                Sandpit needs it (``engine.check_runtime``). ImageError: image not built.
        """
        if self._client is None:
            self._client = engine.make_client(self.settings)
        engine.check_runtime(self._client, self.settings.runtime)
        self.image = resolve_image(self._client, self.settings.image, self.image_settings)
        self.pool_id = pool_id
        self._lease = owners.OwnerLease(self.settings.resolved_lease_dir(), engine.owner_id(), owners.owner_ns(),
                                        pool_id, self.settings.owner_lease_timeout_s)
        self._lease.acquire()  # before any container of this pool exists
        if self.settings.reap_on_start:
            self.reaped += engine.reap(self._client, exclude_pool=pool_id, leases=self._lease_view())
        self._next_sweep = time.monotonic() + self.settings.reap_interval_s

    def start(self, tenant: str, profile: ResourceProfile, uid: int) -> Sandbox:
        """A started container of ``tenant`` (:meth:`Sandbox.start`).

        Raises:
            SandboxStartError: the runner did not say hello in time (the container is gone).
            DockerUnavailable, ImageError: the engine refused. ExecutorError: before :meth:`open`.
        """
        if self._lease is not None:
            self._lease.renew_if_due()  # a new container is never covered by a stale lease
        return Sandbox.start(client=self.client, settings=self.settings, profile=profile, image=self.image,
                             tenant=tenant, pool_id=self.pool_id, uid=uid)

    def ping(self) -> None:
        """Ask the engine whether it answers (``GET /_ping``).

        Raises:
            DockerUnavailable: it does not. ExecutorError: the driver was never opened.
        """
        engine.ping(self.client)

    def memory_total(self) -> int:
        """The host's MemTotal in bytes (``/proc/meminfo``; 0 when unreadable)."""
        return engine.host_memory_total()

    def maintain(self) -> Callable[[], None] | None:
        """Renew the lease when due; the sweep when ``reap_interval_s`` has passed since the
        last one was handed out and none is pending (else None)."""
        if self._lease is not None:
            self._lease.renew_if_due()
        if not self.settings.reap_interval_s or self._sweeping or time.monotonic() < self._next_sweep:
            return None
        self._sweeping = True
        self._next_sweep = time.monotonic() + self.settings.reap_interval_s
        return self._sweep

    def stats(self) -> dict[str, int]:
        """``reaped`` (containers of dead owners removed) and ``sweeps`` (finished)."""
        with self._lock:
            return {"reaped": self.reaped, "sweeps": self.sweeps}

    def close(self) -> None:
        """Remove every container labelled with the pool, then give up the lease.

        Raises:
            DockerUnavailable: the engine did not answer the listing or a removal (the
                lease is marked expired, so that any other pool's sweep removes the rest).
        """
        self._closed = True
        lease, self._lease = self._lease, None
        try:
            if self._client is not None and self.pool_id:
                for container in engine.list_sandboxes(self._client, pool=self.pool_id):
                    engine.remove_container(self._client, container.id)
        except BaseException:
            if lease is not None:
                lease.expire()
            raise
        if lease is not None:
            lease.release()

    def _sweep(self) -> None:
        """One sweep: remove the sandboxes of dead owners on the engine (never this
        pool's, never unlabelled ones, never those of owners it cannot judge), then the
        lease files long expired that no container names. Failures are logged; the next
        sweep tries again."""
        try:
            if self._closed:
                return
            view = self._lease_view()
            removed = engine.reap(self.client, exclude_pool=self.pool_id, unowned=False, leases=view)
            view.collect_garbage()
            with self._lock:
                self.reaped += removed
                self.sweeps += 1
        except Exception as exc:  # noqa: BLE001 - logged; the next sweep tries again
            log.warning("sweep for leftover sandboxes failed: %s", exc)
        finally:
            self._sweeping = False

    def _lease_view(self) -> owners.LeaseView:
        """The lease directory as of now: this pool's lease renewed first, its mtime the
        clock every other lease is judged by (the filesystem's; the host's when the
        lease cannot be written)."""
        now = self._lease.renew() if self._lease is not None else None
        return owners.LeaseView(self.settings.resolved_lease_dir(), time.time() if now is None else now)
