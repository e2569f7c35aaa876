"""`Client` (sync) and `AsyncClient` (async): one connection pool each and the namespaces
over it (`environments`, `scenarios`, `envs`, `evaluations`, `admin`).

Both share everything but the transport: the calls (`sandpit.client.calls`), the error
mapping (`sandpit.client.errors`) and the retry policy (`sandpit.client.transport`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

import httpx

from . import calls
from .admin import Admin, AsyncAdmin
from .environments import AsyncEnvironments, Environments
from .envs import AsyncEnvs, Envs
from .errors import Unavailable
from .evaluations import AsyncEvaluations, Evaluations
from .models import ExecResult
from .replicas import AsyncReplicaTransport, ReplicaTransport, parse_replicas
from .scenarios import AsyncScenarios, Scenarios
from .transport import AsyncTransport, RetryPolicy, SyncTransport, from_environment, http_kwargs

__all__ = ["AsyncClient", "Client"]


class Client:
    """Synchronous Sandpit client over one `httpx.Client` (a context manager closes it).

    Args:
        base_url: e.g. `http://127.0.0.1:8000` (paths `/v1/...` are appended); default the
            `SANDPIT_URL` environment variable, else `http://127.0.0.1:8600`. Several API
            replicas separated by commas get the requests in turn (`sandpit.client.replicas`;
            `replica_answers` counts them).
        api_key: sent as `Authorization: Bearer <api_key>`; default `SANDPIT_API_KEY`.
        timeout: seconds for connect, read, write and pool each; a step that takes longer
            raises `SandpitConnectionError(request_sent=True)` and is not retried.
        max_retry_wait_s: total seconds one call may spend sleeping between retries (429/503
            honoring Retry-After; transport failures that are safe to repeat); 0 disables.
        transport: an httpx transport (tests, proxies); default a normal connection pool.
        headers: extra headers for every request.
        operator_key: the operator key, sent instead of `api_key` by `client.admin` calls
            only (never read from the environment).
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 max_retry_wait_s: float = 30.0, *, transport: httpx.BaseTransport | None = None,
                 headers: Mapping[str, str] | None = None, operator_key: str | None = None) -> None:
        policy = RetryPolicy(max_retry_wait_s)
        base_url, api_key = from_environment(base_url, api_key)
        replicas = parse_replicas(base_url)
        self._replicas = ReplicaTransport(replicas, transport) if len(replicas) > 1 else None
        self._http = httpx.Client(transport=self._replicas or transport,
                                  **http_kwargs(str(replicas[0]), api_key, timeout, headers))
        self._t = SyncTransport(self._http, policy, operator_key)
        self.environments = Environments(self._t)
        self.envs = Envs(self._t)
        self.scenarios = Scenarios(self._t)
        self.evaluations = Evaluations(self._t)
        self.admin = Admin(self._t)

    @property
    def replica_answers(self) -> dict[str, int]:
        """Responses received per API replica (``host:port``) when `base_url` named several;
        empty for a single server."""
        return dict(self._replicas.rotation.answered) if self._replicas is not None else {}

    def validate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`POST /v1/validate` (fields as the server's `ValidateRequest`); the verdict dict."""
        return self._t.run(calls.validate(body))

    def execute(self, code: str, *, stdin: str | None = None, timeout_s: float | None = None,
                files: Mapping[str, str] | None = None) -> ExecResult:
        """Run `code` as a script in a sandbox (`POST /v1/execute`)."""
        return self._t.run(calls.execute(code, stdin, timeout_s, files))

    def health(self) -> dict[str, Any]:
        """`GET /healthz`: the process is up. Raises `SandpitError` otherwise."""
        return self._t.run(calls.health())

    def ready(self) -> bool:
        """`GET /readyz`: True when the server can take work, False on 503 (not retried)."""
        try:
            self._t.run(calls.ready())
        except Unavailable:
            return False
        return True

    def close(self) -> None:
        """Close the connection pool; the client is unusable afterwards."""
        self._http.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        # a connection pool is shared, never copied: gymnasium deep-copies an env's
        # constructor kwargs (`spec.make()`), which carry the client
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncClient:
    """Asynchronous Sandpit client over one `httpx.AsyncClient`; arguments as `Client`.

    Use `async with AsyncClient(...) as client:` or `await client.aclose()`.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 max_retry_wait_s: float = 30.0, *, transport: httpx.AsyncBaseTransport | None = None,
                 headers: Mapping[str, str] | None = None, operator_key: str | None = None) -> None:
        policy = RetryPolicy(max_retry_wait_s)
        base_url, api_key = from_environment(base_url, api_key)
        replicas = parse_replicas(base_url)
        self._areplicas = AsyncReplicaTransport(replicas, transport) if len(replicas) > 1 else None
        self._http = httpx.AsyncClient(transport=self._areplicas or transport,
                                       **http_kwargs(str(replicas[0]), api_key, timeout, headers))
        self._t = AsyncTransport(self._http, policy, operator_key)
        self.environments = AsyncEnvironments(self._t)
        self.envs = AsyncEnvs(self._t)
        self.scenarios = AsyncScenarios(self._t)
        self.evaluations = AsyncEvaluations(self._t)
        self.admin = AsyncAdmin(self._t)

    @property
    def replica_answers(self) -> dict[str, int]:
        """See `Client.replica_answers`."""
        return dict(self._areplicas.rotation.answered) if self._areplicas is not None else {}

    async def validate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """See `Client.validate`."""
        return await self._t.run(calls.validate(body))

    async def execute(self, code: str, *, stdin: str | None = None, timeout_s: float | None = None,
                      files: Mapping[str, str] | None = None) -> ExecResult:
        """See `Client.execute`."""
        return await self._t.run(calls.execute(code, stdin, timeout_s, files))

    async def health(self) -> dict[str, Any]:
        """See `Client.health`."""
        return await self._t.run(calls.health())

    async def ready(self) -> bool:
        """See `Client.ready`."""
        try:
            await self._t.run(calls.ready())
        except Unavailable:
            return False
        return True

    async def aclose(self) -> None:
        """Close the connection pool; the client is unusable afterwards."""
        await self._http.aclose()

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        return self  # shared, never copied (see `Client.__deepcopy__`)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
