"""A session's reply carries large JSON changes as keyed deltas (``["k", ops]``), passed on
as they are: whoever holds the previous state applies them (``StateDelta.applied_to``),
once. Applied to the API's own copy (a store cache of the opened state, here one shared
by two sessions of the same digest), untouched records stay the same objects, so the
store's encoder skips them from the first step on (tau-bench airline: a first writing step
that re-compares every record costs ~30 ms more). Real sandboxes, the real store encoder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.api.db.store import PendingBlobs, StateCache, apply_delta, encode_state
from sandpit.executor.docker import docker_pool
from sandpit.executor.errors import SessionError
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.session import Session
from sandpit.executor.results import StateDelta

from ..conftest import FAST, TENANT

pytestmark = pytest.mark.docker

SOURCE = '''
class Tables:
    """All state under self.data (tables of records), like tau-bench's domains."""

    def __init__(self, init_config):
        self.data = init_config.get("data", {})
        self.count = 0

    def touch(self, table: str, key: str) -> str:
        self.data[table][key]["n"] += 1
        self.count += 1
        return str(self.data[table][key])
'''


def _config() -> dict[str, Any]:
    return {"data": {table: {f"{table}{i:04d}": {"n": i, "pad": "p" * 60, "tags": [table, i]} for i in range(1500)}
                     for table in ("users", "orders")}}


@pytest.fixture(scope="module")
def pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    # one session per sandbox: configs are sent whole, no config template, every open
    # constructs and sends its state back
    with docker_pool(pool_settings("keyed-deltas", sessions_per_sandbox=1, pool_size=0,
                                   idle_timeout_s=120.0)) as pool:
        yield pool


@pytest.fixture
def sessions(pool: SandboxPool) -> Iterator[list[Session]]:
    opened: list[Session] = []
    yield opened
    for session in opened:
        session.close()


def _open(pool: SandboxPool, sessions: list[Session], config: dict[str, Any]) -> Session:
    session = pool.open_session(tenant=TENANT, source=SOURCE, class_name="Tables", init_config=config,
                                profile=pool.profile(overrides=FAST))
    sessions.append(session)
    return session


def _untouched_shared(after: StateCache, before: StateCache, table: str, key: str) -> tuple[int, int]:
    """(records of ``table`` in ``after`` that are ``before``'s objects, records of it)."""
    records = after.attrs["data"].encoded[1][table]
    previous = before.attrs["data"].encoded[1][table]
    same = sum(1 for k, record in records.items() if record is previous.get(k) and k != key)
    return same, len(records)


def test_keyed_deltas_apply_once_to_the_callers_copy_and_share_what_they_do_not_touch(
        pool: SandboxPool, sessions: list[Session]) -> None:
    config = _config()
    first = _open(pool, sessions, config)
    opened = first.take_opened()
    assert opened.attributes is not None and opened.digest is not None
    assert first.take_opened().attributes is None  # handed over once: the handle keeps no copy
    cache = encode_state(opened.attributes, PendingBlobs())  # the API's initial state for that digest

    second = _open(pool, sessions, config)  # constructed again: same digest, the API reuses its copy
    assert second.take_opened().digest == opened.digest
    result = second.call("touch", {"table": "orders", "key": "orders0007"})
    assert result.status == "ok", result
    assert result.delta.set["data"][0] == "k"  # a keyed change, not the whole 300 kB value
    after = apply_delta(cache, result.delta.applied_to(cache.entry), result.delta.deleted, PendingBlobs())
    assert after.attrs["data"].encoded[1]["orders"]["orders0007"]["n"] == 8
    assert cache.attrs["data"].encoded[1]["orders"]["orders0007"]["n"] == 7  # the previous head is unchanged
    assert _untouched_shared(after, cache, "orders", "orders0007") == (1499, 1500)
    assert _untouched_shared(after, cache, "users", "") == (1500, 1500)
    assert second.read_state()["data"][1]["orders"]["orders0007"]["n"] == 8  # the sandbox agrees


def test_a_keyed_delta_against_another_state_is_refused(pool: SandboxPool, sessions: list[Session]) -> None:
    session = _open(pool, sessions, _config())
    session.take_opened()
    result = session.call("touch", {"table": "users", "key": "users0001"})
    assert result.delta.set["data"][0] == "k", result.delta
    for previous in ({"data": ["j", {"orders": {}}]}, {"data": ["j", [1, 2]]}, {"data": ["u", {"$repr": {}}]}, {}):
        with pytest.raises(SessionError, match="does not apply"):
            result.delta.applied_to(previous.get)
    forged = StateDelta(set={"data": ["k", {"v": 2, "ops": [["s", ["users", "users0001", "n", "deeper"], 1]]}]})
    with pytest.raises(SessionError, match="does not apply"):
        forged.applied_to(session.read_state().get)
