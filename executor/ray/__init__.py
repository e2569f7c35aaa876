"""The Ray executor backend: sandbox hosts are Ray actors, one per node with a Docker Engine.

Selected by :class:`~sandpit.executor.config.RayConfig` (``SANDPIT_EXECUTOR_BACKEND=ray``,
``SANDPIT_RAY_ADDRESS``, :class:`~sandpit.executor.settings.BackendSettings`); needs the
``ray`` extra (``pip install -e '.[ray]'``). The local backend
(:class:`~sandpit.executor.pool.SandboxPool` in the API process) stays the default and
never imports Ray. Placement follows ROCK (the ROLL ecosystem's sandbox manager): Ray's own
scheduler, no home-made cluster protocol::

    API replica (RayExecutor) ──ray──►  SandboxHost actor "sandpit-host-<node>" (detached,
    API replica (RayExecutor) ──ray──►  one per node with resource sandpit_docker=1, pinned
                                        to it)  └─ SandboxPool ─► that node's Docker Engine

* **Hosts.** A node offers the custom resource ``sandpit_docker`` (``ray start
  --resources='{"sandpit_docker": 1}'``) when it has a Docker Engine and the sandbox image.
  Every :class:`RayExecutor` creates-or-gets the host actor of each such node by name
  (namespace ``sandpit``, ``lifetime="detached"``, pinned with a hard node affinity), so
  every API replica reaches the same hosts. A host owns that node's ``SandboxPool`` exactly
  as the local backend does (same hardening, runner, limits: the executor settings are
  passed to it whole).
* **Sessions live in the host**, keyed by the env id (``session_id``), so any replica can
  reach an env's session. Each hosted session has a *version*, bumped by every mutating
  request (call, restore) and by every attach; a replica's handle carries the version it
  last saw and a request with another one raises :class:`SessionClosed` (the handle is
  stale: another replica stepped the env). The API then drops its cached view and, on the
  client's retry, re-opens the env from its committed head state: the host *attaches* the
  existing session (restoring the head state when the sandbox differs from it) instead of
  starting a new one. Closing with a stale version is a no-op. So the database stays the
  truth and a sandbox never gets ahead of it silently.
* **Affinity.** ``env -> host`` is recorded through an :class:`~sandpit.executor.interface.Affinity` (the API keeps it
  in its database, table ``env_hosts``): a re-open goes to the recorded host while it is
  alive, else to the least-loaded live host.
* **Loss.** A host whose node died (or whose actor died) fails its requests with
  :class:`SandboxLost` (503 at the API, which drops the session); the env's next use opens
  it on another live host from its last committed snapshot: the same recovery path as a
  lost sandbox on one machine.
* **Drain** (an operator's orderly removal of a host, :meth:`RayExecutor.drain`): the host
  is recorded as draining where every replica reads it (the API's ``host_drains`` table,
  through the :class:`~sandpit.executor.interface.Affinity`), so no replica places anything new on it, and the host
  itself refuses new sessions and pool work (:class:`~sandpit.executor.errors.HostDraining`: the replica retries on
  another host, the client sees nothing). Each hosted session is then evicted once its
  in-flight call has finished (that call is answered and acknowledged normally) and its env's
  affinity moves to another host; the replica's next request finds the session closed (a
  retryable 503 the client library retries) and re-opens the env there from its last
  committed step: the lost-host recovery, with nothing cut. When the host holds no session
  and runs no work its pool is closed (containers removed), the actor is killed and the
  drain is recorded ``drained``; a drained host is not re-created (until undrained).
  The drain runs in a thread of one replica, recorded as the drain's *owner*; when that
  replica stops heart-beating (the API's ``replicas`` table, the evaluation runner's lease)
  a live replica claims the drain (compare-and-set on the owner) and resumes it here
  (:meth:`RayExecutor.drain` again: every step of a drain is idempotent).
* **Undrain** (:meth:`RayExecutor.undrain`, after the caller removed the drain record):
  a draining host takes work again: the drain thread (in whichever replica) re-reads the
  record at each pass and stops without closing the pool, every replica forgets the drain
  at its next refresh (also what it learnt from HostDraining answers), and the host's own
  ``draining`` flag is reset (:meth:`SandboxHost.undrain`); sessions already evicted
  re-open where their affinity now points. A drained host whose node is still alive is
  re-created on that node by the next refresh (the API refuses the undrain of a host
  whose node is gone).

* **Direct data path.** A Ray actor call costs more round trip than a plain RPC, so the
  session requests (opens and attaches, tool calls, restores, reads, closes) go over a
  *host link* instead: a gRPC channel from each replica to each host's
  :class:`~sandpit.executor.ray.link.LinkServer`, with TLS pinned to the host's own
  certificate, a token on every call and a deadline per request
  (:mod:`sandpit.executor.ray.link`). They reach the same host methods with the same
  versions and answers; Ray keeps placement, host creation, pool work, drains and the
  verdict on whether a host whose link broke is lost. ``RayExecutor(direct=False)`` (setting
  ``SANDPIT_RAY_DIRECT_CALLS=false``) sends everything through Ray.

Everything crossing Ray or a link is plain data (JSON-shaped dicts): results are
re-validated into the executor's pydantic models on the caller's side; executor errors are
re-raised as the same classes (:mod:`.wire`).

Modules: :mod:`.executor` (the replica side: ``RayExecutor``), :mod:`.session`
(``RaySession``), :mod:`.host` (the ``SandboxHost`` actor), :mod:`.drain` (drains and
undrains), :mod:`.affinity` (an in-process affinity), :mod:`.wire` (errors as data),
:mod:`.link` (the host link).
"""

from __future__ import annotations

from .affinity import MemoryAffinity
from .executor import RayExecutor
from .host import HOST_PREFIX, SandboxHost
from .session import RaySession

__all__ = ["HOST_PREFIX", "MemoryAffinity", "RayExecutor", "RaySession", "SandboxHost"]
