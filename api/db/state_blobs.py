"""The blobs of stored states: content-addressed, compressed, de-duplicated.

Every blob is keyed by a 128-bit SHA-256 prefix of its content (:func:`blob_hash`) and
stored zlib-compressed in ``blobs``, so identical values are stored once, across steps,
envs and forks. :class:`PendingBlobs` gathers the blobs encoding a state makes, for the
transaction that commits it; :class:`BlobReader` reads (and memoizes) them back.
:func:`dumps` is the one JSON encoding of a blob. What the blobs hold:
:mod:`sandpit.api.db.store` (manifests) and :mod:`sandpit.api.db.state_trees` (tree nodes).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

import orjson
from sqlalchemy import Executable, bindparam, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session as DbSession

from ..json_rules import stored_loads
from .models import Blob, table

HASH_HEX = 32


class CorruptState(RuntimeError):
    """A referenced blob is missing or malformed (the database was edited or truncated)."""


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of a blob: orjson (several times faster than ``json`` on large
    states), or ``json`` for what orjson refuses (integers beyond 64 bits, lone
    surrogates, nesting past its 254 levels). Both are exact for types and key order;
    equal content may hash differently across the two (only de-duplication suffers)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False,
                          allow_nan=False).encode("utf-8", "surrogatepass")


SMALL_BLOB_BYTES = 4096
"""Blobs shorter than this are compressed with a window and hash table sized to them
(:func:`compress`)."""


def blob_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:HASH_HEX]


def compress(data: bytes) -> bytes:
    """A blob as stored: a zlib stream (level 1) that ``zlib.decompress`` reads back.
    ``zlib.compress`` sets up a 32 KiB window and a 64 Ki-entry hash table for every
    call, most of the time it takes on the few hundred bytes of a step's tree nodes; a
    blob under SMALL_BLOB_BYTES gets a window of its own size (at least 512 bytes) and
    the smallest table, which compresses it as well (a window at least as long as the
    data loses no match) in about a quarter of the time. Larger blobs are compressed as
    ``zlib.compress(data, 1)`` does."""
    if len(data) >= SMALL_BLOB_BYTES:
        return zlib.compress(data, 1)
    packer = zlib.compressobj(1, zlib.DEFLATED, max(9, len(data).bit_length()), 1)
    return packer.compress(data) + packer.flush()


INSERT_BLOBS: dict[str, Executable] = {
    "sqlite": sqlite_insert(table(Blob)).on_conflict_do_nothing(index_elements=["hash"]),
    "postgresql": pg_insert(table(Blob)).on_conflict_do_nothing(index_elements=["hash"])}
"""The insert of blobs that leaves the stored ones alone, per dialect (built once)."""
STORED_ROOT = select(table(Blob).c.hash).where(table(Blob).c.hash == bindparam("root"))
"""Whether the blob ``:root`` is stored (built once: a create asks it of its initial state)."""


class PendingBlobs:
    """Blobs produced while encoding one state, written in the step's transaction."""

    def __init__(self) -> None:
        self.blobs: dict[str, tuple[bytes, int]] = {}

    def add(self, data: bytes) -> str:
        digest = blob_hash(data)
        if digest not in self.blobs:
            self.blobs[digest] = (compress(data), len(data))
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
            if db.scalar(STORED_ROOT, {"root": root}) is not None:
                return 0
        rows = [{"hash": h, "data": data, "size": size} for h, (data, size) in self.blobs.items()]
        stmt = INSERT_BLOBS.get(dialect)
        if stmt is None:  # pragma: no cover - other dialects: check first
            existing = set(db.scalars(select(Blob.hash).where(Blob.hash.in_(list(self.blobs)))))
            rows = [row for row in rows if row["hash"] not in existing]
            stmt = table(Blob).insert()
        if rows:
            db.execute(stmt, rows)
        return self.stored_bytes


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
        return stored_loads(self.get(digest))
