"""Envs' ``init_config``: stored once by content hash (:mod:`sandpit.api.db.configs`) and
kept parsed in memory, so a restore, a reset or the view of an env does not parse
megabytes again and a repeated config is not compressed again on every create.

Configs handed out are shared: callers must not mutate them.
"""

from __future__ import annotations

import threading
from typing import Any

from cachetools import LRUCache
from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..db.configs import CanonicalConfig, ConfigCache, MissingConfig, canonical, compressed, env_config
from ..db.database import Database
from ..errors import PayloadTooLarge, ServiceUnavailable
from ..settings import ApiSettings

COMPRESSED_CONFIGS = 16
"""Compressed configs remembered by hash (the last few configs created with)."""


class EnvConfigs:
    """The envs' configs: parsed (:class:`~sandpit.api.db.configs.ConfigCache`, bounded by
    bytes) and compressed for storage (the last :data:`COMPRESSED_CONFIGS`, a
    ``cachetools.LRUCache`` behind a lock); the server-wide size cap. Thread-safe."""

    def __init__(self, settings: ApiSettings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self.parsed = ConfigCache()
        self._compressed: LRUCache[str, bytes] = LRUCache(COMPRESSED_CONFIGS)
        self._lock = threading.Lock()

    def check(self, config: CanonicalConfig) -> None:
        """The server-wide cap (``max_init_config_bytes``, compact JSON bytes): raises
        PayloadTooLarge (413, field ``init_config``)."""
        limit = self.settings.max_init_config_bytes
        if config.size > limit:
            raise PayloadTooLarge(f"init_config is {config.size} bytes, over {limit}", field="init_config")

    def config_of(self, row: models.Env) -> dict[str, Any]:
        """``row``'s ``init_config`` (shared: do not mutate), read from the database only
        when it is not in memory. Raises ServiceUnavailable when the stored config is
        missing."""
        if row.init_config_hash is None:
            return row.init_config
        cached = self.parsed.cached(row.init_config_hash)
        if cached is not None:
            return cached
        with self.db.read() as db:
            return self.read(db, row)

    def current(self, row: models.Env) -> CanonicalConfig:
        """``row``'s config with its hash and size (a reset that keeps it): from memory by
        the hash the row points at when it is there (:meth:`ConfigCache.known`: no canonical
        bytes, they are stored), else :func:`~sandpit.api.db.configs.canonical` of
        :meth:`config_of` (a 1.3 MB config's canonical bytes take 5 to 6 ms to make).
        Raises ServiceUnavailable (:meth:`config_of`)."""
        if row.init_config_hash is not None:
            known = self.parsed.known(row.init_config_hash)
            if known is not None:
                return known
        return canonical(self.config_of(row))

    def read(self, db: DbSession, row: models.Env) -> dict[str, Any]:
        """:meth:`config_of` in the caller's transaction ``db``. Raises ServiceUnavailable
        (503, retry after 1 s) when the stored config is missing."""
        try:
            return env_config(db, row, self.parsed)
        except MissingConfig as exc:
            raise ServiceUnavailable(f"env {row.id!r}: {exc}", retry_after=1) from None

    def compressed(self, config: CanonicalConfig) -> bytes:
        """:func:`~sandpit.api.db.configs.compressed` of ``config``, remembered for the
        last few hashes (a repeated 3 MB config is not compressed again on every create)."""
        with self._lock:
            data = self._compressed.get(config.hash)
        if data is None:
            data = compressed(config)
            with self._lock:
                self._compressed[config.hash] = data
        return data
