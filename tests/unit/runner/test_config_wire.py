"""Configs sent by hash: the wire bytes and their hash keep every distinction that the
sandbox's parse keeps (key order, ``1``/``1.0``/``true``), configs orjson cannot write
exactly take the old path, PID 1's store checks bytes against their hash and stays within
its byte budget, raw members splice into valid frames, and the module fingerprint of
config templates sees what a constructor may change."""

from __future__ import annotations

import hashlib
import json
import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sandpit.executor.pool.configs import wire_config
from sandpit.sandbox_images.runner import child_template, protocol
from sandpit.sandbox_images.runner.pid1_configs import Configs

JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=20)


@given(st.dictionaries(st.text(min_size=1, max_size=4), JSON, min_size=1, max_size=5))
def test_wire_bytes_parse_back_to_the_exact_config(config: dict) -> None:
    wire = wire_config(config)
    assert wire is not None
    data, digest = wire
    assert hashlib.sha256(data).hexdigest() == digest
    back = json.loads(data)
    assert back == config and json.dumps(back) == json.dumps(config)  # types and key order


def test_key_order_and_number_types_give_different_hashes() -> None:
    configs = [{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 1.0, "b": 2}, {"a": True, "b": 2}, {"a": "1", "b": 2}]
    hashes = {wire_config(c)[1] for c in configs}  # type: ignore[index]
    assert len(hashes) == len(configs)


@pytest.mark.parametrize("config", [{}, {"x": float("nan")}, {"x": [float("inf")]}, {"x": 2**70},
                                    {"x": "\ud800"}, {1: "non-str key"}])
def test_configs_orjson_cannot_write_exactly_take_the_old_path(config: dict) -> None:
    assert wire_config(config) is None


def test_a_null_that_is_a_real_none_still_goes_by_hash() -> None:
    assert wire_config({"x": None}) is not None


def test_configs_store_checks_the_hash_and_its_budget() -> None:
    store = Configs(max_bytes=10)
    data = b'{"a":1}'
    assert not store.put(hashlib.sha256(b"other").hexdigest(), data)
    digest = hashlib.sha256(data).hexdigest()
    assert store.put(digest, data) and store.get(digest) == data
    more = b'{"b":22}'
    assert store.put(hashlib.sha256(more).hexdigest(), more)
    assert store.get(digest) is None and store.size <= 10  # least recently used out
    big = b"x" * 11
    assert store.put(hashlib.sha256(big).hexdigest(), big) and store.get(hashlib.sha256(big).hexdigest()) is None


@pytest.mark.parametrize("message,raw", [({"id": 1}, {"init_config": b'{"a":[1,2.0,true]}'}),
                                         ({}, {"x": b"1", "y": b'"s"'}),
                                         ({"op": "init", "s": "\u00e9"}, {"c": b"{}"})])
def test_raw_members_splice_into_valid_frames(message: dict, raw: dict) -> None:
    frame = protocol.encode_raw(message, raw)
    decoded = protocol.decode_payload(frame[4:])
    assert decoded == {**message, **{k: json.loads(v) for k, v in raw.items()}}
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4


def test_module_fingerprint_sees_globals_class_attributes_and_defaults() -> None:
    module = types.ModuleType("fingerprint_probe")
    source = ("COUNT = [0]\n"
              "def helper(x, seen=[]):\n    return x\n"
              "class Env:\n    instances = 0\n    def __init__(self, c):\n        self.c = c\n")
    exec(compile(source, "<probe>", "exec"), module.__dict__)  # noqa: S102 - our own test source
    sys.modules["fingerprint_probe"] = module
    try:
        cls = module.Env
        base = child_template.module_fingerprint(cls)
        assert base is not None and base == child_template.module_fingerprint(cls)
        for change in (lambda: module.COUNT.append(1), lambda: setattr(cls, "instances", 1),
                       lambda: module.helper.__defaults__[0].append(1), lambda: setattr(module, "NEW", 2)):
            change()
            after = child_template.module_fingerprint(cls)
            assert after != base
            base = after
    finally:
        del sys.modules["fingerprint_probe"]
