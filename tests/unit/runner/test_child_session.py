"""Pure helpers of the in-sandbox session child (imported, never run as a process here):
state encoding (EnvScaler state: every non-dunder attribute), tool-name checks, EnvScaler
init detection. The rendering itself (``child_render``) is exercised through these encodings and
the integration tests (``test_episode.py``, ``test_checks.py``)."""

from __future__ import annotations

import base64
import json
import pickle
import socket
import threading

import pytest
from sandpit.executor.results import check_encoded
from sandpit.sandbox_images.runner import child_session as child
from sandpit.sandbox_images.runner import limits, protocol, wire
from sandpit.sandbox_images.runner.protocol import ProtocolViolation


class Tag(str):
    pass


def test_str_subclass_is_pickled() -> None:
    # json.dumps accepts it, but it would come back as a plain str (wire.json_native)
    kind, _, rendering = child.encode_value(Tag("x"), None)
    assert kind == "p" and json.loads(rendering) == "x"


def test_encode_value_kinds() -> None:
    assert child.encode_value({"a": [1, 2]}, None) == ("j", '{"a":[1,2]}')
    kind, data, rendering = child.encode_value((1, {2, 3}), None)
    assert kind == "p" and pickle.loads(base64.b64decode(data)) == (1, {2, 3})  # noqa: S301 - our own bytes
    assert json.loads(rendering) == {"$tuple": [1, {"$set": [2, 3]}]}
    kind, rendering = child.encode_value(threading.Lock(), None)
    assert kind == "u" and "lock" in json.loads(rendering)["$repr"]["repr"]
    kind, _, rendering = child.encode_value(float("nan"), None)
    assert kind == "p" and json.loads(rendering) == {"$float": "nan"}  # kept exactly, never as JSON


def test_encode_value_reuses_the_cached_tuple_when_unchanged() -> None:
    cached = child.encode_value([1, 2, 3], None)
    assert child.encode_value([1, 2, 3], cached) is cached
    assert child.encode_value([1, 2, 4], cached) is not cached
    pcached = child.encode_value((1,), None)
    assert child.encode_value((1,), pcached) is pcached


def test_unrepresentable_values_are_bounded() -> None:
    class Hostile:
        def __reduce__(self):
            raise TypeError("no pickling")

        def __repr__(self):
            raise RuntimeError("no repr either")

    kind, rendering = child.encode_value(Hostile(), None)
    assert kind == "u"
    body = json.loads(rendering)["$object"]  # attributes are read without repr
    assert body["type"].endswith("Hostile") and body["attrs"] == {}

    class Huge:
        __slots__ = ()

        def __reduce__(self):
            raise TypeError("no")

        def __repr__(self):
            return "x" * 100_000

    kind, rendering = child.encode_value(Huge(), None)  # no attributes: its repr, bounded
    assert kind == "u" and len(json.loads(rendering)["$repr"]["repr"]) <= 4096 + 3


def test_error_observation_and_bounded_traceback() -> None:
    def recurse(n: int, message: str) -> None:
        if n == 0:
            raise ValueError(message)
        recurse(n - 1, message)

    for message in ("bad input", "bad input " + "y" * 10_000):
        try:
            recurse(200, message)
        except ValueError as exc:
            assert wire.error_observation(exc) == f"Error: ValueError: {message}"
            text = child.bounded_traceback(exc)
        assert len(text) <= limits.SESSION_TRACEBACK_CHARS + 64  # + the "characters cut" marker
        assert text.count("in recurse") <= 8  # only the last frames
    assert text.startswith("Traceback (most recent call last):")  # head kept
    assert "characters cut]" in text and text.rstrip().endswith("y" * 20)  # tail kept
    assert "ValueError: bad input" in child.bounded_traceback(_raised(ValueError("bad input")))



def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - returns it with a traceback
        return caught


class Shop:
    limit = 5

    def __init__(self) -> None:
        self.stock = {"a": 1}
        self.reads = 0
        self._private = "hidden"

    def buy(self, item: str) -> int:
        self.stock[item] -= 1
        return self.stock[item]

    @property
    def total(self):
        self.reads += 1  # a getter with a side effect
        return lambda: sum(self.stock.values())

    class Nested:
        pass


def make_session() -> child.Session:
    session = child.Session(ctrl_fd=-1, limits={})
    session.instance = Shop()
    return session


@pytest.mark.parametrize("name", ["__class__", "__init__", "_private", "limit", "stock", "missing", "total",
                                  "Nested", "not an identifier", 42])
def test_op_call_rejects_everything_but_public_methods(name: object) -> None:
    session = make_session()
    status, observation, _ = session.op_call({"name": name, "arguments": {}})
    assert status == "rejected", observation
    assert observation.startswith("Error: ")


def test_rejected_property_is_not_evaluated() -> None:
    session = make_session()
    assert session.op_call({"name": "total", "arguments": {}})[0] == "rejected"
    assert session.instance.reads == 0


def test_op_call_rejects_non_object_arguments_and_calls_tools() -> None:
    session = make_session()
    assert session.op_call({"name": "buy", "arguments": ["a"]})[0] == "rejected"
    assert session.op_call({"name": "buy", "arguments": {"item": "a"}}) == ("ok", "0", None)


