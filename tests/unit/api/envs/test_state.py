"""The one JSON view of a stored state and its rendering cache
(:class:`~sandpit.api.envs.state.RenderedStates`): a root is rendered once, the cache
is bounded by JSON bytes (least recently used out first), a view larger than the whole
budget is rendered but never kept, and a state without a root is never cached."""

from __future__ import annotations

import json

from sandpit.api.db.store import PendingBlobs, StateCache, encode_state
from sandpit.api.envs.state import RenderedStates, state_view


def state(**attributes: object) -> StateCache:
    return encode_state({name: ["j", value] for name, value in attributes.items()}, PendingBlobs())


def test_a_root_is_rendered_once_and_gives_the_states_view() -> None:
    rendered = RenderedStates()
    cache = state(count=1, records={"a": [1, 2.5, None]})
    data, truncated = rendered.render(cache)
    assert json.loads(data) == state_view(cache) == {"count": 1, "records": {"a": [1, 2.5, None]}}
    assert not truncated
    assert rendered.get(cache.root) == (data, False)
    assert rendered.render(cache)[0] is data  # from the cache, not rendered again


def test_the_cache_is_bounded_by_json_bytes_least_recently_used_first() -> None:
    states = [state(pad="x" * 80, n=n) for n in range(4)]
    size = len(RenderedStates().render(states[0])[0])
    rendered = RenderedStates(max_bytes=3 * size)
    for cache in states[:3]:
        rendered.render(cache)
    assert rendered.get(states[0].root) is not None  # now the most recently used
    rendered.render(states[3])  # over the budget: the least recently used (states[1]) goes
    assert [rendered.get(c.root) is not None for c in states] == [True, False, True, True]
    assert len(rendered) == 3


def test_a_view_over_the_whole_budget_is_rendered_but_not_kept() -> None:
    rendered = RenderedStates(max_bytes=64)
    small = state(n=1)
    rendered.render(small)
    big = state(pad="y" * 500)
    data, _ = rendered.render(big)
    assert json.loads(data) == {"pad": "y" * 500}
    assert rendered.get(big.root) is None and rendered.get(small.root) is not None  # nothing evicted for it


def test_a_state_without_a_root_is_rendered_each_time() -> None:
    rendered = RenderedStates()
    rootless = StateCache(state(n=2).attrs)
    assert json.loads(rendered.render(rootless)[0]) == {"n": 2}
    assert len(rendered) == 0
