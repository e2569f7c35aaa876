"""The parse cache of large request bodies (:class:`~sandpit.api.http.strict_json.ParsedBodies`):
bounded by entries and by bytes, least recently used out first, and a body bigger than the
whole budget is never kept."""

from __future__ import annotations

from sandpit.api.http.strict_json import ParsedBodies


def test_hits_return_the_value_parsed_from_those_bytes() -> None:
    bodies = ParsedBodies(max_entries=4, max_bytes=1000)
    assert bodies.get(b"a") == (False, None)
    value = {"k": [1, 2]}
    bodies.add(b"a", value, 10)
    known, got = bodies.get(b"a")
    assert known and got is value
    bodies.add(b"n", None, 10)  # a body whose JSON is null is still a hit
    assert bodies.get(b"n") == (True, None)


def test_entries_and_bytes_are_bounded_least_recently_used_first() -> None:
    bodies = ParsedBodies(max_entries=3, max_bytes=100)
    for name in (b"a", b"b", b"c"):
        bodies.add(name, name.decode(), 30)
    bodies.get(b"a")  # a is now the most recently used
    bodies.add(b"d", "d", 30)  # four entries: b (least recent) goes
    assert [bodies.get(n)[0] for n in (b"a", b"b", b"c", b"d")] == [True, False, True, True]
    bodies.add(b"e", "e", 60)  # 30 + 30 + 30 + 60 > 100 bytes: the oldest go until it fits
    assert bodies.get(b"e") == (True, "e")
    assert sum(bodies.get(n)[0] for n in (b"a", b"c", b"d")) == 1
    bodies.add(b"huge", "x", 101)  # over the whole budget: not kept, nothing evicted for it
    assert bodies.get(b"huge") == (False, None) and bodies.get(b"e") == (True, "e")


def test_adding_the_same_digest_again_counts_its_bytes_once() -> None:
    bodies = ParsedBodies(max_entries=10, max_bytes=100)
    for _ in range(5):
        bodies.add(b"a", "a", 60)
    bodies.add(b"b", "b", 40)
    assert bodies.get(b"a") == (True, "a") and bodies.get(b"b") == (True, "b")
