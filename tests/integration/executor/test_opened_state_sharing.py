"""Sessions opened into a state the API already stores (same digest) take the API's
objects as their snapshot (``Session.share_opened_state``), so the store's encoder sees
untouched records as the same objects from the first step on. Before, an env whose
sessions were not forked from a config template (one session per sandbox, a config
that cannot be sent by hash) applied its first keyed delta to its own decoded copy, and
the store re-compared every record of the state: tau-bench airline's first writing step
took 39 ms against 8 ms for the others. Real sandboxes, the real store encoder."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.api.db.store import PendingBlobs, apply_delta, encode_state
from sandpit.executor.docker import docker_pool
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.session import Session
from sandpit.executor.results import Snapshot

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
    # constructs and sends its state back (the case that lost sharing)
    with docker_pool(pool_settings("opened-sharing", sessions_per_sandbox=1, pool_size=0,
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


def _untouched_shared(session: Session, stored: dict[str, Any], table: str, key: str) -> tuple[int, int]:
    """(records of ``table`` that are the stored objects, records of it) after a step."""
    data = session.snapshot().attributes["data"][1]
    records = data[table]
    same = sum(1 for k, record in records.items() if record is stored["data"][1][table].get(k) and k != key)
    return same, len(records)


def test_a_session_opened_into_a_stored_state_shares_its_objects(pool: SandboxPool, sessions: list[Session]) -> None:
    config = _config()
    first = _open(pool, sessions, config)
    opened = first.snapshot()
    assert opened.digest is not None
    cache = encode_state(opened.attributes, PendingBlobs())  # what the API stores for that digest
    stored = cache.encoded()

    second = _open(pool, sessions, config)  # constructed again, its state decoded apart
    assert second.snapshot().digest == opened.digest
    assert second.snapshot().attributes["data"][1] is not stored["data"][1]
    assert second.share_opened_state(stored, opened.digest)
    assert second.snapshot().attributes["data"][1] is stored["data"][1]

    result = second.call("touch", {"table": "orders", "key": "orders0007"})
    assert result.status == "ok", result
    assert _untouched_shared(second, stored, "orders", "orders0007") == (1499, 1500)
    assert _untouched_shared(second, stored, "users", "") == (1500, 1500)
    after = apply_delta(cache, {"data": second.snapshot().attributes["data"]}, [], PendingBlobs())
    assert after.attrs["data"].encoded[1]["orders"]["orders0007"]["n"] == 8

    third = _open(pool, sessions, config)  # not shared: nothing in common (what the fix avoids)
    third.call("touch", {"table": "orders", "key": "orders0007"})
    assert _untouched_shared(third, stored, "orders", "orders0007") == (0, 1500)


def test_sharing_is_refused_unless_the_state_is_still_the_opened_one(pool: SandboxPool,
                                                                     sessions: list[Session]) -> None:
    config = _config()
    session = _open(pool, sessions, config)
    opened = session.snapshot()
    assert opened.digest is not None
    other = encode_state(opened.attributes, PendingBlobs()).encoded()
    assert not session.share_opened_state(other, "0" * 64)  # another digest
    assert not session.share_opened_state({"data": other["data"]}, opened.digest)  # other attributes
    assert not session.share_opened_state({**other, "extra": ["j", 1]}, opened.digest)
    session.call("touch", {"table": "users", "key": "users0001"})
    assert session.snapshot().digest is None
    assert not session.share_opened_state(other, opened.digest)  # moved on: a step changed it
    assert session.snapshot().attributes["data"][1]["users"]["users0001"]["n"] == 2

    restored = _open(pool, sessions, config)
    restored.restore(Snapshot(attributes=opened.attributes))
    assert not restored.share_opened_state(other, opened.digest)  # a restore forgets the digest
