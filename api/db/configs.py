"""``init_config`` stored once, content-addressed (table ``init_configs``).

An env row points at its config by hash (``envs.init_config_hash``) instead of holding a
copy: a 3 MB config used by a thousand envs (creates, forks, resets with the same config)
is one row, written once; a config that differs by one value is another row. The key is
a 128-bit SHA-256 prefix of the config's *canonical bytes*: compact JSON in the config's
own key order (two configs with the same keys in another order are different configs:
``__init__`` may iterate them). Canonical bytes come from orjson, or from Python's
``json`` when orjson would not give the exact value back (non-finite floats, which orjson
writes as ``null``, lone surrogates, integers beyond 64 bits); a config always takes
the same path, so equal configs get equal bytes.

:class:`ConfigCache` keeps recently used configs parsed (by hash), so reading an env's
config (restore after eviction, reset, the API's view of the env) does not re-parse
megabytes. Configs handed out are shared: callers must not mutate them.
:func:`collect_configs` deletes configs no env points at any more.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import zlib
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache
from sqlalchemy import Executable, delete, insert, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session as DbSession

from ..json_rules import stored_loads
from .models import Env, InitConfig, table

HASH_HEX = 32
CACHE_BYTES = 64 * 1024 * 1024
"""Default budget of :class:`ConfigCache`, in canonical JSON bytes of the configs kept."""


class MissingConfig(RuntimeError):
    """An env points at a config that is not stored (the database was edited)."""


@dataclass(frozen=True)
class CanonicalConfig:
    """One config with its canonical bytes, content hash and size."""

    value: dict[str, Any]
    data: bytes
    """Canonical JSON bytes (UTF-8; lone surrogates kept as ``surrogatepass`` bytes); empty
    in a config taken from memory by its hash (:meth:`ConfigCache.known`), whose bytes
    are stored already."""
    hash: str
    size: int
    """Compact JSON size in bytes, as ``json.dumps(separators=(",", ":"),
    ensure_ascii=False)`` counts it (what the ``max_init_config_bytes`` caps measure)."""


_SMALL_FRACTION = b"0.0000"
_SHORT_EXPONENT = re.compile(rb"e-[0-9](?![0-9])")
"""Where orjson's spelling of a float differs from Python's ``repr``: a magnitude below
1e-4 that orjson writes out (``0.00001`` for ``1e-05``: :data:`_SMALL_FRACTION`), and a
one-digit negative exponent that Python pads (orjson ``5.96e-8``, Python ``5.96e-08``;
Hypothesis found it). Other floats, larger exponents included, are spelled alike. Text
inside strings can match too; that only costs a second, exact measurement. Two searches,
not one alternation: a pattern with a literal prefix is searched for in C (3 MB: ~5 ms;
the alternation tried at every byte took ~40 ms)."""


def _spelled_alike(data: bytes) -> bool:
    """True when every float in orjson's ``data`` is spelled as Python's ``json`` would
    (:data:`_SHORT_EXPONENT`)."""
    return _SMALL_FRACTION not in data and _SHORT_EXPONENT.search(data) is None


def _python_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def canonical(value: dict[str, Any]) -> CanonicalConfig:
    """``value``'s canonical bytes, hash and size (see the module docstring). orjson is
    used when its bytes are exactly Python's (no ``null`` that could stand for a
    non-finite float); the size equals Python's compact JSON size either way: where
    orjson spells a float otherwise (:data:`_FLOAT_SPELLING`) the bytes are measured by
    Python."""
    try:
        data = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # lone surrogates, huge integers
        data = b""
    if not data or b"null" in data:
        data = _python_json(value)
        size = len(data)
    else:
        size = len(data) if _spelled_alike(data) else len(_python_json(value))
    return CanonicalConfig(value, data, hashlib.sha256(data).hexdigest()[:HASH_HEX], size)


def parse(data: bytes) -> dict[str, Any]:
    """The config of canonical bytes (orjson, or Python's ``json`` for what orjson does not
    read back exactly: ``Infinity``, lone surrogates, integers beyond 64 bits, which
    orjson would make floats: any run of 19 digits takes Python's parser)."""
    value = stored_loads(data)
    if not isinstance(value, dict):
        raise MissingConfig("a stored init_config is not an object")
    return value


def compressed(config: CanonicalConfig) -> bytes:
    """What :func:`store_config` stores of ``config``: its canonical bytes, zlib level 1."""
    return zlib.compress(config.data, 1)


INSERT_CONFIGS: dict[str, Executable] = {
    "sqlite": sqlite_insert(table(InitConfig)).on_conflict_do_nothing(index_elements=["hash"]),
    "postgresql": pg_insert(table(InitConfig)).on_conflict_do_nothing(index_elements=["hash"])}
"""The insert of a config that leaves a stored one alone, per dialect, on the Core table
(built once: every env create runs it; one built per call with ``.values()`` on the ORM
entity took four times as long on SQLite, 0.10 ms against 0.025 ms with its commit)."""


def store_config(db: DbSession, config: CanonicalConfig, data: bytes | None = None) -> None:
    """Insert ``config`` unless a row with its hash exists (in ``db``'s transaction);
    ``data``: its :func:`compressed` bytes when the caller has them already."""
    row = {"hash": config.hash, "data": data if data is not None else compressed(config), "size": config.size}
    stmt = INSERT_CONFIGS.get(db.get_bind().dialect.name)
    if stmt is None:  # pragma: no cover - other dialects: check first
        if db.get(InitConfig, config.hash) is not None:
            return
        stmt = insert(InitConfig)
    db.execute(stmt, [row])


def _size_of(entry: tuple[dict[str, Any], int]) -> int:
    return entry[1]


class ConfigCache:
    """Hash -> parsed config, least recently used out past ``max_bytes`` (canonical
    bytes; a ``cachetools.LRUCache`` weighing each entry by its size, behind a lock).
    Thread-safe. Values are shared: never mutate them."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: LRUCache[str, tuple[dict[str, Any], int]] = LRUCache(max_bytes, getsizeof=_size_of)
        self._lock = threading.Lock()

    def put(self, config: CanonicalConfig, replace: bool = False) -> None:
        """Remember ``config`` (not when larger than the whole budget); an entry of the same
        hash stays unless ``replace`` (then ``config.value`` is the object handed out)."""
        if config.size > self.max_bytes:
            return
        with self._lock:
            known = self._entries.get(config.hash)  # a hit is the most recently used now
            if known is not None:
                if replace:
                    self._entries[config.hash] = (config.value, known[1])
                return
            self._entries[config.hash] = (config.value, config.size)

    def cached(self, digest: str) -> dict[str, Any] | None:
        """The config of ``digest`` if it is in memory, else None."""
        with self._lock:
            hit = self._entries.get(digest)
            return hit[0] if hit is not None else None

    def known(self, digest: str) -> CanonicalConfig | None:
        """The config of ``digest`` with its hash and size if it is in memory, without its
        canonical bytes (``data`` empty: for a caller whose config is stored already under
        ``digest``), else None."""
        with self._lock:
            hit = self._entries.get(digest)
        return CanonicalConfig(hit[0], b"", digest, hit[1]) if hit is not None else None

    def get(self, db: DbSession, digest: str) -> dict[str, Any]:
        """The config stored under ``digest`` (from memory, else read and parsed).
        Raises MissingConfig."""
        hit = self.cached(digest)
        if hit is not None:
            return hit
        stored = db.execute(select(InitConfig.data, InitConfig.size).where(InitConfig.hash == digest)).first()
        if stored is None:
            raise MissingConfig(f"init_config {digest} is not stored")
        value = parse(zlib.decompress(stored.data))
        self.put(CanonicalConfig(value, b"", digest, stored.size))  # the size the caps measured
        return value

    def __len__(self) -> int:
        return len(self._entries)


def env_config(db: DbSession, row: Env, cache: ConfigCache) -> dict[str, Any]:
    """``row``'s ``init_config``: the stored config it points at, or (rows from before
    configs were stored once) its own column. Raises MissingConfig."""
    if row.init_config_hash is None:
        return row.init_config
    return cache.get(db, row.init_config_hash)


def collect_configs(db: DbSession) -> int:
    """Delete stored configs no env points at (give it a write transaction: on SQLite it
    takes the write lock before reading, so no env can start pointing at a config while
    it is judged unreferenced). Returns how many were deleted."""
    if db.get_bind().dialect.name == "sqlite":
        db.execute(text("DELETE FROM init_configs WHERE 0"))  # take the write lock before reading
    else:
        db.execute(text("LOCK TABLE init_configs IN SHARE ROW EXCLUSIVE MODE"))
    used = set(db.scalars(select(Env.init_config_hash).where(Env.init_config_hash.is_not(None)).distinct()))
    dead = [h for h in db.scalars(select(InitConfig.hash)) if h not in used]
    for start in range(0, len(dead), 500):
        db.execute(delete(InitConfig).where(InitConfig.hash.in_(dead[start:start + 500])))
    return len(dead)
