"""Large JSON values of a state stored as trees of nodes, so a step that changes one
record writes the nodes on its path and the one bucket holding it, not the value.

A dict node is ``{"t": "d", "b": [bucket hashes], "r": [node hashes of its children that
are nodes]}``; a key's bucket is the CRC-32 of the key modulo the bucket count, and a
bucket blob lists ``[key, ordinal, value]`` (inline child) or ``[key, ordinal, null, node
hash]`` (a child of at least :data:`NODE_MIN_BYTES`, itself a node). Ordinals are the
keys' ranks in insertion order (a new key gets the next one, a deleted one leaves a
gap), so key order is restored exactly without storing the key list. A list node is
``{"t": "l", "n": length, "s": span, "b": [chunk hashes], "r": [...]}``, chunk ``i``
holding items ``i*span`` to ``(i+1)*span - 1`` as cells ``[value]`` or ``[null, node
hash]``. Values are JSON, so types come back exact (``1``, ``1.0``, ``true``).

:class:`Node` is the decoded side of a stored node. Values held by a state are never
changed in place (the executor applies path deltas copy-on-write), so an untouched
subtree is the *same object* as before and :func:`encode_node` skips it by an identity
test; other children are compared exactly (equal ``marshal`` bytes: types and key order
count), never with ``==`` (``1 == 1.0 == True``). Nothing here executes or unpickles
anything. The manifest that points at trees (``["jt", hash]``) is :mod:`.store`'s.
"""

from __future__ import annotations

import marshal
import math
import zlib
from dataclasses import dataclass
from typing import Any

from ..json_rules import stored_loads
from .state_blobs import HASH_HEX, BlobReader, CorruptState, PendingBlobs, dumps

NODE_MIN_BYTES = 16 * 1024
"""Inside a tree, a dict or list child of at least this size (estimated, :func:`msize`)
is a node of its own."""


NODE_MAX_DEPTH = 32
"""Deepest level at which a child gets a node of its own (deeper ones stay inline)."""


MISSING = object()


def bucket_count(size: int, least: int = 16) -> int:
    """Buckets for an object of ``size`` encoded bytes: the power of two nearest
    ``sqrt(size / 34)`` (balances the bucket list against one bucket), ``least``..4096."""
    ideal = math.sqrt(max(size, 1) / (HASH_HEX + 2))
    exponent: int = round(math.log2(max(ideal, 1)))
    return max(least, min(4096, 1 << exponent))


def bucket_of(key: str, buckets: int) -> int:
    """Stable bucket of a key (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % buckets


@dataclass(eq=False)
class Node:
    """Decoded-side bookkeeping of one stored tree node (a large dict or list, see the
    module docstring). ``value`` is the exact object the node encodes: values held by a
    :class:`StateCache` are never changed in place, so ``value is node.value`` proves a
    subtree unchanged (the executor applies path deltas copy-on-write)."""

    value: Any
    hash: str
    buckets: list[str]
    """Bucket (dict) or chunk (list) blob hashes, in order."""
    members: list[list[Any]]
    """Dict: the keys of each bucket in ordinal order. List: unused."""
    span: int
    """List: items per chunk."""
    ords: dict[str, int]
    """Dict: key -> ordinal (its rank in insertion order; gaps allowed)."""
    next_ord: int
    subs: dict[Any, Node]
    """Children (dict keys or list indexes) stored as nodes of their own."""
    built: int
    """Children when the layout was chosen (it is chosen anew past 4x growth or shrinkage)."""


def msize(value: Any) -> int:
    """Size estimate of a JSON value in bytes: its ``marshal`` length (C speed; within
    ~20% of the JSON text for records, smaller when strings are shared). Too deep to
    marshal counts as large."""
    try:
        return len(marshal.dumps(value))
    except ValueError:
        return NODE_MIN_BYTES


def _large(value: Any, depth: int) -> int:
    """``value``'s size estimate when it gets a node of its own (a dict or list of at
    least NODE_MIN_BYTES above NODE_MAX_DEPTH), else 0."""
    if type(value) is not dict and type(value) is not list or depth + 1 >= NODE_MAX_DEPTH:
        return 0
    size = msize(value)
    return size if size >= NODE_MIN_BYTES else 0


def _same(a: Any, b: Any) -> bool:
    """True only when ``a`` and ``b`` are exactly equal (types, key order: equal marshal
    bytes); False may also mean "equal": the caller then rewrites a bucket whose content
    hash comes out the same."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return marshal.dumps(a) == marshal.dumps(b)
    except ValueError:
        return False


