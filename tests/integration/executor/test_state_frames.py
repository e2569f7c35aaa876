"""States the host sends into a sandbox on the real engine: a ``checks`` request's two
states (as its frame's attachments, or as base64) and a ``restore``'s snapshot (as the
base64 of its JSON text) travel as the host's text, which PID 1
forwards to the process without parsing it (``runner/pid1_job_requests.py``,
``runner/pid1_sessions.py``). Checks and sessions get exactly the host's values,
whatever the text holds, and frames the host should never send are refused, reported
per check, or cost the session's process (re-created at its last good state), with the
sandbox serving on."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.jobs import encode_json_state
from sandpit.executor.pool.warm import PooledSandbox
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.results import Snapshot

from .test_checks import TENANT, check, run

pytestmark = pytest.mark.docker

AWKWARD = {"quote": 'he said "[{"', "backslashes": "C:\\new\\\\table\\", "escaped_quote": '\\"',
           "unicode": "caf\u00e9 \U0001f600 \u2028", "nul": "a\x00b", "brackets": "]]]}}}", "nested": [[[{"k": ["]"]}]]],
           "numbers": [0, -1, 2**63, 1.5e-300, 3.0], "price": "costs $5", "dollar_key": {"k$": {"a": 1}}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


GOOD = b64(json.dumps(encode_json_state({"balance": 80})).encode())
"""A state a check can read ``balance`` from, as the host sends it."""


@pytest.fixture
def sandbox(pool: SandboxPool, fast_profile: ResourceProfile) -> Iterator[PooledSandbox]:
    """A sandbox slot of the tests' tenant held for the test (as ``run_checks`` holds one)."""
    slot = pool._job_slot(TENANT, fast_profile)
    try:
        yield slot.get()
    finally:
        slot.release()


def send(sandbox: PooledSandbox, sources: list[str], initial_b64: Any, final_b64: Any) -> dict[str, Any]:
    reply: dict[str, Any] = sandbox.handle.request(
        "checks", timeout_s=30.0, time_limit_s=5.0, checks=[{"check_func": s} for s in sources],
        initial_state_b64=initial_b64, final_state_b64=final_b64)
    return reply


def assert_evaluates(sandbox: PooledSandbox) -> None:
    """The sandbox evaluates a good batch as ever."""
    results = send(sandbox, [check("return final_state['balance'] == 80")], GOOD, GOOD)["results"]
    assert [(r["status"], r["passed"]) for r in results] == [("ok", True)]


def test_checks_see_the_hosts_values_exactly(pool, fast_profile) -> None:
    same = check(f"return final_state == {AWKWARD!r} and initial_state == {{'before': {AWKWARD!r}}}")
    results = run(pool, fast_profile, [same, check("return final_state['quote'][9:] == '[{\"'")],
                  initial={"before": AWKWARD}, final=AWKWARD)
    assert [(r.status, r.passed, r.error) for r in results] == [("ok", True, None)] * 2


def test_frames_the_host_never_sends_are_refused(sandbox) -> None:
    for initial, final, field in [
        (None, GOOD, "initial_state_b64"), (GOOD, 5, "final_state_b64"), ("not base64!", GOOD, "initial_state_b64"),
        (GOOD, GOOD[:-1], "final_state_b64"), (b64(b"[1]"), GOOD, "initial_state_b64"),
        (GOOD, b64(b'"text"'), "final_state_b64"),
    ]:
        reply = send(sandbox, [check("return True")], initial, final)
        assert reply["status"] == "fault" and f"'{field}'" in reply["message"], reply
    assert_evaluates(sandbox)


