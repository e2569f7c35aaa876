"""Incremental, content-addressed state snapshots.

A state is the encoded attributes of an environment instance (executor encoding, see
:mod:`sandpit.executor.results`: ``["j", json]`` / ``["p", base64 pickle, rendering]`` /
``["u", rendering]``). It is stored as a *root manifest* blob ``{"v": 1, "attrs": {name:
entry}}`` whose entries are:

``["ji", value]``           small JSON value, inline in the root
``["jb", hash]``            JSON value in one blob
``["jd", buckets, order]``  a large JSON object split by key into buckets: ``buckets`` is
                            the hash of a blob listing bucket hashes, ``order`` the hash of
                            the key order (so restore reproduces insertion order)
``["p", hash, view]``       opaque pickle bytes (never decoded on the host) and its
                            rendering, ``view`` being ``["ji", rendering]`` or ``["jb", hash]``
``["u", view]``             not picklable (not restorable): its rendering only

Manifests written before renderings existed hold ``["p", hash]`` and ``["u", repr]``;
they load as the executor's legacy entries.

Every blob is keyed by a 128-bit SHA-256 prefix of its content and zlib-compressed, so
identical values are stored once, across steps, envs and forks. A step that changes one
record of a large ``Dict[id, record]`` writes the new root, the new bucket list and the one
changed bucket: about ``2 * sqrt(32 * size)`` bytes before compression (~16 KiB for 2 MB).

:class:`StateCache` keeps, per live env, the decoded head state and its manifest so that
encoding a step touches only what changed (dict values are compared by ``==``, which runs in
C). Nothing here executes or unpickles anything. :func:`collect_garbage` deletes blobs no
step refers to any more. How a state *looks* (renderings of non-JSON values) is the
executor's business: see ``state_view`` in :mod:`sandpit.api.services.state`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Executable, Table, delete, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session as DbSession

from .models import Blob, Step

INLINE_MAX_BYTES = 2048
"""JSON values up to this size (bytes) live inside the root manifest."""
CHUNK_MIN_BYTES = 32 * 1024
"""JSON objects above this size are split into buckets."""
HASH_HEX = 32
MISSING = object()
BLOBS = cast(Table, Blob.__table__)

Encoded = list[Any]
"""One attribute in executor encoding: ``["j", value]`` | ``["p", b64]`` | ``["u", repr]``."""


class CorruptState(RuntimeError):
    """A referenced blob is missing or malformed (the database was edited or truncated)."""


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False,
                      allow_nan=False).encode("utf-8", "surrogatepass")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:HASH_HEX]


def bucket_count(size: int) -> int:
    """Buckets for an object of ``size`` encoded bytes: the power of two nearest
    ``sqrt(size / 34)`` (balances the bucket list against one bucket), 16..4096."""
    ideal = math.sqrt(max(size, 1) / (HASH_HEX + 2))
    exponent: int = round(math.log2(max(ideal, 1)))
    return max(16, min(4096, 1 << exponent))


def bucket_of(key: str, buckets: int) -> int:
    """Stable bucket of a key (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % buckets


@dataclass
class _Chunked:
    """Decoded-side bookkeeping of one bucketed attribute."""

    buckets: int
    bucket_hashes: list[str]
    keys: list[set[str]]
    """Keys in each bucket."""
    order_hash: str
    key_order: list[str]


@dataclass
class _Attr:
    entry: list[Any]
    """The manifest entry."""
    encoded: Encoded
    """The executor encoding (``["j", value]`` holds the decoded value)."""
    chunked: _Chunked | None = None


@dataclass
class StateCache:
    """Head state of one env: its attributes (manifest entries + decoded values) and the
    root hash. Built from a full state or loaded from the store; updated per step."""

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

    def write(self, db: DbSession) -> int:
        """Insert every blob that is not stored yet; returns compressed bytes offered."""
        if not self.blobs:
            return 0
        rows = [{"hash": h, "data": data, "size": size} for h, (data, size) in self.blobs.items()]
        dialect = db.get_bind().dialect.name
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


def _encode_chunked(value: dict[str, Any], size: int, pending: PendingBlobs,
                    previous: _Attr | None) -> tuple[list[Any], _Chunked]:
    old = previous.chunked if previous is not None else None
    old_value = previous.encoded[1] if previous is not None and previous.encoded[0] == "j" else None
    buckets = bucket_count(size)
    if old is not None and isinstance(old_value, dict) and old.buckets / 4 <= buckets <= old.buckets * 4:
        buckets = old.buckets  # keep the layout: unchanged buckets keep their hashes
        dirty: set[int] = set()
        keys = [set(k) for k in old.keys]
        for key, item in value.items():
            before = old_value.get(key, MISSING)
            if before is MISSING:
                index = bucket_of(key, buckets)
                keys[index].add(key)
                dirty.add(index)
            elif before is not item and before != item:
                dirty.add(bucket_of(key, buckets))
        if len(old_value) + sum(1 for k in value if k not in old_value) != len(value):
            for key in old_value:
                if key not in value:
                    index = bucket_of(key, buckets)
                    keys[index].discard(key)
                    dirty.add(index)
        hashes = list(old.bucket_hashes)
        key_order = list(value)
        order_hash = old.order_hash if key_order == old.key_order else pending.add(_dumps(key_order))
    else:
        keys = [set() for _ in range(buckets)]
        for key in value:
            keys[bucket_of(key, buckets)].add(key)
        dirty = set(range(buckets))
        hashes = [""] * buckets
        key_order = list(value)
        order_hash = pending.add(_dumps(key_order))
    for index in dirty:
        members = sorted(keys[index])
        hashes[index] = pending.add(_dumps({k: value[k] for k in members}))
    list_hash = pending.add(_dumps(hashes))
    return ["jd", list_hash, order_hash], _Chunked(buckets, hashes, keys, order_hash, key_order)


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
    if isinstance(data, dict) and previous is not None and previous.chunked is not None:
        entry, chunked = _encode_chunked(data, _approx_size(previous), pending, previous)
        return _Attr(entry, encoded, chunked)
    raw = _dumps(data)
    if len(raw) <= INLINE_MAX_BYTES:
        return _Attr(["ji", data], encoded)
    if isinstance(data, dict) and len(raw) >= CHUNK_MIN_BYTES and len(data) > 1:
        entry, chunked = _encode_chunked(data, len(raw), pending, None)
        return _Attr(entry, encoded, chunked)
    return _Attr(["jb", pending.add(raw)], encoded)


def _approx_size(attr: _Attr) -> int:
    chunked = attr.chunked
    assert chunked is not None
    return chunked.buckets ** 2 * (HASH_HEX + 2)  # inverse of bucket_count: keeps layout


def _finish(cache: StateCache, pending: PendingBlobs) -> StateCache:
    root = {"v": 1, "attrs": {name: attr.entry for name, attr in cache.attrs.items()}}
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


def blob_references(entry: list[Any], reader: BlobReader) -> list[str]:
    """Every blob hash a manifest entry refers to (for garbage collection)."""
    kind = entry[0]
    if kind == "jb":
        return [entry[1]]
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
    if not isinstance(manifest, dict) or manifest.get("v") != 1 or not isinstance(manifest.get("attrs"), dict):
        raise CorruptState(f"state root {root} is not a manifest")
    attrs: dict[str, _Attr] = {}
    for name, entry in manifest["attrs"].items():
        kind = entry[0]
        if kind == "ji":
            attrs[name] = _Attr(entry, ["j", entry[1]])
        elif kind == "jb":
            attrs[name] = _Attr(entry, ["j", reader.json(entry[1])])
        elif kind == "jd":
            hashes = reader.json(entry[1])
            key_order = reader.json(entry[2])
            buckets = reader.get_many(hashes)
            merged: dict[str, Any] = {}
            keys: list[set[str]] = []
            for digest in hashes:
                part = json.loads(buckets[digest])
                merged.update(part)
                keys.append(set(part))
            value = {key: merged[key] for key in key_order}
            attrs[name] = _Attr(entry, ["j", value], _Chunked(len(hashes), hashes, keys, entry[2], key_order))
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
    for root in roots:
        manifest = reader.json(root)
        for entry in manifest.get("attrs", {}).values():
            live.update(blob_references(entry, reader))
    stored = set(db.scalars(select(Blob.hash)))
    dead = list(stored - live)
    for start in range(0, len(dead), 500):
        db.execute(delete(Blob).where(Blob.hash.in_(dead[start:start + 500])))
    return len(dead)