def _layout(inline_bytes: int, subs: int) -> int:
    """Buckets of a node: the power of two nearest ``sqrt(size / 34)`` of its inline
    content (balances the bucket list against one bucket), 1..4096."""
    return bucket_count(inline_bytes + (HASH_HEX + 2) * subs, 1)


def build_node(value: Any, depth: int, pending: PendingBlobs) -> Node:
    """A node for ``value`` (dict or list) and every large child, all blobs new."""
    subs: dict[Any, Node] = {}
    inline = 0
    items = value.items() if type(value) is dict else enumerate(value)
    for key, child in items:
        if type(key) is not str and type(value) is dict:
            raise ValueError("a JSON object key is not a string")
        kind = type(child)
        if kind is dict or kind is list:
            size = msize(child)
            if size >= NODE_MIN_BYTES and depth + 1 < NODE_MAX_DEPTH:
                subs[key] = build_node(child, depth + 1, pending)
                continue
        else:
            size = len(child) if kind is str else 8
        inline += size + 8
    count = _layout(inline, len(subs))
    if type(value) is dict:
        members: list[list[Any]] = [[] for _ in range(count)]
        for key in value:
            members[bucket_of(key, count)].append(key)
        ords = {key: index for index, key in enumerate(value)}
        node = Node(value, "", [""] * count, members, 0, ords, len(ords), subs, len(value))
        for index in range(count):
            _write_bucket(node, index, pending)
    else:
        span = max(1, -(-len(value) // count))
        node = Node(value, "", [], [], span, {}, 0, subs, len(value))
        node.buckets = [_chunk(node, start, pending) for start in range(0, len(value), span)]
    return _finish_node(node, pending)


def _write_bucket(node: Node, index: int, pending: PendingBlobs) -> None:
    value, subs, ords = node.value, node.subs, node.ords
    entries = [[key, ords[key], None, subs[key].hash] if key in subs else [key, ords[key], value[key]]
               for key in node.members[index]]
    node.buckets[index] = pending.add(dumps(entries))


def _chunk(node: Node, start: int, pending: PendingBlobs) -> str:
    value, subs = node.value, node.subs
    cells = [[None, subs[i].hash] if i in subs else [value[i]] for i in range(start, min(start + node.span, len(value)))]
    return pending.add(dumps(cells))


def _finish_node(node: Node, pending: PendingBlobs) -> Node:
    refs = [sub.hash for sub in node.subs.values()]
    if type(node.value) is dict:
        blob: dict[str, Any] = {"t": "d", "b": node.buckets, "r": refs}
    else:
        blob = {"t": "l", "n": len(node.value), "s": node.span, "b": node.buckets, "r": refs}
    node.hash = pending.add(dumps(blob))
    return node


def _child(old: Any, new: Any, sub: Node | None, depth: int, pending: PendingBlobs) -> tuple[bool, Node | None]:
    """A changed child slot: ``(dirty, its node or None)``. ``old`` is MISSING for a new one."""
    if sub is not None and type(new) is type(sub.value):
        node = encode_node(new, sub, depth + 1, pending)
        return node.hash != sub.hash, node
    if _large(new, depth):
        return True, build_node(new, depth + 1, pending)
    return sub is not None or old is MISSING or not _same(old, new), None


def encode_node(value: Any, node: Node, depth: int, pending: PendingBlobs) -> Node:
    """The node of ``value`` given the node of the previous version (same container
    type): only buckets holding a changed, added or removed child are written. Children
    are compared by identity first (copy-on-write deltas keep untouched ones), then
    exactly (:func:`_same`)."""
    if value is node.value:
        return node
    if not node.built // 4 - 64 <= len(value) <= 4 * node.built + 64:
        return build_node(value, depth, pending)
    if type(value) is list:
        return _encode_list(value, node, depth, pending)
    old: dict[str, Any] = node.value
    keys = list(value)
    if len(keys) >= len(old) and keys[:len(old)] == list(old):  # no key removed or moved
        return _encode_appended(value, keys, node, depth, pending)
    ords, members, subs = node.ords, list(node.members), dict(node.subs)
    copied: set[int] = set()
    dirty: set[int] = set()
    count = len(members)
    next_ord, last, added = node.next_ord, -1, 0
    for key, child in value.items():
        ordinal = ords.get(key)
        if ordinal is None:
            if type(key) is not str:
                raise ValueError("a JSON object key is not a string")
            if added == 0:
                ords = dict(ords)
            ordinal = ords[key] = next_ord
            next_ord += 1
            added += 1
            index = bucket_of(key, count)
            if index not in copied:
                members[index] = list(members[index])
                copied.add(index)
            members[index].append(key)
            dirty.add(index)
            made = _child(MISSING, child, None, depth, pending)[1]
            if made is not None:
                subs[key] = made
        else:
            before = old[key]
            if child is not before:
                changed, made = _child(before, child, subs.get(key), depth, pending)
                if changed:
                    dirty.add(bucket_of(key, count))
                if made is not None:
                    subs[key] = made
                else:
                    subs.pop(key, None)
        if ordinal < last:  # reordered: lay the node out anew
            return build_node(value, depth, pending)
        last = ordinal
    if len(old) + added != len(value):
        if added == 0:
            ords = dict(ords)
        for key in old:
            if key not in value:
                index = bucket_of(key, count)
                if index not in copied:
                    members[index] = list(members[index])
                    copied.add(index)
                members[index].remove(key)
                del ords[key]
                subs.pop(key, None)
                dirty.add(index)
    result = Node(value, "", list(node.buckets), members, 0, ords, next_ord, subs, node.built)
    for index in dirty:
        _write_bucket(result, index, pending)
    return _finish_node(result, pending)


def _encode_appended(value: dict[str, Any], keys: list[str], node: Node, depth: int,
                     pending: PendingBlobs) -> Node:
    """:func:`encode_node` of a dict whose old keys are all there, in their order, and new
    keys (if any) come after them: the common case, found with C-speed comparisons; only
    the changed children are visited."""
    old: dict[str, Any] = node.value
    subs = dict(node.subs)
    count = len(node.members)
    dirty: set[int] = set()
    for key in [k for k, v in old.items() if value[k] is not v]:
        changed, made = _child(old[key], value[key], subs.get(key), depth, pending)
        if changed:
            dirty.add(bucket_of(key, count))
        if made is not None:
            subs[key] = made
        else:
            subs.pop(key, None)
    ords, members, next_ord = node.ords, node.members, node.next_ord
    if len(keys) > len(old):
        ords, members = dict(ords), list(members)
        copied: set[int] = set()
        for key in keys[len(old):]:
            if type(key) is not str:
                raise ValueError("a JSON object key is not a string")
            ords[key] = next_ord
            next_ord += 1
            index = bucket_of(key, count)
            if index not in copied:
                members[index] = list(members[index])
                copied.add(index)
            members[index].append(key)
            dirty.add(index)
            made = _child(MISSING, value[key], None, depth, pending)[1]
            if made is not None:
                subs[key] = made
    result = Node(value, "", list(node.buckets), members, 0, ords, next_ord, subs, node.built)
    for index in dirty:
        _write_bucket(result, index, pending)
    return _finish_node(result, pending)


def _encode_list(value: list[Any], node: Node, depth: int, pending: PendingBlobs) -> Node:
    old: list[Any] = node.value
    subs = dict(node.subs)
    span = node.span
    dirty: set[int] = set()
    for index, child in enumerate(value):
        before = old[index] if index < len(old) else MISSING
        if child is before:
            continue
        changed, made = _child(before, child, subs.get(index), depth, pending)
        if changed:
            dirty.add(index // span)
        if made is not None:
            subs[index] = made
        else:
            subs.pop(index, None)
    if len(value) < len(old):
        for index in range(len(value), len(old)):
            subs.pop(index, None)
        if len(value) % span:
            dirty.add(len(value) // span)
    result = Node(value, "", node.buckets[:-(-len(value) // span)], [], span, {}, 0, subs, node.built)
    for chunk in sorted(dirty):
        if chunk < len(result.buckets):
            result.buckets[chunk] = _chunk(result, chunk * span, pending)
        else:
            result.buckets.append(_chunk(result, chunk * span, pending))
    return _finish_node(result, pending)


def load_node(reader: BlobReader, digest: str, depth: int) -> Node:
    """Rebuild a tree node (and its value, key order and exact types) from its blobs.
    Raises CorruptState on anything malformed."""
    if depth > NODE_MAX_DEPTH:
        raise CorruptState("state tree nested too deeply")
    blob = reader.json(digest)
    try:
        kind, hashes = blob["t"], list(blob["b"])
        parts = [stored_loads(data) for data in reader.get_many(hashes).values()] if hashes else []
        by_hash = dict(zip(dict.fromkeys(hashes), parts, strict=True))
        subs: dict[Any, Node] = {}
        if kind == "d":
            entries: list[tuple[int, str, Any]] = []
            members: list[list[Any]] = []
            for bucket in (by_hash[h] for h in hashes):
                members.append([item[0] for item in bucket])
                for item in bucket:
                    key, ordinal = item[0], item[1]
                    if type(key) is not str or type(ordinal) is not int:
                        raise CorruptState(f"state node {digest}: malformed entry")
                    if len(item) == 4:
                        subs[key] = load_node(reader, item[3], depth + 1)
                        entries.append((ordinal, key, subs[key].value))
                    else:
                        entries.append((ordinal, key, item[2]))
            entries.sort(key=lambda e: e[0])
            value: Any = {key: item for _, key, item in entries}
            ords = {key: ordinal for ordinal, key, _ in entries}
            return Node(value, digest, hashes, members, 0, ords, entries[-1][0] + 1 if entries else 0,
                         subs, len(value))
        if kind == "l":
            items: list[Any] = []
            for chunk in (by_hash[h] for h in hashes):
                for cell in chunk:
                    if len(cell) == 2:
                        subs[len(items)] = load_node(reader, cell[1], depth + 1)
                        items.append(subs[len(items)].value)
                    else:
                        items.append(cell[0])
            if len(items) != blob["n"]:
                raise CorruptState(f"state node {digest}: {len(items)} items, {blob['n']} expected")
            return Node(items, digest, hashes, [], int(blob["s"]), {}, 0, subs, len(items))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptState(f"state node {digest} is malformed: {exc}") from None
    raise CorruptState(f"state node {digest} has unknown type {kind!r}")


def node_references(reader: BlobReader, digest: str, seen: set[str]) -> list[str]:
    """Blob hashes of a tree node and everything below it (node blobs name their node
    children in ``r``, so buckets are never read), skipping nodes in ``seen``."""
    refs: list[str] = []
    stack = [digest]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        blob = reader.json(current)
        refs.append(current)
        refs.extend(blob["b"])
        stack.extend(blob["r"])
    return refs
