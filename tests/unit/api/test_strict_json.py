"""Lone UTF-16 surrogates in request JSON are found (and paired ones are not)."""

from __future__ import annotations

import pytest
from sandpit.api.errors import error_body
from sandpit.api.strict_json import lone_surrogate_at, strict_loads


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


def test_error_bodies_are_always_encodable() -> None:
    body = error_body("invalid_request", "bad \ud800 value", "init_config.\udc00")
    assert body["error"]["message"].encode("utf-8") and body["error"]["field"].encode("utf-8")
