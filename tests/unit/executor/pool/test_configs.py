"""``configs.py``: the opened state of a session as the runner reported it (attributes, or
only a template fork's digest; the pool keeps no state), and the bounded cache of config
hashes a sandbox's runner was sent (on cachetools: least recently *used* out, concurrent
callers)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from sandpit.executor.errors import SessionError
from sandpit.executor.pool.configs import CONFIGS_SENT_MAX, SentConfigs, opened_state
from sandpit.executor.pool.placement import SessionSpec
from sandpit.executor.profiles import ResourceProfile
from sandpit.sandbox_images.runner.protocol import ProtocolViolation


def _spec(config_hash: str | None = "h" * 64) -> SessionSpec:
    return SessionSpec(session_id="s1", tenant="t", profile=ResourceProfile(), source="class A: pass",
                       class_name="A", init_config={"x": 1}, config_json=b'{"x":1}', config_hash=config_hash)


def test_a_template_forked_open_gives_only_its_digest() -> None:
    sandbox = SimpleNamespace(config_keys=set())
    opened, retyped = opened_state(_spec(), sandbox, {"status": "ok", "template": True,  # type: ignore[arg-type]
                                                       "snapshot_digest": "d" * 64}, restored=False)
    assert opened.attributes is None and opened.digest == "d" * 64 and retyped == []
    assert sandbox.config_keys  # the sandbox is known to hold the config's template now


def test_an_open_reply_gives_its_attributes_and_digest() -> None:
    reply = {"status": "ok", "snapshot": {"x": ["j", 1]}, "snapshot_digest": "e" * 64,
             "retyped": [{"key": "x", "constructed": "str", "config": "int"}]}
    opened, retyped = opened_state(_spec(None), SimpleNamespace(config_keys=set()), reply,  # type: ignore[arg-type]
                                   restored=False)
    assert opened.attributes == {"x": ["j", 1]} and opened.digest == "e" * 64
    assert retyped == [{"key": "x", "constructed": "str", "config": "int"}]


def test_a_restored_open_gives_no_state_and_no_digest() -> None:
    reply = {"status": "ok", "snapshot": {"x": ["j", 2]}, "snapshot_digest": "e" * 64}
    opened, _ = opened_state(_spec(), SimpleNamespace(config_keys=set()), reply, restored=True)  # type: ignore[arg-type]
    assert opened.attributes is None and opened.digest is None  # the caller gave the state


@pytest.mark.parametrize("reply", [
    {"status": "ok", "template": True},  # a template fork that names no state
    {"status": "ok", "template": True, "snapshot_digest": "short"},
])
def test_a_template_fork_without_a_digest_is_refused(reply: dict) -> None:
    with pytest.raises(SessionError, match="without naming its state"):
        opened_state(_spec(), SimpleNamespace(config_keys=set()), reply, restored=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("snapshot", [["j", 1], {"x": ["q", 1]}, {"x": "plain"}])
def test_a_malformed_opened_state_is_a_protocol_violation(snapshot: object) -> None:
    with pytest.raises(ProtocolViolation):
        opened_state(_spec(), SimpleNamespace(config_keys=set()),  # type: ignore[arg-type]
                     {"status": "ok", "snapshot": snapshot}, restored=False)


def test_sent_configs_are_bounded_and_forget_the_least_recently_used() -> None:
    sent = SentConfigs(max_entries=3)
    for config_hash in ("a", "b", "c"):
        sent.add(config_hash)
    sent.touch("a")
    sent.add("d")
    assert "b" not in sent and {"a", "c", "d"} == {h for h in "abcd" if h in sent} and len(sent) == 3
    sent.discard("a")
    sent.discard("never sent")
    sent.touch("never sent")  # a no-op, not an entry
    assert "a" not in sent and "never sent" not in sent and len(sent) == 2
    sent.clear()
    assert len(sent) == 0
    assert len(SentConfigs()._hashes.keys()) == 0 and SentConfigs()._hashes.maxsize == CONFIGS_SENT_MAX == 64


def test_sent_configs_take_concurrent_sessions() -> None:
    sent = SentConfigs(max_entries=64)

    def churn(offset: int) -> None:
        for i in range(2000):
            key = f"{offset}-{i % 100}"
            sent.add(key)
            sent.touch(key)
            if i % 7 == 0:
                sent.discard(key)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(sent) <= 64

@pytest.mark.parametrize(("construction", "expected"), [
    ({"path": "constructed", "reason": "nondeterministic", "detail": "unsuitable: two constructions differ"},
     {"path": "constructed", "reason": "nondeterministic", "detail": "unsuitable: two constructions differ"}),
    ({"path": "constructed", "reason": "first_open"}, {"path": "constructed", "reason": "first_open", "detail": None}),
    ({"path": "constructed", "reason": "<script>", "detail": "d" * 5000},  # hostile: unknown reason, long detail
     {"path": "constructed", "reason": "other", "detail": "d" * 200}),
    ({"path": "constructed", "reason": ["first_open"], "detail": 7}, {"path": "constructed", "reason": "other",
                                                                      "detail": None}),
    ({"path": "template"}, {"path": "constructed", "reason": "other", "detail": None}),  # but no digest-only state
    ({"path": "elsewhere"}, None),
    ("constructed", None),
    (None, None),
])
def test_an_open_reply_says_how_the_instance_was_made_within_the_bounded_set(construction: object,
                                                                              expected: dict | None) -> None:
    reply = {"status": "ok", "snapshot": {"x": ["j", 1]}, "snapshot_digest": "e" * 64, "construction": construction}
    opened, _ = opened_state(_spec(), SimpleNamespace(config_keys=set()), reply, restored=False)  # type: ignore[arg-type]
    assert (opened.construction.model_dump() if opened.construction else None) == expected


def test_a_state_named_by_digest_only_is_a_templates_whatever_the_reply_says() -> None:
    reply = {"status": "ok", "template": True, "snapshot_digest": "d" * 64,
             "construction": {"path": "constructed", "reason": "seeded"}}
    opened, _ = opened_state(_spec(), SimpleNamespace(config_keys=set()), reply, restored=False)  # type: ignore[arg-type]
    assert opened.construction is not None and opened.construction.model_dump() == {
        "path": "template", "reason": None, "detail": None}
