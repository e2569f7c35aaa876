"""Incremental, content-addressed state snapshots.

A state is the encoded attributes of an environment instance (executor encoding, see
:mod:`sandpit.executor.results`: ``["j", json]`` / ``["p", base64 pickle, rendering]`` /
``["u", rendering]``). It is stored as a *root manifest* blob ``{"v": 2, "attrs": {name:
entry}}`` whose entries are:

``["ji", value]``           small JSON value, inline in the root
``["jb", hash]``            JSON value in one blob
``["jt", node]``            a large JSON dict or list stored as a tree of nodes (below)
``["p", hash, view]``       opaque pickle bytes (never decoded on the host) and its
                            rendering, ``view`` being ``["ji", rendering]`` or ``["jb", hash]``
``["u", view]``             not picklable (not restorable): its rendering only

Tree nodes, at any depth: a dict node is ``{"t": "d", "b": [bucket hashes], "r": [node
hashes of its children that are nodes]}``; a key's bucket is the CRC-32 of the key modulo
the bucket count, and a bucket blob lists ``[key, ordinal, value]`` (inline child) or
``[key, ordinal, null, node hash]`` (a child of at least NODE_MIN_BYTES, itself a node).
Ordinals are the keys' ranks in insertion order (a new key gets the next one, a deleted one
leaves a gap), so key order is restored exactly without storing the key list. A list node
is ``{"t": "l", "n": length, "s": span, "b": [chunk hashes], "r": [...]}``, chunk ``i``
holding items ``i*span`` to ``(i+1)*span - 1`` as cells ``[value]`` or ``[null, node
hash]``. Values are JSON, so types come back exact (``1``, ``1.0``, ``true``). A step
that changes one record anywhere writes the new root, the nodes on the record's path
and the one bucket holding it: a few KiB (``benchmarks/deltas.py``).

Version 1 manifests (before trees) may also hold ``["jd", buckets, order]``: a large JSON
object split into key buckets, ``order`` the hash of its key list; they load, and the next
step stores the attribute as a tree. Manifests written before renderings existed hold
``["p", hash]`` and ``["u", repr]``; they load as the executor's legacy entries.

Every blob is keyed by a 128-bit SHA-256 prefix of its content and zlib-compressed, so
identical values are stored once, across steps, envs and forks.

:class:`StateCache` keeps, per live env, the decoded head state and its tree nodes so that
encoding a step touches only what changed: the executor applies path deltas copy-on-write
(``protocol.apply_keyed``), so an untouched subtree is the *same object* as before and is
skipped by an identity test; other children are compared exactly (equal ``marshal``
bytes: types and key order count), never with ``==`` (``1 == 1.0 == True``). Nothing here
executes or unpickles anything. :func:`collect_garbage` deletes blobs no step refers to any
more. How a state *looks* (renderings of non-JSON values) is the executor's business: see
``state_view`` in :mod:`sandpit.api.services.state`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import marshal
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from sqlalchemy import Executable, Table, delete, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session as DbSession

from .models import Blob, Step

INLINE_MAX_BYTES = 2048
"""JSON values up to this size (bytes) live inside the root manifest."""
CHUNK_MIN_BYTES = 32 * 1024
"""JSON objects and lists of at least this size (bytes of JSON) are stored as a tree of
nodes (``["jt", hash]``)."""
NODE_MIN_BYTES = 16 * 1024
"""Inside a tree, a dict or list child of at least this size (estimated, :func:`_msize`)
is a node of its own."""
NODE_MAX_DEPTH = 32
"""Deepest level at which a child gets a node of its own (deeper ones stay inline)."""
HASH_HEX = 32
MISSING = object()
BLOBS = cast(Table, Blob.__table__)

Encoded = list[Any]
"""One attribute in executor encoding: ``["j", value]`` | ``["p", b64]`` | ``["u", repr]``."""


class CorruptState(RuntimeError):
    """A referenced blob is missing or malformed (the database was edited or truncated)."""


def _dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of a blob: orjson (several times faster than ``json`` on large
    states), or ``json`` for what orjson refuses (integers beyond 64 bits, lone
    surrogates, nesting past its 254 levels). Both are exact for types and key order;
    equal content may hash differently across the two (only de-duplication suffers)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False,
                          allow_nan=False).encode("utf-8", "surrogatepass")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:HASH_HEX]


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
class _Node:
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
    subs: dict[Any, _Node]
    """Children (dict keys or list indexes) stored as nodes of their own."""
    built: int
    """Children when the layout was chosen (it is chosen anew past 4x growth or shrinkage)."""


@dataclass
class _Attr:
    entry: list[Any]
    """The manifest entry."""
    encoded: Encoded
    """The executor encoding (``["j", value]`` holds the decoded value)."""
    node: _Node | None = None


@dataclass
class StateCache:
    """Head state of one env: its attributes (manifest entries + decoded values) and the
    root hash. Built from a full state or loaded from the store; updated per step. Its
    values are never changed in place (steps make new ones)."""

    attrs: dict[str, _Attr] = field(default_factory=dict)
    root: str = ""

    def encoded(self) -> dict[str, Encoded]:
        """The state in executor encoding (what ``open_session(snapshot=...)`` takes)."""
        return {name: attr.encoded for name, attr in self.attrs.items()}


class PendingBlobs:
    """Blobs produced while encoding one state, written in the step's transaction."""

    def __init__(self) -> None:
        self.blobs: dict[str, tuple[bytes, int]] = {}

    def add(self, data: bytes) -> str:
        digest = _digest(data)
        if digest not in self.blobs:
            self.blobs[digest] = (zlib.compress(data, 1), len(data))
        return digest

    @property
    def stored_bytes(self) -> int:
        """Compressed bytes of the blobs gathered so far (upper bound of what is new)."""
        return sum(len(data) for data, _ in self.blobs.values())

    def write(self, db: DbSession, root: str | None = None) -> int:
        """Insert every blob that is not stored yet; returns compressed bytes offered.

        ``root``: the state root these blobs make up, when they were written before
        (an initial state reused by digest). If that root is still stored, so is every
        blob under it (:func:`collect_garbage` deletes a state's blobs together, under a
        lock this takes too), and nothing is sent: a 3 MB state's ~1 MB of compressed
        blobs took ~20 ms to offer again on every env create."""
        if not self.blobs:
            return 0
        dialect = db.get_bind().dialect.name
        if root is not None and root in self.blobs:
            if dialect == "postgresql":  # wait for a running collection; none starts before commit
                db.execute(text("LOCK TABLE blobs IN ROW EXCLUSIVE MODE"))
            if db.scalar(select(Blob.hash).where(Blob.hash == root)) is not None:
                return 0
        rows = [{"hash": h, "data": data, "size": size} for h, (data, size) in self.blobs.items()]
        stmt: Executable
        if dialect == "sqlite":
            stmt = sqlite_insert(Blob).on_conflict_do_nothing(index_elements=["hash"])
        elif dialect == "postgresql":
            stmt = pg_insert(Blob).on_conflict_do_nothing(index_elements=["hash"])
        else:  # pragma: no cover - other dialects: check first
            existing = set(db.scalars(select(Blob.hash).where(Blob.hash.in_(list(self.blobs)))))
            rows = [row for row in rows if row["hash"] not in existing]
            stmt = BLOBS.insert()
        if rows:
            db.execute(stmt, rows)
        return self.stored_bytes