def test_states_attached_to_the_frame_reach_the_checks_exactly_and_bad_attachments_are_refused(sandbox) -> None:
    """How the pool sends a batch's states (the frame's two attachments, ``runner/attached.py``)."""
    def attached(sources: list[str], parts: list[Any]) -> dict[str, Any]:
        reply: dict[str, Any] = sandbox.handle.request("checks", timeout_s=30.0, time_limit_s=5.0,
                                                       checks=[{"check_func": s} for s in sources], attached=parts)
        return reply

    text = json.dumps(encode_json_state(AWKWARD), ensure_ascii=False).encode()
    before = json.dumps(encode_json_state({"balance": 80})).encode()
    reply = attached([check(f"return final_state == {AWKWARD!r} and initial_state == {{'balance': 80}}")],
                     [before, text])
    assert [(r["status"], r["passed"], r["error"]) for r in reply["results"]] == [("ok", True, None)], reply
    for parts in ([before], [before, text, text], [before, b"[1]"], [b"", before], [before, b'"{}"']):
        reply = attached([check("return True")], parts)
        assert reply["status"] == "fault" and "attachments" in reply["message"], reply
    assert_evaluates(sandbox)


@pytest.mark.parametrize("state", [b'{"balance": 80}', b'{"balance": ["q", 1]}', b'{"balance": []}'])
def test_a_state_that_is_not_an_encoded_state_fails_each_check(sandbox, state) -> None:
    reply = send(sandbox, [check("return True"), check("return False")], GOOD, b64(state))
    assert reply["status"] == "ok"
    assert [(r["status"], r["passed"], r["error"]) for r in reply["results"]] == [
        ("error", False, "restoring the state failed: the state is not an encoded state ({name: [kind, data]})")] * 2
    assert_evaluates(sandbox)


def test_text_that_is_not_json_loses_the_batch_not_the_sandbox(sandbox) -> None:
    reply = send(sandbox, [check("return True"), check("return True")], GOOD, b64(b"{not json]]}"))
    assert reply["status"] == "ok", reply
    assert [(r["status"], r["passed"]) for r in reply["results"]] == [("crashed", False)] * 2, reply
    assert_evaluates(sandbox)


def test_tags_are_rebuilt_however_the_text_spells_them(sandbox) -> None:
    """A state whose text names a rendering's tag (here with the ``\\u0024`` escape for
    ``$``) is walked for tags; one whose text cannot hold a tag is taken as parsed."""
    tagged = b'{"tags":["j",{"\\u0024set":[1,2]}],"when":["j",{"$date":"2026-01-02"}]}'
    untagged = b'{"tags":["j",{"set":[1,2]}],"when":["j","2026-01-02"]}'
    sees = check("import datetime\nreturn final_state == {'tags': {1, 2}, 'when': datetime.date(2026, 1, 2)} "
                 "and initial_state == {'tags': {'set': [1, 2]}, 'when': '2026-01-02'}")
    results = send(sandbox, [sees], b64(untagged), b64(tagged))["results"]
    assert [(r["status"], r["passed"], r["error"]) for r in results] == [("ok", True, None)]


BOX = """
class Box:
    def __init__(self, init_config):
        self.value = init_config.get("value")
        self.count = 0

    def bump(self) -> int:
        self.count += 1
        return self.count
"""


def test_a_restore_sets_exactly_the_hosts_values(open_env) -> None:
    session = open_env(source=BOX, class_name="Box", init_config={"value": 1})
    snapshot = Snapshot(attributes={"value": ["j", AWKWARD], "count": ["j", 7]})
    session.restore(snapshot)
    assert session.state() == {"value": AWKWARD, "count": 7}
    assert Snapshot(attributes=session.read_state()) == snapshot
    assert session.call("bump", {}).observation == "8"


