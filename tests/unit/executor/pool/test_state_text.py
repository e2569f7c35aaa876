"""The text of a state the host sends into a sandbox (``executor/pool/state_text.py``):
orjson's where it writes the values exactly, else the standard library's; either way a
text that parses to exactly the state's values, and the standard library's errors for
values JSON cannot carry."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sandpit.executor.pool.state_text import JsonText, b64_member, state_b64, state_text
from sandpit.sandbox_images.runner import protocol

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text())
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)


def same_values(text: bytes, state: dict[str, Any]) -> bool:
    """``text`` parses to ``state``'s values, types included (1, 1.0 and True apart)."""
    return protocol.snapshot_text(json.loads(text), errors="strict") == protocol.snapshot_text(state, errors="strict")


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(st.text(max_size=8), VALUES, max_size=6))
@example({"a": ["j", {"quote": 'he "said"', "ctl": "\x00\x1f\x7f\u2028", "emoji": "\U0001f600"}]})
@example({"big": 2**64 - 1, "bigger": 2**64, "neg": -(2**63) - 1, "tiny": 5e-324, "e": 1e16, "f": 3.0})
@example({"word": "nullable", "none": None})
def test_a_state_parses_back_to_its_values(state: dict[str, Any]) -> None:
    assert same_values(state_text(state), state)


def test_what_orjson_refuses_goes_the_standard_way() -> None:
    assert state_text({"k": {1: 2, None: 3}}) == b'{"k":{"1":2,"null":3}}'  # keys as the standard library writes them
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    assert same_values(state_text({"deep": deep}), {"deep": deep})
    assert state_text({"big": 2**100}) == b'{"big":1267650600228229401496703205376}'


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [None, math.nan], {"x": None, "y": -math.inf}])
def test_values_json_has_no_form_for_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        state_text({"value": value})


@pytest.mark.parametrize(("value", "error"), [("\ud800", UnicodeEncodeError), ({1, 2}, TypeError),
                                              (object(), TypeError), (b"bytes", TypeError)])
def test_values_that_are_not_json_text_are_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        state_text({"value": value})


@pytest.mark.parametrize("data", [b"", b"{}", b"\x00\xff" * 1000, "é{\"a\":1}".encode()])
def test_a_base64_member_is_what_json_writes_for_the_base64_text(data: bytes) -> None:
    member = b64_member(data)
    assert type(member) is JsonText
    assert member == json.dumps(base64.b64encode(data).decode("ascii")).encode("ascii")


def test_a_frame_with_spliced_members_parses_to_the_same_message() -> None:
    state = state_text({"a": ["j", {"k": [1, "x\"y", None]}]})
    plain = {"id": 7, "op": "restore", "session": "s", "snapshot_b64": base64.b64encode(state).decode("ascii")}
    spliced = protocol.encode_raw({k: v for k, v in plain.items() if k != "snapshot_b64"},
                                  {"snapshot_b64": state_b64({"a": ["j", {"k": [1, "x\"y", None]}]})})
    assert protocol.FrameBuffer(1 << 20).feed(spliced) == [plain]
    assert len(spliced) == len(protocol.encode(plain))
