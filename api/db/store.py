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

Large JSON values are trees of nodes (:mod:`.state_trees` gives their format): a step
that changes one record anywhere writes the new root, the nodes on the record's path and
the one bucket holding it (``benchmarks/deltas.py`` measures it).

Version 1 manifests (before trees) may also hold ``["jd", buckets, order]``: a large JSON
object split into key buckets, ``order`` the hash of its key list; they load, and the next
step stores the attribute as a tree. Manifests written before renderings existed hold
``["p", hash]`` and ``["u", repr]``; they load as the executor's legacy entries.

Every blob is keyed by a 128-bit SHA-256 prefix of its content and zlib-compressed, so
identical values are stored once, across steps, envs and forks (:mod:`.state_blobs`).

:class:`StateCache` keeps, per live env, the decoded head state and its tree nodes so that
encoding a step touches only what changed: a step's keyed changes are applied to this
cache's own values copy-on-write (``StateDelta.applied_to``, ``protocol.apply_keyed``), so
an untouched subtree is the *same object* as before and is skipped by an identity test; other children are compared exactly, never with ``==``.
Nothing here executes or unpickles anything. :func:`collect_garbage` deletes blobs no
step refers to any more. How a state *looks* (renderings of non-JSON values) is the executor's business: see
``state_view`` in :mod:`sandpit.api.envs.state`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session as DbSession

from ..json_rules import stored_loads
from .models import Blob, Step
from .state_blobs import BlobReader, CorruptState, PendingBlobs, dumps
from .state_trees import Node, build_node, encode_node, load_node, msize, node_references

__all__ = ["CHUNK_MIN_BYTES", "INLINE_MAX_BYTES", "BlobReader", "CorruptState", "Encoded", "PendingBlobs", "StateCache",
           "apply_delta", "blob_references", "collect_garbage", "encode_attr", "encode_state", "load_state"]

INLINE_MAX_BYTES = 2048
"""JSON values up to this size (bytes) live inside the root manifest."""


CHUNK_MIN_BYTES = 32 * 1024
"""JSON objects and lists of at least this size (bytes of JSON) are stored as a tree of
nodes (``["jt", hash]``)."""


Encoded = list[Any]
"""One attribute in executor encoding: ``["j", value]`` | ``["p", b64]`` | ``["u", repr]``."""


@dataclass
class _Attr:
    entry: list[Any]
    """The manifest entry."""
    encoded: Encoded
    """The executor encoding (``["j", value]`` holds the decoded value)."""
    node: Node | None = None


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

    def entry(self, name: str) -> Encoded | None:
        """One attribute in executor encoding, None when the state has no ``name`` (what a
        keyed delta applies to: ``StateDelta.applied_to``)."""
        attr = self.attrs.get(name)
        return attr.encoded if attr is not None else None


def _view_entry(view: Any, pending: PendingBlobs) -> list[Any]:
    raw = dumps(view)
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
            node = encode_node(data, node, 0, pending)
            return _Attr(["jt", node.hash], encoded, node)
        if len(data) > 1 and msize(data) >= CHUNK_MIN_BYTES:  # cheap estimate first: no JSON text
            node = build_node(data, 0, pending)
            return _Attr(["jt", node.hash], encoded, node)
    raw = dumps(data)
    if (kind_of is dict or kind_of is list) and len(data) > 1 and len(raw) >= CHUNK_MIN_BYTES:
        node = build_node(data, 0, pending)  # shared strings made the estimate small
        return _Attr(["jt", node.hash], encoded, node)
    if len(raw) <= INLINE_MAX_BYTES:
        return _Attr(["ji", data], encoded)
    return _Attr(["jb", pending.add(raw)], encoded)


def _finish(cache: StateCache, pending: PendingBlobs) -> StateCache:
    root = {"v": 2, "attrs": {name: attr.entry for name, attr in cache.attrs.items()}}
    cache.root = pending.add(dumps(root))
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


def _read_view(reader: BlobReader, entry: list[Any]) -> Any:
    if entry[0] == "ji":
        return entry[1]
    if entry[0] == "jb":
        return reader.json(entry[1])
    raise CorruptState(f"unknown rendering entry {entry[0]!r}")


def blob_references(entry: list[Any], reader: BlobReader, seen: set[str] | None = None) -> list[str]:
    """Every blob hash a manifest entry refers to (for garbage collection); tree nodes
    already in ``seen`` (shared by earlier steps) are not walked again."""
    kind = entry[0]
    if kind == "jb":
        return [entry[1]]
    if kind == "jt":
        return node_references(reader, entry[1], set() if seen is None else seen)
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
            node = load_node(reader, entry[1], 0)
            attrs[name] = _Attr(entry, ["j", node.value], node)
        elif kind == "jd":  # written before trees: one level of key buckets
            hashes = reader.json(entry[1])
            key_order = reader.json(entry[2])
            merged: dict[str, Any] = {}
            for data in reader.get_many(hashes).values():
                merged.update(stored_loads(data))
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