def _msize(value: Any) -> int:
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
    size = _msize(value)
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


def _build(value: Any, depth: int, pending: PendingBlobs) -> _Node:
    """A node for ``value`` (dict or list) and every large child, all blobs new."""
    subs: dict[Any, _Node] = {}
    inline = 0
    items = value.items() if type(value) is dict else enumerate(value)
    for key, child in items:
        if type(key) is not str and type(value) is dict:
            raise ValueError("a JSON object key is not a string")
        kind = type(child)
        if kind is dict or kind is list:
            size = _msize(child)
            if size >= NODE_MIN_BYTES and depth + 1 < NODE_MAX_DEPTH:
                subs[key] = _build(child, depth + 1, pending)
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
        node = _Node(value, "", [""] * count, members, 0, ords, len(ords), subs, len(value))
        for index in range(count):
            _write_bucket(node, index, pending)
    else:
        span = max(1, -(-len(value) // count))
        node = _Node(value, "", [], [], span, {}, 0, subs, len(value))
        node.buckets = [_chunk(node, start, pending) for start in range(0, len(value), span)]
    return _finish_node(node, pending)


def _write_bucket(node: _Node, index: int, pending: PendingBlobs) -> None:
    value, subs, ords = node.value, node.subs, node.ords
    entries = [[key, ords[key], None, subs[key].hash] if key in subs else [key, ords[key], value[key]]
               for key in node.members[index]]
    node.buckets[index] = pending.add(_dumps(entries))


def _chunk(node: _Node, start: int, pending: PendingBlobs) -> str:
    value, subs = node.value, node.subs
    cells = [[None, subs[i].hash] if i in subs else [value[i]] for i in range(start, min(start + node.span, len(value)))]
    return pending.add(_dumps(cells))


def _finish_node(node: _Node, pending: PendingBlobs) -> _Node:
    refs = [sub.hash for sub in node.subs.values()]
    if type(node.value) is dict:
        blob: dict[str, Any] = {"t": "d", "b": node.buckets, "r": refs}
    else:
        blob = {"t": "l", "n": len(node.value), "s": node.span, "b": node.buckets, "r": refs}
    node.hash = pending.add(_dumps(blob))
    return node


def _child(old: Any, new: Any, sub: _Node | None, depth: int, pending: PendingBlobs) -> tuple[bool, _Node | None]:
    """A changed child slot: ``(dirty, its node or None)``. ``old`` is MISSING for a new one."""
    if sub is not None and type(new) is type(sub.value):
        node = _encode_node(new, sub, depth + 1, pending)
        return node.hash != sub.hash, node
    if _large(new, depth):
        return True, _build(new, depth + 1, pending)
    return sub is not None or old is MISSING or not _same(old, new), None


def _encode_node(value: Any, node: _Node, depth: int, pending: PendingBlobs) -> _Node:
    """The node of ``value`` given the node of the previous version (same container
    type): only buckets holding a changed, added or removed child are written. Children
    are compared by identity first (copy-on-write deltas keep untouched ones), then
    exactly (:func:`_same`)."""
    if value is node.value:
        return node
    if not node.built // 4 - 64 <= len(value) <= 4 * node.built + 64:
        return _build(value, depth, pending)
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
            return _build(value, depth, pending)
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
    result = _Node(value, "", list(node.buckets), members, 0, ords, next_ord, subs, node.built)
    for index in dirty:
        _write_bucket(result, index, pending)
    return _finish_node(result, pending)


def _encode_appended(value: dict[str, Any], keys: list[str], node: _Node, depth: int,
                     pending: PendingBlobs) -> _Node:
    """:func:`_encode_node` of a dict whose old keys are all there, in their order, and new
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
    result = _Node(value, "", list(node.buckets), members, 0, ords, next_ord, subs, node.built)
    for index in dirty:
        _write_bucket(result, index, pending)
    return _finish_node(result, pending)


def _encode_list(value: list[Any], node: _Node, depth: int, pending: PendingBlobs) -> _Node:
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
    result = _Node(value, "", node.buckets[:-(-len(value) // span)], [], span, {}, 0, subs, node.built)
    for chunk in sorted(dirty):
        if chunk < len(result.buckets):
            result.buckets[chunk] = _chunk(result, chunk * span, pending)
        else:
            result.buckets.append(_chunk(result, chunk * span, pending))
    return _finish_node(result, pending)


def _view_entry(view: Any, pending: PendingBlobs) -> list[Any]:
    raw = _dumps(view)
    return ["ji", view] if len(raw) <= INLINE_MAX_BYTES else ["jb", pending.add(raw)]


def encode_attr(encoded: Encoded, pending: PendingBlobs, previous: _Attr | None = None) -> _Attr:
    """Manifest entry for one attribute, adding new blobs to ``pending``.

    Raises ``ValueError`` on an entry that is not valid executor encoding."""
    if not isinstance(encoded, list) or not 2 <= len(encoded) <= 3:
        raise ValueError("malformed encoded attribute")
    kind, data = encoded[0], encoded[1]
    if kind == "p":
        if previous is not None and previous.encoded[0] == "p" and previous.encoded[1] == data:
            return previous
        entry: list[Any] = ["p", pending.add(base64.b64decode(data, validate=True))]
        if len(encoded) == 3:
            entry.append(_view_entry(encoded[2], pending))
        return _Attr(entry, encoded)
    if len(encoded) != 2:
        raise ValueError("malformed encoded attribute")
    if kind == "u":
        if isinstance(data, str):  # legacy repr
            return _Attr(["u", data], encoded)
        return _Attr(["u", _view_entry(data, pending)], encoded)
    if kind != "j":
        raise ValueError(f"unknown encoding {kind!r}")
    if previous is not None and previous.encoded[0] == "j" and previous.encoded[1] is data:
        return previous
    kind_of = type(data)
    if kind_of is dict or kind_of is list:
        node = previous.node if previous is not None else None
        if node is not None and type(node.value) is kind_of:
            node = _encode_node(data, node, 0, pending)
            return _Attr(["jt", node.hash], encoded, node)
        if len(data) > 1 and _msize(data) >= CHUNK_MIN_BYTES:  # cheap estimate first: no JSON text
            node = _build(data, 0, pending)
            return _Attr(["jt", node.hash], encoded, node)
    raw = _dumps(data)
    if (kind_of is dict or kind_of is list) and len(data) > 1 and len(raw) >= CHUNK_MIN_BYTES:
        node = _build(data, 0, pending)  # shared strings made the estimate small
        return _Attr(["jt", node.hash], encoded, node)
    if len(raw) <= INLINE_MAX_BYTES:
        return _Attr(["ji", data], encoded)
    return _Attr(["jb", pending.add(raw)], encoded)


def _finish(cache: StateCache, pending: PendingBlobs) -> StateCache:
    root = {"v": 2, "attrs": {name: attr.entry for name, attr in cache.attrs.items()}}
    cache.root = pending.add(_dumps(root))
    return cache


def encode_state(state: dict[str, Encoded], pending: PendingBlobs) -> StateCache:
    """A full state (e.g. after instantiation) as a new :class:`StateCache`."""
    cache = StateCache({name: encode_attr(enc, pending) for name, enc in state.items()})
    return _finish(cache, pending)


def apply_delta(head: StateCache, changed: dict[str, Encoded], deleted: list[str],
                pending: PendingBlobs) -> StateCache:
    """The state after a step that set ``changed`` and removed ``deleted`` attributes
    (the executor's ``StateDelta``). ``head`` is not modified; unchanged attributes and
    unchanged buckets reuse their blobs."""
    if not changed and not deleted:
        return head
    attrs = dict(head.attrs)
    for name in deleted:
        attrs.pop(name, None)
    for name, enc in changed.items():
        attrs[name] = encode_attr(enc, pending, head.attrs.get(name))
    return _finish(StateCache(attrs), pending)


class BlobReader:
    """Reads (and memoizes, per instance) blobs of one database session."""

    def __init__(self, db: DbSession) -> None:
        self.db = db
        self.memo: dict[str, bytes] = {}

    def get_many(self, hashes: list[str]) -> dict[str, bytes]:
        missing = [h for h in dict.fromkeys(hashes) if h not in self.memo]
        for start in range(0, len(missing), 500):
            part = missing[start:start + 500]
            for digest, data in self.db.execute(select(Blob.hash, Blob.data).where(Blob.hash.in_(part))):
                self.memo[digest] = zlib.decompress(data)
        absent = [h for h in hashes if h not in self.memo]
        if absent:
            raise CorruptState(f"{len(absent)} state blob(s) missing, e.g. {absent[0]}")
        return {h: self.memo[h] for h in hashes}

    def get(self, digest: str) -> bytes:
        return self.get_many([digest])[digest]

    def json(self, digest: str) -> Any:
        return json.loads(self.get(digest))


def _read_view(reader: BlobReader, entry: list[Any]) -> Any:
    if entry[0] == "ji":
        return entry[1]
    if entry[0] == "jb":
        return reader.json(entry[1])
    raise CorruptState(f"unknown rendering entry {entry[0]!r}")


def _load_node(reader: BlobReader, digest: str, depth: int) -> _Node:
    """Rebuild a tree node (and its value, key order and exact types) from its blobs.
    Raises CorruptState on anything malformed."""
    if depth > NODE_MAX_DEPTH:
        raise CorruptState("state tree nested too deeply")
    blob = reader.json(digest)
    try:
        kind, hashes = blob["t"], list(blob["b"])
        parts = [json.loads(data) for data in reader.get_many(hashes).values()] if hashes else []
        by_hash = dict(zip(dict.fromkeys(hashes), parts, strict=True))
        subs: dict[Any, _Node] = {}
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
                        subs[key] = _load_node(reader, item[3], depth + 1)
                        entries.append((ordinal, key, subs[key].value))
                    else:
                        entries.append((ordinal, key, item[2]))
            entries.sort(key=lambda e: e[0])
            value: Any = {key: item for _, key, item in entries}
            ords = {key: ordinal for ordinal, key, _ in entries}
            return _Node(value, digest, hashes, members, 0, ords, entries[-1][0] + 1 if entries else 0,
                         subs, len(value))
        if kind == "l":
            items: list[Any] = []
            for chunk in (by_hash[h] for h in hashes):
                for cell in chunk:
                    if len(cell) == 2:
                        subs[len(items)] = _load_node(reader, cell[1], depth + 1)
                        items.append(subs[len(items)].value)
                    else:
                        items.append(cell[0])
            if len(items) != blob["n"]:
                raise CorruptState(f"state node {digest}: {len(items)} items, {blob['n']} expected")
            return _Node(items, digest, hashes, [], int(blob["s"]), {}, 0, subs, len(items))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptState(f"state node {digest} is malformed: {exc}") from None
    raise CorruptState(f"state node {digest} has unknown type {kind!r}")


def _node_references(reader: BlobReader, digest: str, seen: set[str]) -> list[str]:
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


def blob_references(entry: list[Any], reader: BlobReader, seen: set[str] | None = None) -> list[str]:
    """Every blob hash a manifest entry refers to (for garbage collection); tree nodes
    already in ``seen`` (shared by earlier steps) are not walked again."""
    kind = entry[0]
    if kind == "jb":
        return [entry[1]]
    if kind == "jt":
        return _node_references(reader, entry[1], set() if seen is None else seen)
    if kind == "jd":
        return [entry[1], entry[2], *reader.json(entry[1])]
    refs: list[str] = []
    if kind == "p":
        refs.append(entry[1])
        if len(entry) == 3 and entry[2][0] == "jb":
            refs.append(entry[2][1])
    elif kind == "u" and isinstance(entry[1], list) and entry[1][0] == "jb":
        refs.append(entry[1][1])
    return refs


def load_state(db: DbSession, root: str) -> StateCache:
    """Rebuild a :class:`StateCache` from a root hash (restore, fork, restart recovery)."""
    reader = BlobReader(db)
    manifest = reader.json(root)
    if not isinstance(manifest, dict) or manifest.get("v") not in (1, 2) or not isinstance(manifest.get("attrs"), dict):
        raise CorruptState(f"state root {root} is not a manifest")
    attrs: dict[str, _Attr] = {}
    for name, entry in manifest["attrs"].items():
        kind = entry[0]
        if kind == "ji":
            attrs[name] = _Attr(entry, ["j", entry[1]])
        elif kind == "jb":
            attrs[name] = _Attr(entry, ["j", reader.json(entry[1])])
        elif kind == "jt":
            node = _load_node(reader, entry[1], 0)
            attrs[name] = _Attr(entry, ["j", node.value], node)
        elif kind == "jd":  # written before trees: one level of key buckets
            hashes = reader.json(entry[1])
            key_order = reader.json(entry[2])
            merged: dict[str, Any] = {}
            for data in reader.get_many(hashes).values():
                merged.update(json.loads(data))
            attrs[name] = _Attr(entry, ["j", {key: merged[key] for key in key_order}])
        elif kind == "p":
            encoded = ["p", base64.b64encode(reader.get(entry[1])).decode("ascii")]
            if len(entry) == 3:
                encoded.append(_read_view(reader, entry[2]))
            attrs[name] = _Attr(entry, encoded)
        elif kind == "u":
            attrs[name] = _Attr(entry, ["u", entry[1] if isinstance(entry[1], str) else _read_view(reader, entry[1])])
        else:
            raise CorruptState(f"unknown manifest entry {kind!r} for {name!r}")
    return StateCache(attrs, root)


def collect_garbage(db: DbSession) -> int:
    """Delete blobs no step references any more (after env deletes and restores), in
    ``db``'s transaction (give it a write transaction). Takes the database's write lock
    on ``blobs`` before reading, so no step can commit a reference to a blob while it is
    judged unreferenced. Returns the number of blobs deleted."""
    if db.get_bind().dialect.name == "sqlite":
        db.execute(text("DELETE FROM blobs WHERE 0"))  # take the write lock before reading
    else:
        db.execute(text("LOCK TABLE blobs IN SHARE ROW EXCLUSIVE MODE"))
    roots = set(db.scalars(select(Step.state_root).distinct()))
    live: set[str] = set(roots)
    reader = BlobReader(db)
    seen: set[str] = set()
    for root in roots:
        manifest = reader.json(root)
        for entry in manifest.get("attrs", {}).values():
            live.update(blob_references(entry, reader, seen))
    stored = set(db.scalars(select(Blob.hash)))
    dead = list(stored - live)
    for start in range(0, len(dead), 500):
        db.execute(delete(Blob).where(Blob.hash.in_(dead[start:start + 500])))
    return len(dead)
