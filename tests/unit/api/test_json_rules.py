"""The fast paths of :mod:`sandpit.api.json_rules` give exactly what the slow ones gave:
the depth check agrees with the byte-by-byte scan on any bytes, and parsing with orjson
gives the same value as Python's ``json`` (or defers to it: huge integers, lone
surrogates, NaN, ``1e400``)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sandpit.api.db.state_blobs import dumps
from sandpit.api.errors import InvalidRequest
from sandpit.api.json_rules import lone_surrogate_at, stored_loads, strict_loads
from sandpit.sandbox_images.runner.wire import _scan_exceeds, depth_exceeds

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=80).map(lambda b: bytes(b"[]{}\"\\ a,:"[x % 10] for x in b)), st.integers(1, 6))
@example(b'\\""[[', 1)  # a backslash outside any string escapes nothing (the scan's rule)
@example(b'"abc[[[', 1)  # a string that never ends hides its brackets
@example(b'"a\\"[[" [[', 1)
def test_depth_check_agrees_with_the_scan_on_any_bytes(body: bytes, limit: int) -> None:
    assert depth_exceeds(body, limit) == _scan_exceeds(body, limit)


@settings(max_examples=300, deadline=None)
@given(JSON, st.integers(1, 12))
def test_depth_check_agrees_with_the_scan_on_json(value: Any, limit: int) -> None:
    body = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert depth_exceeds(body, limit) == _scan_exceeds(body, limit)


def test_depth_of_large_bodies() -> None:
    wide = json.dumps({"rows": [{"k": [i, {"s": "[[[[{{{{\\\"" * 3}]} for i in range(20000)]}).encode()
    assert len(wide) > 1_000_000
    assert not depth_exceeds(wide, 5) and depth_exceeds(wide, 4)
    deep = b'{"a":' + b"[" * 65 + b"]" * 65 + b"}"
    assert depth_exceeds(deep, 64) and not depth_exceeds(deep, 66)


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_parsed_value_is_pythons(value: Any) -> None:
    body = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if "\\ud" in body.decode("utf-8", "surrogatepass").lower():
        return
    try:
        expected = json.loads(body)
    except ValueError:  # text with a lone surrogate is not UTF-8: refused below as it was
        with pytest.raises(InvalidRequest):
            strict_loads(body, 64)
        return
    got = strict_loads(body, 64)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert type(got) is type(expected)


def test_values_orjson_would_read_otherwise_take_pythons_parser() -> None:
    assert strict_loads(b'{"n": 123456789012345678901234567890}', 64) == {"n": 123456789012345678901234567890}
    assert math.isinf(strict_loads(b'{"n": 1e400}', 64)["n"])  # as before: json reads it as inf
    assert strict_loads(b'{"s": "\\ud800"}', 64) == {"s": "\ud800"}  # the route refuses it (lone_surrogate_at)
    assert strict_loads(b"\xef\xbb\xbf{}", 64) == {}  # a UTF-8 BOM: accepted, as json.loads(bytes) does
    for bad in (b'{"n": NaN}', b'{"n": Infinity}', b"{", b'{"a": 1,}'):
        with pytest.raises(InvalidRequest):
            strict_loads(bad, 64)


@pytest.mark.parametrize("body, where", [
    (rb'{"a": "\ud800"}', "a"),
    (rb'{"a": "\uDC00x"}', "a"),
    (rb'{"a": [1, {"b": "x\udfff"}]}', "a.1.b"),
    (rb'{"a": {"\ud800": 1}}', "a"),
    (rb'"\ud800"', ""),
    (rb'{"a": "\ud83d\ude00"}', None),  # a pair: one astral character
    (rb'{"a": "\\ud800"}', None),  # an escaped backslash: six ASCII characters
    (rb'{"a": "\u00e9"}', None),
])
def test_lone_surrogate_at(body: bytes, where: str | None) -> None:
    assert lone_surrogate_at(body, strict_loads(body, 64)) == where


@pytest.mark.parametrize("body", [b'{"a": NaN}', b"[Infinity]", b'{"a": -Infinity}', b'{"a": 1', b"{'a': 1}", b""])
def test_non_json_numbers_and_malformed_json_are_invalid(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        strict_loads(body, 64)


def test_depth_is_counted_outside_strings_only() -> None:
    assert not depth_exceeds(b'{"a": "[[[[[[[[[[{{{{{{"}', 2)
    assert not depth_exceeds(b'{"a": "\\"[[[["}', 2)  # an escaped quote does not end the string
    assert depth_exceeds(b"[[[1]]]", 2) and not depth_exceeds(b"[[1]]", 2)
    with pytest.raises(InvalidRequest, match="nested deeper than 4"):
        strict_loads(b"[" * 5 + b"]" * 5, 4)
    assert strict_loads(b"[" * 4 + b"]" * 4, 4) == [[[[]]]]


STORED = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(alphabet=st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30)
"""What the store writes: any JSON value, lone surrogates and integers beyond 64 bits included."""


def typed(value: Any) -> Any:
    """``value`` with every scalar's type beside its ``repr`` and dicts as item lists
    (1, 1.0, True, 0.0 and -0.0 apart; key order kept)."""
    if isinstance(value, dict):
        return ["dict", [(typed(k), typed(v)) for k, v in value.items()]]
    if isinstance(value, list):
        return ["list", [typed(v) for v in value]]
    return [type(value).__name__, repr(value)]


@settings(max_examples=600, deadline=None)
@given(STORED)
@example({"big": 2**64, "i64": -(2**63) - 1, "u64": 2**64 - 1, "id": "1234567890123456789", "neg0": -0.0})
@example({"lone": "\ud800", "pair": "\U0001f600", "\udc00key": [1.5e-300, 1e308]})
def test_stored_bytes_read_back_as_pythons(value: Any) -> None:
    data = dumps(value)  # the store's writer: orjson, or json with surrogatepass
    expected = json.loads(data)
    got = stored_loads(data)
    assert typed(got) == typed(expected)  # types, key order, -0.0 and every digit alike


def test_stored_bytes_orjson_would_misread_take_pythons_parser() -> None:
    assert stored_loads(b'{"n":18446744073709551616}') == {"n": 2**64}  # orjson: a float
    assert type(stored_loads(b"[123456789012345678901234567890]")[0]) is int
    assert math.isinf(stored_loads(b"[1e400]")[0])
    assert stored_loads('["\ud800"]'.encode("utf-8", "surrogatepass")) == ["\ud800"]
    for bad in (b"{", b"", b"\xff", b'{"a":1,}'):
        with pytest.raises(ValueError):
            stored_loads(bad)
