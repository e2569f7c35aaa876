"""How a blob is compressed: any size reads back exactly, small ones as small as before."""

from __future__ import annotations

import os
import zlib

import pytest
from sandpit.api.db.state_blobs import SMALL_BLOB_BYTES, PendingBlobs, blob_hash, compress


@pytest.mark.parametrize("size", [0, 1, 2, 255, 256, 511, 512, 513, 1000, SMALL_BLOB_BYTES - 1, SMALL_BLOB_BYTES,
                                  SMALL_BLOB_BYTES + 1, 100_000])
@pytest.mark.parametrize("kind", ["text", "random", "repeated"])
def test_every_size_reads_back_exactly(size: int, kind: str) -> None:
    data = {"text": (b'{"id":17,"name":"n\\u00e9","tags":["a","b"]}' * (size // 40 + 1))[:size],
            "random": os.urandom(size), "repeated": b"\0" * size}[kind]
    assert zlib.decompress(compress(data)) == data


def test_small_blobs_compress_no_worse_than_the_full_window() -> None:
    """A window at least as long as the data loses no match: within a few bytes of
    ``zlib.compress(data, 1)`` (the table size only changes which matches level 1 tries)."""
    for size in (40, 300, 1500, SMALL_BLOB_BYTES - 1):
        data = (b'{"record":{"owner":"user42","value":"v1234","pad":"ppppp"}}' * (size // 60 + 1))[:size]
        assert len(compress(data)) <= len(zlib.compress(data, 1)) + 8


def test_large_blobs_are_compressed_as_before() -> None:
    data = os.urandom(2000) * 40
    assert compress(data) == zlib.compress(data, 1)


def test_pending_blobs_store_the_compressed_bytes_and_the_plain_size() -> None:
    pending = PendingBlobs()
    data = b'{"count":3}'
    digest = pending.add(data)
    assert digest == blob_hash(data)
    stored, size = pending.blobs[digest]
    assert size == len(data) and zlib.decompress(stored) == data
    assert pending.add(data) == digest and len(pending.blobs) == 1