def test_delta_and_snapshot_round_trip() -> None:
    session = make_session()
    full = json.loads(session.delta_json(full=True))
    # EnvScaler's state: every non-dunder attribute, _private ones included
    assert full == {"set": {"stock": ["j", {"a": 1}], "reads": ["j", 0], "_private": ["j", "hidden"]}, "del": []}
    session.instance.stock["a"] = 9
    session.instance.extra = (1, 2)
    session.instance.__dunder__ = "never state"
    del session.instance.reads
    delta = json.loads(session.delta_json())
    assert delta["set"]["stock"] == ["j", {"a": 9}]
    assert delta["set"]["extra"][0] == "p" and delta["set"]["extra"][2] == {"$tuple": [1, 2]}
    assert delta["del"] == ["reads"]
    assert json.loads(session.state_json()) == {"stock": {"a": 9}, "_private": "hidden", "extra": {"$tuple": [1, 2]}}
    session.apply_snapshot(full["set"])
    assert {k: v for k, v in vars(session.instance).items() if not k.startswith("__")} == {
        "stock": {"a": 1}, "reads": 0, "_private": "hidden"}


def test_check_encoded_refuses_malformed_entries() -> None:
    good = {"a": ["j", {"x": 1}], "b": ["p", "AAAA", {"$set": []}], "c": ["u", {"$repr": {}}], "d": ["p", "AAAA"]}
    assert check_encoded(good, "snapshot") is good
    for bad in ({"a": ["j"]}, {"a": ["x", 1]}, {"a": ["p", 5]}, {"a": "j"}, ["j", 1], {"a": ["p", "A", 1, 2]},
                {"a": ["u"]}):
        with pytest.raises(ProtocolViolation):
            check_encoded(bad, "snapshot")


def _keyed_session(records: dict) -> child.Session:
    class Store:  # trusted test class: our code, run on the host on purpose
        def __init__(self) -> None:
            self.count = 0
            self.records = records

    session = child.Session.__new__(child.Session)
    session.instance, session.cache, session.limits = Store(), {}, {}
    return session


def test_large_objects_travel_as_path_deltas_that_merge_back_exactly() -> None:
    from sandpit.sandbox_images.runner.protocol import apply_keyed

    records = {f"r{i:04d}": {"value": i, "pad": "p" * 40} for i in range(2000)}
    session = _keyed_session(records)
    snapshot = json.loads(session.delta_json(full=True))["set"]
    assert snapshot["records"][0] == "j"
    assert json.loads(session.delta_json()) == {"set": {}, "del": []}  # unchanged: nothing sent

    records["r0001"]["value"] = -1  # in-place change of one record
    records["zz"] = {"value": None}
    del records["r0002"]
    records["r0003"] = {"value": True, "pad": ""}
    delta = json.loads(session.delta_json())
    kind, change = delta["set"]["records"]
    assert kind == "k" and change["v"] == 2
    assert sorted(change["ops"]) == sorted([["s", ["r0001", "value"], -1], ["d", ["r0002"]], ["s", ["zz"], {"value": None}],
                                            ["s", ["r0003", "value"], True], ["s", ["r0003", "pad"], ""]])
    merged = apply_keyed(snapshot["records"], change)
    assert merged == ["j", records] and list(merged[1]) == list(records)

    records["r0004"] = {"value": float("nan")}  # no longer JSON: the whole value is re-encoded
    kind, _, rendering = json.loads(session.delta_json())["set"]["records"]
    assert kind == "p" and rendering["r0004"] == {"value": {"$float": "nan"}}


@pytest.mark.parametrize("base, change", [
    (["p", "abc"], {"set": {}, "del": []}),
    (["j", [1, 2]], {"set": {}, "del": []}),
    (None, {"set": {}, "del": []}),
    (["j", {}], {"set": [], "del": []}),
    (["j", {}], {"set": {}, "del": [1]}),
    (["j", {}], "nope"),
])
def test_keyed_deltas_that_do_not_apply_are_refused(base, change) -> None:
    from sandpit.sandbox_images.runner.protocol import apply_keyed

    assert apply_keyed(base, change) is None


def _served(messages: list[dict[str, object]], become: child.Become, held: type | None = None) -> tuple[list[dict], int]:
    """What ``child.serve`` answers to ``messages`` (one frame each, then the end of the
    stream) in a session holding class ``held``, handed ``become``: the reply frames in
    order, and the bytes left after them that make no frame."""
    ours, theirs = socket.socketpair()
    session = child.Session(theirs.fileno(), {})
    session.cls = held
    ours.sendall(b"".join(protocol.encode(message) for message in messages))
    ours.shutdown(socket.SHUT_WR)
    child.serve(session, become)  # returns at the end of the stream
    theirs.close()
    received = b""
    while chunk := ours.recv(65536):
        received += chunk
    ours.close()
    frames = protocol.FrameBuffer()
    return frames.feed(received), frames.pending


def test_rehearse_is_handed_to_become_and_never_answered() -> None:
    handed: list[str] = []
    replies, pending = _served([{"op": "rehearse", "id": ""}, {"op": "hello", "id": "h1"}],
                               lambda msg, held: handed.append(msg["op"]))
    assert handed == ["rehearse"]
    assert replies == [{"id": "h1", "status": "ok"}] and pending == 0  # one reply: the hello's


def test_rehearse_to_a_session_holding_a_class_is_ignored() -> None:
    handed: list[str] = []
    replies, pending = _served([{"op": "rehearse", "id": ""}], lambda msg, held: handed.append(msg["op"]),
                               held=type("Held", (), {}))
    assert replies == [] and pending == 0 and handed == []
