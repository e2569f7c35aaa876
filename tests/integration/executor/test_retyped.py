"""What an ``init`` reports of ``init_config`` keys that replace an attribute the constructor
set to a value of another type (``child_instance.retyped_attributes``), on real sandboxes:
for sessions constructed from their config and for sessions forked from a config template
(whose construction ran once, in the template)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.session import Session

from ..conftest import FAST, TENANT, template_state

pytestmark = pytest.mark.docker

SOURCE = '''
from collections import defaultdict


class Shop:
    def __init__(self, init_config):
        orders = init_config.get("orders", [])
        self.orders = orders if isinstance(orders, dict) else {o["id"]: o for o in orders}
        self.tags = defaultdict(list)
        self.user = init_config.get("user", "anon")
        self.count = 0
        self.maybe = None

    def get_order(self, order_id):
        return self.orders.get(order_id)
'''
RETYPED_ORDERS = {"key": "orders", "constructed": "dict", "config": "list"}


@pytest.fixture(scope="module")
def pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    with docker_pool(pool_settings("retyped", sessions_per_sandbox=8, pool_size=1, idle_timeout_s=300.0)) as pool:
        yield pool


def open_(pool: SandboxPool, sessions: list[Session], config: dict[str, Any]) -> Session:
    session = pool.open_session(tenant=TENANT, source=SOURCE, class_name="Shop", init_config=config,
                                profile=pool.profile(overrides=FAST))
    sessions.append(session)
    return session


def test_constructed_and_template_forked_sessions_report_the_same_keys(pool, opened) -> None:
    config = {"orders": [{"id": "o1"}], "tags": {"a": ["x"]}, "user": "ada", "count": 1.5, "maybe": [1],
              "new": {"n": 1}}
    expected = [RETYPED_ORDERS, {"key": "tags", "constructed": "defaultdict", "config": "dict"}]
    first = open_(pool, opened, config)
    assert first.retyped == expected
    sandbox = first._sandbox
    deadline = time.monotonic() + 30
    forked_before = template_state(sandbox)["forked"]
    while template_state(sandbox)["configs_ready"] < 1 and time.monotonic() < deadline:
        open_(pool, opened, config)  # the config's second open builds its template
        time.sleep(0.2)
    assert template_state(sandbox)["configs_ready"] >= 1
    forked = open_(pool, opened, config)
    assert template_state(sandbox)["forked"] > forked_before
    assert forked.take_opened().digest == first.take_opened().digest  # the template's instance
    assert forked.retyped == expected
    # EnvScaler's rule, unchanged: the list replaced the dict
    assert "'list' object has no attribute 'get'" in forked.call("get_order", {"order_id": "o1"}).observation


def test_same_types_new_keys_and_no_config_report_nothing(pool, opened) -> None:
    for config in ({"orders": {"o1": {}}, "user": "x", "count": 2}, {"fresh": [1]}, {}, None):
        assert open_(pool, opened, config).retyped == []  # type: ignore[arg-type]


def test_a_restored_session_keeps_what_its_open_reported(pool, opened) -> None:
    session = open_(pool, opened, {"orders": [{"id": "o1"}]})
    session.call("get_order", {"order_id": "o1"})
    assert session.retyped == [RETYPED_ORDERS]
