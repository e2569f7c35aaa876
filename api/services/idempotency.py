"""Idempotent requests: the ``Idempotency-Key`` header of step, reset, create and fork.

A request with a key (:func:`parse_key`: 1 to :data:`KEY_MAX_CHARS` printable ASCII
characters) is identified by its digest (:func:`request_digest`: method, route template,
env id, query and body bytes). :meth:`Idempotency.begin` claims the key for the caller's
tenant (keys of different tenants never meet) or finds it taken:

* taken by a finished request with the same digest: its stored response is replayed
  (:class:`Replay`) and nothing runs;
* taken by a request with another digest: 409 ``idempotency_key_reused``;
* taken by a request still in flight on any replica: 409 ``idempotency_key_in_flight``
  with ``Retry-After`` (the caller is not kept waiting: a worker thread held per retry
  would let a retrying client fill the server's threads). A claim older than
  ``idempotency_lease_s`` belongs to a request whose replica died; it is taken over.

A request that succeeds stores its status and body on the key: a step in the
transaction of its own step row (the group commit), so a committed step always has its
key and a key never has an uncommitted step; a create and a reset (their doors,
:mod:`sandpit.api.http.create_env` and :mod:`sandpit.api.http.reset_env`) in the
transaction that commits the env or the episode, with the same guarantee
(:class:`~sandpit.api.db.idempotency.ReplyOnKey`); a fork (and a create or reset through
FastAPI's routes, :meth:`sandpit.api.http.deps.Idempotent.respond`) in a transaction right
after its own. A request that ends in an error stores nothing and releases the
key, so its retry runs again: Sandpit's errors (4xx, 503) commit nothing, and most are
worth retrying as they are (429 quotas, 503 capacity, a 409 ``episode_ended`` after a
reset). A malformed action is not an error but a recorded ``rejected`` step (200): it
is stored and replayed like any step. Keys expire ``idempotency_key_ttl_s`` after the
first request (:meth:`Idempotency.expire`, run by the janitor).

A step takes its key with :meth:`Idempotency.check` instead, and claims it in its own
transaction (a deferred claim, :mod:`sandpit.api.db.idempotency`): the check only reads
the key's row (and this process's keys in flight), so a keyed step costs one read before
it runs instead of a transaction of its own, and an error leaves nothing to release. The
rules above hold the same way, with one difference: a step whose key another replica
claims while it runs learns it at its commit (409 ``idempotency_key_in_flight``, the
replay when that request's response is stored by then, or the 503 of an env whose head
moved twice under it, as for any two replicas stepping one env at once), after its action
ran in the sandbox; the action's effect is discarded with the uncommitted state (the env resumes
from its committed head), so it still runs at most once in the env's recorded history.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
from dataclasses import dataclass

from ..db.database import Database
from ..db.idempotency import (
    DeferredClaim,
    KeyClaim,
    StoredKey,
    claim_key,
    delete_expired,
    find_key,
    release_key,
    store_response,
)
from ..errors import IdempotencyKeyInFlight, IdempotencyKeyReused
from ..settings import ApiSettings
from .common import utcnow

KEY_HEADER = "Idempotency-Key"
"""The request header that carries the key."""
KEY_MAX_CHARS = 255
"""Longest key (characters)."""
KEY_PATTERN = r"^[\x20-\x7e]{1,255}$"
"""What a key may be: 1 to 255 printable ASCII characters (space included)."""
_KEY = re.compile(KEY_PATTERN)
IN_FLIGHT_RETRY_AFTER_S = 1
"""``Retry-After`` of a 409 ``idempotency_key_in_flight`` (seconds)."""


@dataclass(frozen=True)
class Replay:
    """The stored response of a key's first request: HTTP ``status`` and JSON ``body``."""

    status: int
    body: bytes


def valid_key(value: str) -> bool:
    """Whether ``value`` is a key :data:`KEY_PATTERN` accepts."""
    return _KEY.fullmatch(value) is not None


def request_digest(method: str, route: str, env_id: str | None, query: bytes, body: bytes) -> str:
    """SHA-256 (hex) of what makes two requests the same request: the method, the route's
    template (``/v1/envs/{env_id}/step``), the env id (None: a route without one), the raw
    query string and the raw body bytes. Two bodies that differ only in spacing or key
    order are different requests (the client resends the same bytes)."""
    digest = hashlib.sha256()
    for part in (method.encode("ascii"), route.encode("utf-8"), (env_id or "").encode("utf-8"), query):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    digest.update(body)
    return digest.hexdigest()


