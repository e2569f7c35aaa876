"""What PID 1's sessions accept from the host (``pid1_session_requests``): ``open``'s
spec and snapshot text, ``restore``'s snapshot text; anything else a ValueError that
names the field (the runner answers ``fault`` with it)."""

from __future__ import annotations

import base64

import pytest
from sandpit.sandbox_images.runner import pid1_session_requests as requests

OPEN = {"session": "s1", "source": "class Box: pass", "class_name": "Box"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_an_open_without_a_snapshot() -> None:
    assert requests.open_request({**OPEN, "init_config": {"a": 1}, "seed": 2**64 - 1}) == (
        {"source": OPEN["source"], "class_name": "Box", "init_config": {"a": 1}, "describe_only": False,
         "seed": 2**64 - 1}, None)
    assert requests.open_request({**OPEN, "describe_only": True})[0]["describe_only"] is True
    assert requests.open_request({**OPEN, "describe_only": "yes"})[0]["describe_only"] is False


def test_an_opens_snapshot_is_its_text() -> None:
    text = b'{"count":["j",7],"quote":["j","\\"}"]}'
    assert requests.open_request({**OPEN, "snapshot_b64": b64(text)})[1] == text
    assert requests.snapshot_text({"snapshot_b64": b64(text)}) == text


@pytest.mark.parametrize(("fields", "field"), [
    ({"seed": -1}, "'seed'"), ({"seed": 2**64}, "'seed'"), ({"seed": True}, "'seed'"), ({"seed": 1.0}, "'seed'"),
    ({"source": None}, "'source'"), ({"class_name": 5}, "'class_name'"), ({"init_config": [1]}, "'init_config'"),
    ({"snapshot": {"count": ["j", 1]}}, "'snapshot_b64'"), ({"snapshot": None}, "'snapshot_b64'"),
    ({"snapshot": None, "snapshot_b64": b64(b"{}")}, "'snapshot_b64'"),
    ({"snapshot_b64": None}, "'snapshot_b64'"), ({"snapshot_b64": 5}, "'snapshot_b64'"),
    ({"snapshot_b64": "e30"}, "'snapshot_b64'"), ({"snapshot_b64": " e30="}, "'snapshot_b64'"),
    ({"snapshot_b64": "e30=="}, "'snapshot_b64'"), ({"snapshot_b64": "ZQ*="}, "'snapshot_b64'"),
    ({"snapshot_b64": "e30\u00e9"}, "'snapshot_b64'"), ({"snapshot_b64": b64(b"[1]")}, "'snapshot_b64'"),
    ({"snapshot_b64": b64(b"")}, "'snapshot_b64'"), ({"snapshot_b64": b64(b'"{}"')}, "'snapshot_b64'"),
])
def test_malformed_opens_name_their_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        requests.open_request({**OPEN, **fields})  # type: ignore[typeddict-item]


def test_a_restore_needs_its_snapshot_text() -> None:
    for msg in ({}, {"snapshot": {"count": ["j", 1]}}, {"snapshot_b64": b64(b"[]")}):
        with pytest.raises(ValueError, match="'snapshot_b64'"):
            requests.snapshot_text(msg)  # type: ignore[arg-type]