def test_restore_frames_the_host_never_sends(open_env) -> None:
    session = open_env(source=BOX, class_name="Box", init_config={"value": 1})
    assert session.call("bump", {}).observation == "1"
    sandbox = session._sandbox
    assert sandbox is not None
    good = b64(json.dumps({"value": ["j", 2], "count": ["j", 5]}).encode())
    for fields in [{}, {"snapshot": {"value": ["j", 2]}}, {"snapshot_b64": 5}, {"snapshot_b64": "not base64!"},
                   {"snapshot_b64": good[:-1]}, {"snapshot_b64": b64(b"[1]")}, {"snapshot_b64": b64(b"")}]:
        reply = sandbox.request("restore", session=session.id, **fields)
        assert reply["status"] == "fault" and "'snapshot_b64'" in reply["message"], (fields, reply)
    assert session.state() == {"value": 1, "count": 1}  # nothing happened
    for text in (b"{not json]]}", b'{"value": 1}', b'{"value": ["p", "not a pickle"]}'):
        reply = sandbox.request("restore", session=session.id, snapshot_b64=b64(text))
        assert reply["status"] == "crashed", (text, reply)
        assert session.state() == {"value": 1, "count": 1}  # re-created at its last good state
        assert session.call("bump", {}).observation == "2" and session.restore(Snapshot(
            attributes={"value": ["j", 1], "count": ["j", 1]})) is None
    reply = sandbox.request("restore", session=session.id, snapshot_b64=good)
    assert reply == {"id": reply["id"], "status": "ok"}  # the snapshot it sent is not echoed
    assert session.state() == {"value": 2, "count": 5}


def test_an_open_sets_exactly_the_hosts_values(pool, fast_profile) -> None:
    """A session opened with a snapshot (an env brought back after eviction, or moved)
    gets the host's values, reports no state back (the host holds it), and is re-created
    at that state when its process is lost before any call."""
    snapshot = {"value": ["j", AWKWARD], "count": ["j", 7]}
    session = pool.open_session(tenant=TENANT, source=BOX, class_name="Box", init_config={"value": 1},
                                profile=fast_profile, snapshot=snapshot)
    try:
        assert session.take_opened().attributes is None
        assert session.state() == {"value": AWKWARD, "count": 7}
        sandbox = session._sandbox
        assert sandbox is not None
        reply = sandbox.request("restore", session=session.id, snapshot_b64=b64(b"{not json]]}"))
        assert reply["status"] == "crashed", reply
        assert Snapshot(attributes=session.read_state()) == Snapshot(attributes=snapshot)  # the open's state
        assert session.call("bump", {}).observation == "8"
    finally:
        session.close()


def open_raw(sandbox: PooledSandbox, sid: str, **fields: Any) -> dict[str, Any]:
    reply: dict[str, Any] = sandbox.handle.request("open", session=sid, source=BOX, class_name="Box",
                                                   init_config={"value": 1}, **fields)
    return reply


def test_open_frames_the_host_never_sends(sandbox) -> None:
    good = b64(json.dumps({"value": ["j", AWKWARD], "count": ["j", 5]}).encode())
    for fields in [{"snapshot": {"value": ["j", 2]}}, {"snapshot": None}, {"snapshot_b64": None},
                   {"snapshot_b64": 5}, {"snapshot_b64": "not base64!"}, {"snapshot_b64": good[:-1]},
                   {"snapshot_b64": b64(b"[1]")}, {"snapshot_b64": b64(b"")}, {"snapshot_b64": " " + good}]:
        reply = open_raw(sandbox, "frames", **fields)
        assert reply["status"] == "fault" and "'snapshot_b64'" in reply["message"], (fields, reply)
    for n, text in enumerate((b"{not json]]}", b'{"value": 1}', b'{"value": ["p", "not a pickle"]}')):
        reply = open_raw(sandbox, f"bad-{n}", snapshot_b64=b64(text))
        assert reply["status"] in ("error", "crashed") and reply["observation"], (text, reply)
        assert open_raw(sandbox, f"bad-{n}")["message"].endswith("session ids are single-use")  # it was closed
    reply = open_raw(sandbox, "frames", snapshot_b64=good)  # the id refused above was never opened
    assert reply["status"] == "ok" and not {"snapshot", "snapshot_digest", "template"} & set(reply), reply
    state = sandbox.handle.request("state", session="frames")
    assert state["status"] == "ok" and state["state"] == {"value": AWKWARD, "count": 5}  # the JSON view
    assert sandbox.handle.request("close", session="frames")["status"] == "ok"
    assert_evaluates(sandbox)
