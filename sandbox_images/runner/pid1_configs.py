"""The runner's cache of ``init_config`` JSON bytes by digest (PID 1, stdlib only): a
session opened with a config sent by hash (``config_hash``, and ``config_b64`` the first
time) finds the bytes here, and a config template is built from them (``pid1_templates``)."""

from __future__ import annotations

import base64
import collections
import hashlib

from .limits import CONFIG_CACHE_MAX_BYTES


class Configs:
    """``init_config`` JSON bytes by SHA-256 hex digest, least recently used out past
    CONFIG_CACHE_MAX_BYTES (sessions keep their own reference to the bytes they use)."""

    def __init__(self, max_bytes: int = CONFIG_CACHE_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.by_hash: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self.size = 0

    def get(self, digest: str) -> bytes | None:
        data = self.by_hash.get(digest)
        if data is not None:
            self.by_hash.move_to_end(digest)
        return data

    def put(self, digest: str, data: bytes) -> bool:
        """Keep ``data`` under ``digest`` if it is its SHA-256 (False otherwise)."""
        if hashlib.sha256(data).hexdigest() != digest:
            return False
        if digest not in self.by_hash and len(data) <= self.max_bytes:
            self.by_hash[digest] = data
            self.size += len(data)
            while self.size > self.max_bytes:
                _, old = self.by_hash.popitem(last=False)
                self.size -= len(old)
        return True

    def resolve(self, digest: str, data_b64: object) -> bytes | None:
        """The bytes of config ``digest`` after keeping ``data_b64`` (their base64, when not
        None); None when they are not held. Raises ValueError when ``data_b64`` is not the
        base64 of bytes whose SHA-256 is ``digest``."""
        if data_b64 is not None:
            try:
                data = base64.b64decode(data_b64, validate=True)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                data = b""
            if not self.put(digest, data):
                raise ValueError("field 'config_b64' does not match 'config_hash'")
        return self.get(digest)

    def clear(self) -> None:
        self.by_hash.clear()
        self.size = 0
