"""The rules both sides of the sandbox boundary apply (``wire``): encoded entries, JSON-native
values, tags, tool names, the nesting-depth scan, and the texts of errors and verdicts,
with hostile input for each."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sandpit.sandbox_images.runner import limits, wire


@pytest.mark.parametrize("entry", [["j", None], ["j", {"a": [1]}], ["u", {"$repr": {}}], ["p", "QUJD"],
                                   ["p", "QUJD", {"$set": []}]])
def test_encoded_entries(entry: object) -> None:
    assert wire.is_encoded_entry(entry)


@pytest.mark.parametrize("entry", [None, [], "j", ("j", 1), ["j"], ["j", 1, 2], ["u"], ["p"], ["p", 5],
                                   ["p", "x", {}, 4], ["q", 1], [["j"], 1], {"j": 1}])
def test_malformed_encoded_entries(entry: object) -> None:
    assert not wire.is_encoded_entry(entry)


def test_deltas_in_shape() -> None:
    assert wire.check_delta({}) == {"set": {}, "del": []}
    full = {"set": {"a": ["j", 1], "b": ["k", {"v": 2, "ops": []}]}, "del": ["c"]}
    assert wire.check_delta(full) == full
    assert wire.check_delta(full, keyed=False) is None  # a whole state holds no keyed change
    for bad in (None, [], "x", {"set": []}, {"set": None}, {"del": {}}, {"del": [1]}, {"set": {"a": 1}},
                {"set": {"a": ["k"]}}, {"set": {"a": ["k", 1, 2]}}, {"set": {"a": ["q", 1]}}):
        assert wire.check_delta(bad) is None, bad


@pytest.mark.parametrize("value", [None, True, 0, -5, 2**70, 1.5, "", "ü", [], {}, {"a": [1, {"b": None}]}])
def test_json_native_values(value: object) -> None:
    assert wire.json_native(value)


class Tag(str):
    pass


@pytest.mark.parametrize("value", [
    (1, 2), {1: "int key"}, {"a": (1,)}, [float("nan")], {"x": float("inf")}, {1, 2}, b"bytes",
    [object()], {"nested": [{"deep": frozenset()}]}, Tag("x"), {"k": [Tag("x")]},
])
def test_non_json_native_values(value: object) -> None:
    assert not wire.json_native(value)


def test_json_native_walk_is_iterative_and_bounded() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert not wire.json_native(deep)  # no RecursionError; too deep for a frame: pickled
    shallow: list[Any] = []
    for _ in range(limits.JSON_NATIVE_MAX_DEPTH - 1):
        shallow = [shallow]
    assert wire.json_native(shallow)
    assert not wire.json_native(shallow, depth=1)  # counted from where the value sits
    cycle: list[Any] = []
    cycle.append(cycle)
    assert not wire.json_native(cycle)


def test_a_dict_that_reads_like_a_tag_is_not_json_native_and_is_a_tag() -> None:
    assert not wire.json_native({"$set": [1]})
    assert not wire.json_native({"outer": {"$date": "2024-01-01"}})
    assert wire.json_native({"$set": [1], "other": 2})  # two keys: not a tag
    assert wire.is_tag({"$set": [1]}) and wire.is_tag({"$": None})
    for value in ({"set": [1]}, {"$set": [1], "other": 2}, {}, ["$set"], "$set", {1: "$"}, None):
        assert not wire.is_tag(value), value


@pytest.mark.parametrize(("name", "valid"), [
    ("book", True), ("Book_2", True), ("a" * limits.MAX_NAME_CHARS, True), ("a" * (limits.MAX_NAME_CHARS + 1), False),
    ("", False), ("_private", False), ("2fa", False), ("has-dash", False), ("dot.ted", False), ("ünï", False),
    ("book\n", False), (" book", False), (None, False), (5, False), (b"book", False),
])
def test_tool_names(name: object, valid: bool) -> None:
    assert wire.is_tool_name(name) is valid


def test_json_types_are_json_schemas_types() -> None:
    assert set(wire.JSON_TYPES) == {"string", "integer", "number", "boolean", "null", "array", "object"}


def test_depth_of_deep_nesting_is_found_without_recursing() -> None:
    depth = 100_000  # would blow the json module's stack if it got that far
    assert wire.depth_exceeds(b'{"a":' + b"[" * depth + b"]" * depth + b"}", limits.MAX_FRAME_DEPTH)
    assert wire.depth_exceeds(b"[" * depth, 10)  # unbalanced: the exact scan decides
    assert not wire.depth_exceeds(b"]" * depth + b"[" * 5, 10)


def test_depth_boundary_and_strings() -> None:
    def nested(levels: int) -> bytes:
        return b"[" * levels + b"]" * levels

    assert not wire.depth_exceeds(nested(5), 5) and wire.depth_exceeds(nested(6), 5)
    inside = b'["' + b"[{" * 50 + b'"]'  # brackets inside a string do not count
    assert not wire.depth_exceeds(inside, 2)
    escaped = b'["\\"' + b"[" * 50 + b'"]'  # an escaped quote does not end the string
    assert not wire.depth_exceeds(escaped, 2)
    unterminated = b'[["' + b"[" * 50  # a string that never ends: not deeper, the parser refuses it
    assert not wire.depth_exceeds(unterminated, 2)


def test_depth_scan_of_an_unterminated_string_takes_one_pass() -> None:
    # brackets to pass the count, a backslash to take the regular expression, then a
    # string that never ends: a pattern with nested repetition backtracks exponentially
    for payload in (b"[" * 50 + b'\\"' + b"a" * 100_000, b'\\' + b'"' + b"[" * 100_000,
                    b"[" * 50 + b'"\\' + b"a" * 50_000 + b'"' + b"b" * 50_000):
        started = time.perf_counter()
        wire.depth_exceeds(payload, 10)
        assert time.perf_counter() - started < 1.0


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=80).map(lambda b: bytes(b"[]{}\"\\ a,:"[x % 10] for x in b)), st.integers(1, 6))
@example(b'"\\"" [[[[]]]] "', 2)  # cut at every quote, the escaped one would hide the brackets
def test_fast_depth_check_agrees_with_the_exact_scan(payload: bytes, limit: int) -> None:
    """The bytes-operation depth check decides exactly what the byte-by-byte scan decides."""
    assert wire.depth_exceeds(payload, limit) == wire._scan_exceeds(payload, limit)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=80).map(lambda b: bytes(b"[]{}\"\\ a,:"[x % 10] for x in b).replace(b'\\"', b"\\a")),
       st.integers(1, 6))
@example(b'"\\\\[[[" [[', 1)  # an escaped backslash inside a string, then brackets
@example(b'\\[[["\\n]]"', 2)  # a backslash outside any string, one inside
def test_depth_check_without_escaped_quotes_agrees_with_the_exact_scan(payload: bytes, limit: int) -> None:
    """Backslashes that no quote follows take the split at quotes, and decide as the scan does."""
    assert b'\\"' not in payload
    assert wire.depth_exceeds(payload, limit) == wire._scan_exceeds(payload, limit)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError


def test_error_observations() -> None:
    assert wire.error_observation(KeyError("x")) == "Error: KeyError: 'x'"
    assert wire.error_observation(KeyError()) == "Error: KeyError"
    assert wire.error_observation(Unprintable()) == "Error: Unprintable: <unprintable exception>"
    assert len(wire.error_observation(ValueError("v" * 10000), limits.ERROR_CHARS)) == limits.ERROR_CHARS
    assert len(wire.error_observation(ValueError("v" * 10000))) == 10000 + len("Error: ValueError: ")


def test_cap_truncates_with_marker() -> None:
    assert wire.cap_observation("abc", 3) == ("abc", False)
    assert wire.cap_observation("abcdef", 4) == ("abcd\n...[truncated 2 characters]", True)


def test_call_failure_observations() -> None:
    assert wire.call_failure_observation("timeout", 2.0) == "Error: tool call exceeded the 2 s time limit"
    assert wire.call_failure_observation("timeout", 0.25) == "Error: tool call exceeded the 0.25 s time limit"
    assert wire.call_failure_observation("oom", 2.0, "ignored") == "Error: session ran out of memory"
    assert wire.call_failure_observation("crashed", 2.0) == "Error: session process died"
    assert wire.call_failure_observation("crashed", 2.0, "closed its control channel") == \
        "Error: session process died (closed its control channel)"


class BoolSub(int):
    pass


class Hostile:
    def __repr__(self) -> str:
        raise RuntimeError("no")


class Huge:
    def __repr__(self) -> str:
        return "h" * 5000


class SneakyText(str):
    def __len__(self) -> int:
        return 0


class SneakyRepr:
    def __repr__(self) -> str:
        return SneakyText("s" * 5000)


@pytest.mark.parametrize(("value", "expected"), [
    (True, ("ok", True, None)),
    (False, ("ok", False, None)),
    (None, ("error", False, "returned None, not a bool")),
    (1, ("error", False, "returned int 1, not a bool")),
    (0, ("error", False, "returned int 0, not a bool")),
    ("yes", ("error", False, "returned str 'yes', not a bool")),
    ([True], ("error", False, "returned list [True], not a bool")),
    (1.0, ("error", False, "returned float 1.0, not a bool")),
    (BoolSub(1), ("error", False, "returned BoolSub 1, not a bool")),
])
def test_only_true_passes(value: object, expected: tuple[str, bool, str | None]) -> None:
    assert wire.classify(value) == expected


def test_bounded_repr() -> None:
    assert wire.bounded_repr("x") == "'x'"
    assert wire.bounded_repr(Hostile()) == "<unrepresentable Hostile: RuntimeError>"
    text = wire.bounded_repr(Huge())
    assert len(text) == limits.RESULT_REPR_CHARS + 3 and text.endswith("...")
    sneaky = wire.bounded_repr(SneakyRepr())  # a str subclass lying about its length
    assert type(sneaky) is str and len(sneaky) == limits.RESULT_REPR_CHARS + 3
    error = wire.classify(Huge())[2]
    assert error is not None and error.endswith(", not a bool") and len(error) < 300


def result(**changes: object) -> dict[str, object]:
    return {"status": "ok", "passed": True, "result": "True", "error": None, "traceback": None,
            "duration_ms": 0.5, **changes}


def test_check_results_are_rebuilt_with_exact_types_and_caps() -> None:
    assert wire.check_result(result()) == {"status": "ok", "passed": True, "result": "True", "error": None,
                                           "traceback": None, "duration_ms": 0.5}
    assert wire.check_result(result(status="error"))["passed"] is False  # type: ignore[index]  # only ok passes
    assert wire.check_result(result(status="crashed")) is not None
    assert wire.check_result(result(status="crashed"), ("ok", "error", "rejected", "oom")) is None
    long = wire.check_result(result(error="e" * 100_000, traceback="t" * 100_000, result=Tag("r" * 100_000)))
    assert long is None  # a str subclass is not text
    long = wire.check_result(result(error="e" * 100_000, traceback="t" * 100_000))
    assert long is not None and len(long["error"]) == limits.ERROR_CHARS
    assert len(long["traceback"]) == limits.CHECK_RESULT_TEXT_CAPS["traceback"]
    for bad in ([], None, "ok", result(status="fault"), result(status="timeout"), result(passed=1),
                result(duration_ms=-1), result(duration_ms=float("inf")), result(duration_ms=float("nan")),
                result(duration_ms="1"), result(duration_ms=True), result(result=5), result(error=["x"]),
                result(traceback={})):
        assert wire.check_result(bad) is None, bad
