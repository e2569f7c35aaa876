"""Config templates (``pid1_templates.py``, ``child_template.run_config_template``) and
configs sent by hash: a session forked from the instance a template constructed once is
indistinguishable from one constructed from its config, confined like it, and shares no
mutable state with its siblings or its template; constructors that are not deterministic,
that change module-level state or leave threads behind are constructed per session; configs
that differ only in key order or in ``1``/``1.0``/``true`` are never conflated."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.docker.sandbox import Sandbox
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.configs import wire_config
from sandpit.executor.pool.session import Session

from ..conftest import FAST, TENANT, deferred_actions, template_state

pytestmark = pytest.mark.docker

SOURCE = '''
import copy
from typing import Any, Dict

REGISTRY: Dict[str, int] = {}
OS = lambda: [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "_wrap_close"][0].__init__.__globals__


class Shop:
    """Tables under self.data, built from the config (CONSTRUCTOR marks the variants)."""

    def __init__(self, init_config: Dict[str, Any]):
        self.data = copy.deepcopy(init_config.get("data", {}))
        self.seen = list(init_config)
        # CONSTRUCTOR

    def put(self, key: str, value: Any) -> str:
        self.data[key] = value
        REGISTRY[key] = REGISTRY.get(key, 0) + 1
        return str(sorted(self.data))

    def types(self) -> str:
        return repr([(k, type(v).__name__, v) for k, v in self.data.items()])

    def registry(self) -> str:
        return str(sorted(REGISTRY.items()))

    def identity(self) -> str:
        os = OS()
        fd = os["open"]("/proc/self/status", 0)
        text = os["read"](fd, 65536).decode()
        os["close"](fd)
        status = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        return repr({"ppid": os["getppid"](), "sid": os["getsid"](0), "pid": os["getpid"](),
                     "fds": sorted(int(f) for f in os["listdir"]("/proc/self/fd")),
                     "seccomp": status["Seccomp"].strip(), "threads": status["Threads"].strip()})

    def kill_everyone_else(self) -> str:
        os = OS()
        me = os["getpid"]()
        for entry in os["listdir"]("/proc"):
            if entry.isdigit() and int(entry) not in (1, me):
                try:
                    os["kill"](int(entry), 9)
                except OSError:
                    pass
        return "done"
'''


def variant(constructor: str) -> str:
    return SOURCE.replace("        # CONSTRUCTOR", "\n".join("        " + line for line in constructor.splitlines()))


@pytest.fixture(scope="module")
def pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    with docker_pool(pool_settings("config-templates", sessions_per_sandbox=8, pool_size=1,
                                   idle_timeout_s=300.0)) as pool:
        yield pool


def open_(pool: SandboxPool, sessions: list[Session], config: dict[str, Any], source: str = SOURCE) -> Session:
    session = pool.open_session(tenant=TENANT, source=source, class_name="Shop", init_config=config,
                                profile=pool.profile(overrides=FAST))
    sessions.append(session)
    return session


def settle(sandbox: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until no template is loading or waiting to start (config templates are built
    in the background, once the runner's loop is quiet after the open's reply)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = template_state(sandbox)
        if (state["loading"] == 0 and state["configs_loading"] == 0 and state["ready"] >= 1
                and deferred_actions(sandbox) == 0) or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def warm(pool: SandboxPool, sessions: list[Session], config: dict[str, Any], source: str = SOURCE) -> Session:
    """Open sessions of ``config`` until its config template had the chance to be built."""
    first = open_(pool, sessions, config, source)
    settle(first._sandbox)
    open_(pool, sessions, config, source)  # the environment's template is ready: the config's is built
    settle(first._sandbox)
    return first


def state_view(session: Session) -> Any:
    return session.state()


def test_forked_instance_equals_a_constructed_one_and_shares_nothing(pool, opened) -> None:
    config = {"data": {"a": {"n": 1, "f": 1.0, "t": True, "z": None}, "b": [1, 2, 3]}, "extra": "x"}
    first = warm(pool, opened, config)
    sandbox = first._sandbox
    before = template_state(sandbox)
    assert before["configs_ready"] == 1, before
    a = open_(pool, opened, config)
    b = open_(pool, opened, config)
    assert a._sandbox is sandbox and b._sandbox is sandbox
    after = template_state(sandbox)
    assert after["forked"] == before["forked"] + 2
    named_a, named_b = a.take_opened(), b.take_opened()  # forked: the state is named by digest, not sent
    assert named_a.digest is not None and named_a.digest == named_b.digest
    assert named_a.attributes is None and named_b.attributes is None
    # indistinguishable from the constructed first session: state, types, key order
    assert state_view(a) == state_view(b) == state_view(first)
    assert list(state_view(a)) == list(state_view(first))
    assert a.call("types").observation == first.call("types").observation
    # confined like any session: PID 1's child, own process session, descriptors 0-3
    spawned, forked = eval(first.call("identity").observation), eval(a.call("identity").observation)  # noqa: S307
    assert forked["ppid"] == 1 and forked["sid"] == forked["pid"]
    for field in ("fds", "seccomp", "threads"):
        assert forked[field] == spawned[field], field
    # copy-on-write: what one changes, nobody else sees (instance and module globals)
    a.call("put", {"key": "c", "value": 3})
    assert "c" in state_view(a)["data"] and "c" not in state_view(b)["data"]
    assert a.call("registry").observation == "[('c', 1)]"
    assert b.call("registry").observation == "[]"
    late = open_(pool, opened, config)
    assert "c" not in state_view(late)["data"] and late.call("registry").observation == "[]"
    assert late.take_opened() == named_a  # the same state, named by the same digest


@pytest.mark.parametrize("constructor,reason", [
    ("import random\nself.token = random.random()", "differ"),
    ("import datetime\nself.token = datetime.datetime.now().isoformat()", "differ"),
    ("import uuid\nself.token = str(uuid.uuid4())", "differ"),
    ("REGISTRY['instances'] = REGISTRY.get('instances', 0) + 1", "module-level state"),
    ("Shop.count = len(list(init_config)) + len(Shop.__dict__)", "module-level state"),
    ("if OS()['fork']() == 0:\n    OS()['_exit'](0)", "child process"),
    ("if OS()['getppid']() != 1:\n    OS()['_exit'](0)", "did not report"),
], ids=["random", "clock", "uuid", "global-counter", "class-attribute", "fork", "probe-dies"])
def test_constructors_that_are_not_repeatable_are_constructed_per_session(pool, opened, constructor,
                                                                         reason) -> None:
    source = variant(constructor)
    config = {"data": {"k": 1}, "case": reason}
    first = warm(pool, opened, config, source)
    state = template_state(first._sandbox)
    assert state["configs_ready"] == 0 and any(reason in r for r in state["config_reasons"]), state
    again = open_(pool, opened, config, source)
    if "token" in constructor:  # constructed anew: its own value, not a copy of another's
        assert state_view(again)["token"] != state_view(first)["token"]
    if "REGISTRY" in constructor:  # each session sees exactly its own construction
        assert again.call("registry").observation == "[('instances', 1)]"


def test_configs_differing_in_key_order_or_number_type_are_never_conflated(pool, opened) -> None:
    configs = [{"data": {"x": 1, "y": 2}}, {"data": {"y": 2, "x": 1}}, {"data": {"x": 1.0, "y": 2}},
               {"data": {"x": True, "y": 2}}]
    hashes = {wire_config(c)[1] for c in configs}  # type: ignore[index]
    assert len(hashes) == len(configs)
    for config in configs:
        warm(pool, opened, config)
    for config in configs:
        session = open_(pool, opened, config)
        expected = repr([(k, type(v).__name__, v) for k, v in config["data"].items()])
        assert session.call("types").observation == expected


def test_a_constructor_mutating_its_config_leaves_other_sessions_alone(pool, opened) -> None:
    source = variant("init_config['data']['k'].append(len(init_config['data']['k']))\n"
                     "self.data = init_config['data']")
    config = {"data": {"k": [0]}}
    warm(pool, opened, config, source)
    one, two = open_(pool, opened, config, source), open_(pool, opened, config, source)
    assert state_view(one)["data"] == state_view(two)["data"] == {"k": [0, 1]}
    one.call("put", {"key": "k", "value": []})
    assert state_view(two)["data"] == {"k": [0, 1]}


SLOW_CONSTRUCTOR = "total = 0\nfor i in range(2_000_000):\n    total += i\nself.total = total"


def test_a_config_template_is_built_while_other_sessions_call(pool, opened) -> None:
    """A config template constructs its instance twice, the second time in a process it
    forks (the probe), and compares the two. PID 1 sweeps strays after every call, and it
    took the probe of a template still loading for one: the probe died, the constructions
    "differed", and the config never got its template while other sessions of the sandbox
    were busy (measured: 3 MB creates back to back stayed at ~550 ms instead of ~33). Here
    a construction takes a few hundred milliseconds and another session calls all the
    while its template is built."""
    source = variant(SLOW_CONSTRUCTOR)
    config = {"data": {"k": 1}, "case": "busy sandbox"}
    first = open_(pool, opened, config, source)
    sandbox = first._sandbox
    settle(sandbox)
    open_(pool, opened, config, source)  # its second open: the config template is built now
    started = time.monotonic()
    while not template_state(sandbox)["configs_loading"] and time.monotonic() < started + 5:
        assert first.call("types").status == "ok"  # the build starts once the open is answered
    calls = 0
    while template_state(sandbox)["configs_loading"] and time.monotonic() < started + 30:
        assert first.call("types").status == "ok"  # each call ends with a sweep of strays
        calls += 1
    state = template_state(sandbox)
    assert calls >= 3, (calls, state)  # the build overlapped the calls' sweeps
    assert state["configs_ready"] == 1 and state["config_reasons"] == [], state
    again = open_(pool, opened, config, source)
    assert again._sandbox is sandbox and state_view(again)["total"] == sum(range(2_000_000))
    assert template_state(sandbox)["forked"] > state["forked"]


def test_a_session_killing_its_config_template_falls_back(pool, opened) -> None:
    config = {"data": {"victim": 1}}
    first = warm(pool, opened, config)
    sandbox = first._sandbox
    assert template_state(sandbox)["configs_ready"] >= 1
    hostile = open_(pool, opened, config)
    hostile.call("kill_everyone_else")
    time.sleep(0.3)
    assert template_state(sandbox)["configs_ready"] == 0
    late = open_(pool, opened, config)
    assert state_view(late)["data"] == {"victim": 1}
    assert late.call("put", {"key": "z", "value": 1}).status == "ok"


def test_a_config_the_runner_let_go_is_sent_again(pool, opened) -> None:
    first = open_(pool, opened, {"data": {"one": 1}})
    sandbox = first._sandbox
    assert isinstance(sandbox, Sandbox)
    config = {"data": {"new": 2}}
    wire = wire_config(config)
    assert wire is not None
    pool.sets.all[sandbox.id].configs.add(wire[1])  # the host believes the runner holds it; it does not
    session = open_(pool, opened, config)
    assert session._sandbox is sandbox and state_view(session)["data"] == {"new": 2}


def test_the_runner_refuses_bytes_that_do_not_match_their_hash(pool, opened) -> None:
    first = open_(pool, opened, {"data": {"one": 1}})
    sandbox = first._sandbox
    assert isinstance(sandbox, Sandbox)
    real = b'{"data":{"a":1}}'
    forged = hashlib.sha256(b'{"data":{"a":2}}').hexdigest()
    reply = sandbox.request("open", session="forged-" + forged[:8], source=SOURCE, class_name="Shop",
                            config_hash=forged, config_b64=base64.b64encode(real).decode())
    assert reply["status"] == "fault" and "does not match" in reply["message"]
    reply = sandbox.request("open", session="unknown-" + forged[:8], source=SOURCE, class_name="Shop",
                            config_hash=hashlib.sha256(b"never sent").hexdigest())
    assert reply["status"] == "fault" and reply.get("missing_config") is True


ROWS = variant("self.data['rows'] = [{'i': i} for i in range(init_config.get('rows', 0))]")
"""A constructor whose state of 100,000 rows (from a config of a few bytes) makes a config
template of ~55 MiB: three of them fill half of a 384 MiB sandbox."""


@pytest.fixture(scope="module")
def tight_pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    """One sandbox of 384 MiB: config templates are built below 192 MiB of it."""
    with docker_pool(pool_settings("config-room", sessions_per_sandbox=8, pool_size=1, idle_timeout_s=300.0,
                                   sandbox_memory_mib=384)) as pool:
        yield pool


def open_closed(pool: SandboxPool, config: dict[str, Any], sandbox: Any) -> None:
    """Open a session of ROWS with ``config`` in ``sandbox``, wait for its templates, close
    it (its own memory goes)."""
    session = pool.open_session(tenant=TENANT, source=ROWS, class_name="Shop", init_config=config,
                                profile=pool.profile(overrides=FAST))
    assert session._sandbox is sandbox
    settle(sandbox)
    session.close()


def short_hash(config: dict[str, Any]) -> str:
    wire = wire_config(config)
    assert wire is not None
    return wire[1][:16]


def test_config_templates_make_room_by_memory_least_recently_used_first(tight_pool, opened) -> None:
    configs = {name: {"rows": 100_000, "tag": name} for name in "ABCD"}
    a, b, d = (short_hash(configs[name]) for name in "ABD")
    sandbox = open_(tight_pool, opened, {"rows": 0}, ROWS)._sandbox  # holds the sandbox and its templates
    for name in "AB":
        for _ in range(2):
            open_closed(tight_pool, configs[name], sandbox)
    state = template_state(sandbox)
    assert state["configs_lru"] == [a, b] and state["configs_evicted"] == 0, state
    for name in "CD":  # a third and a fourth fill over half the memory: the oldest go first
        for _ in range(2):
            open_closed(tight_pool, configs[name], sandbox)
    state = template_state(sandbox)
    assert state["configs_evicted"] >= 1 and a not in state["configs_lru"], state
    assert state["configs_lru"][-1] == d and 2 <= len(state["configs_lru"]) <= 3, state
    # D's next session is forked from its template (no construction) and is a whole instance
    session = open_(tight_pool, opened, configs["D"], ROWS)
    named = session.take_opened()
    assert named.attributes is None and named.digest is not None  # answered with the template's digest only
    assert len(session.state()["data"]["rows"]) == 100_000
    # every template in use since A's previous open: reopening A evicts none of them (a
    # tenant cycling through more configs than fit rebuilds nothing), whatever the memory
    for name in "BCD":
        if short_hash(configs[name]) in state["configs_lru"]:
            open_closed(tight_pool, configs[name], sandbox)
    kept = template_state(sandbox)
    open_closed(tight_pool, configs["A"], sandbox)
    after = template_state(sandbox)
    assert after["configs_evicted"] == kept["configs_evicted"], after
    assert set(kept["configs_lru"]) <= set(after["configs_lru"]), after