class Idempotency:
    """Claims, stored responses and expiry of idempotency keys (the module docstring).

    Args:
        settings: ``idempotency_key_ttl_s``, ``idempotency_lease_s``.
        db: the control database (table ``idempotency_keys``).
    """

    def __init__(self, settings: ApiSettings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self._flying: set[tuple[str, str]] = set()
        """(tenant, key) of this process's deferred claims whose step has not ended."""
        self._flying_lock = threading.Lock()

    def begin(self, tenant: str, key: str, digest: str) -> KeyClaim | Replay:
        """Claim ``key`` for ``tenant``'s request of ``digest`` (a :class:`KeyClaim`: run
        the request, then :meth:`finish` or :meth:`release`), or the stored response of its
        first request (:class:`Replay`: send it, run nothing). Raises
        IdempotencyKeyReused (409: the key's request had another digest),
        IdempotencyKeyInFlight (409 + Retry-After: that request has not finished),
        ServiceUnavailable (database)."""
        token = secrets.token_hex(16)
        found = claim_key(self.db, tenant, key, digest, token, utcnow(), self.settings.idempotency_key_ttl_s,
                          self.settings.idempotency_lease_s)
        if found is None:
            return KeyClaim(tenant, key, token)
        return _found(found, key, digest)

    def check(self, tenant: str, key: str, digest: str) -> KeyClaim | Replay:
        """A step's deferred claim of ``key`` for ``tenant``'s request of ``digest`` (module
        docstring): a :class:`KeyClaim` whose row the step's transaction writes (call
        :meth:`forget` when the step ends, whatever its end), or the stored response
        (:class:`Replay`: send it, run nothing). Reads the key's row, writes nothing.
        Raises IdempotencyKeyReused (409: another digest), IdempotencyKeyInFlight (409 +
        Retry-After: a request with the key is still running, in this process or, with a
        live claim, on any replica), ServiceUnavailable (database)."""
        with self._flying_lock:  # noted before the read: a step of this process that ends first is read
            if (tenant, key) in self._flying:
                raise _in_flight(key)
            self._flying.add((tenant, key))
        try:
            found = find_key(self.db, tenant, key, utcnow(), self.settings.idempotency_lease_s)
        except BaseException:
            self._forget(tenant, key)
            raise
        if found is not None:
            self._forget(tenant, key)
            return _found(found, key, digest)
        return KeyClaim(tenant, key, secrets.token_hex(16),
                        DeferredClaim(digest, self.settings.idempotency_key_ttl_s, self.settings.idempotency_lease_s))

    def reply_of_taken(self, tenant: str, key: str, digest: str) -> Replay | None:
        """For ``tenant``'s step of ``digest`` whose commit found its key ``key`` taken by
        another request (nothing was committed): that request's stored reply when it has
        one by now; None when the key is free again (that request failed: a retry runs
        the step). Raises IdempotencyKeyInFlight (it still runs), IdempotencyKeyReused
        (it was another request), ServiceUnavailable (database)."""
        again = self.check(tenant, key, digest)
        if isinstance(again, Replay):
            return again
        self.forget(again)
        return None

    def forget(self, claim: KeyClaim) -> None:
        """End :meth:`check`'s claim in this process (its step committed, or failed and
        committed nothing). A claim whose row exists is left alone."""
        if claim.deferred is not None:
            self._forget(claim.tenant, claim.key)

    def _forget(self, tenant: str, key: str) -> None:
        with self._flying_lock:
            self._flying.discard((tenant, key))

    def finish(self, claim: KeyClaim, status: int, body: bytes) -> None:
        """Store the response of ``claim``'s request (reset, create, fork: after its own
        transaction committed; a step stores it in its group commit instead). Raises
        IdempotencyKeyInFlight (the claim lapsed and a retry took it over),
        ServiceUnavailable (database)."""
        store_response(self.db, claim.tenant, claim.key, claim.token, status, body)

    def release(self, claim: KeyClaim) -> None:
        """Forget ``claim`` when its request ended in an error (nothing stored; a retry
        runs again): a :meth:`check` claim, which holds no row, is :meth:`forget`.
        Raises ServiceUnavailable (database)."""
        if claim.deferred is not None:
            self.forget(claim)
            return
        release_key(self.db, claim.tenant, claim.key, claim.token)

    def expire(self) -> int:
        """Delete keys past their ``expires_at`` (the janitor's task); returns how many."""
        return delete_expired(self.db, utcnow())


def _found(found: StoredKey, key: str, digest: str) -> Replay:
    """What a request of ``digest`` gets when ``key``'s row ``found`` holds the key: the
    stored response, or the refusal. Raises IdempotencyKeyReused, IdempotencyKeyInFlight."""
    if found.digest != digest:
        raise IdempotencyKeyReused(f"{KEY_HEADER} {key!r} was already used for another request (method, "
                                   "route, env or body); use a new key for a new request", field=KEY_HEADER)
    if found.status is None or found.body is None:
        raise _in_flight(key)
    return Replay(found.status, found.body)


def _in_flight(key: str) -> IdempotencyKeyInFlight:
    """The 409 for ``key`` held by a request that has not finished."""
    return IdempotencyKeyInFlight(f"the first request with {KEY_HEADER} {key!r} has not finished; retry to get "
                                  "its response", field=KEY_HEADER, retry_after=IN_FLIGHT_RETRY_AFTER_S)
