"""The pool's two bounded caches of ``configs.py`` (on cachetools): the initial states by
tenant and digest, and the config hashes a sandbox's runner was sent. Both keep the same
bounds as before, evict the least recently *used* entry, and take concurrent callers."""

from __future__ import annotations

import threading

from sandpit.executor.pool.configs import (
    CONFIGS_SENT_MAX,
    INITIAL_SNAPSHOTS_MAX,
    InitialSnapshots,
    SentConfigs,
)


def test_initial_states_keep_the_recently_used_and_count_hits() -> None:
    cache = InitialSnapshots(max_entries=2)
    assert cache.max_entries == 2 and InitialSnapshots().max_entries == INITIAL_SNAPSHOTS_MAX == 8
    cache.put("t", "d1", {"x": ["j", 1]})
    cache.put("t", "d2", {})
    assert cache.get("t", "d1") == {"x": ["j", 1]}  # d1 is the most recently used now
    cache.put("t", "d3", {})
    assert cache.get("t", "d2") is None and cache.get("t", "d1") is not None
    assert cache.get("other", "d1") is None  # per tenant
    assert (cache.hits, cache.misses) == (2, 2)
    empty = cache.get("t", "d3")
    assert empty == {} and cache.hits == 3  # an empty state is a hit, not a miss


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
