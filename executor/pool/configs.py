"""Repeated ``init_config``: sent to a sandbox once (by hash afterwards), and the initial
state of sessions forked from a config template (``sandbox_images/runner/pid1_templates.py``)
known by its digest instead of being sent again.

* :func:`wire_config`: a config's exact JSON bytes (orjson) and their SHA-256. The hash is
  of bytes that keep key order and ``1``/``1.0``/``true`` apart, so two configs share a
  hash only when the sandbox would parse them into the same value. Configs orjson cannot
  write exactly (integers beyond 64 bits, lone surrogates, non-finite floats, which it
  would write as ``null``) return None: they go the old way, inside the JSON request.
* :class:`InitialSnapshots`: encoded initial states by ``(tenant, digest)``, digests
  computed by PID 1 over the state's JSON text (``protocol.snapshot_text``). Keyed by
  tenant: a sandbox, which serves one tenant, can only ever name states that sandboxes of
  its own tenant produced. Entries are shared by sessions and never changed in place
  (sessions replace whole entries; keyed deltas are applied copy-on-write).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

import orjson

from ..results import EncodedValue

INITIAL_SNAPSHOTS_MAX = 8
"""Initial states kept (each shared by the sessions that started from it)."""


def wire_config(init_config: dict[str, Any]) -> tuple[bytes, str] | None:
    """``(JSON bytes, SHA-256 hex)`` of ``init_config`` as the sandbox receives it, or None
    when orjson would not give the exact value back (see the module docstring)."""
    if not init_config:
        return None
    try:
        data = orjson.dumps(init_config)
    except (TypeError, orjson.JSONEncodeError):
        return None
    if b"null" in data and orjson.loads(data) != init_config:  # NaN and infinities become null
        return None
    return data, hashlib.sha256(data).hexdigest()


class SharedConfig(dict[str, Any]):
    """A config whose owner promises never to mutate it (the API's configs cached by hash):
    its wire bytes (:func:`wire_config`) are computed on first use and kept on the object,
    so opening more sessions of it does not encode and hash megabytes again."""

    _wire: tuple[bytes, str] | None = None
    _wired = False

    def wired(self) -> tuple[bytes, str] | None:
        """:func:`wire_config` of this config, computed once."""
        if not self._wired:
            self._wire = wire_config(self)
            self._wired = True
        return self._wire


class InitialSnapshots:
    """``(tenant, digest)`` -> encoded initial state, least recently used out past
    ``max_entries``. Thread-safe. Values are shared: never mutate them."""

    def __init__(self, max_entries: int = INITIAL_SNAPSHOTS_MAX) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], dict[str, EncodedValue]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, tenant: str, digest: str) -> dict[str, EncodedValue] | None:
        with self._lock:
            found = self._entries.get((tenant, digest))
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries.move_to_end((tenant, digest))
            return found

    def put(self, tenant: str, digest: str, snapshot: dict[str, EncodedValue]) -> None:
        with self._lock:
            self._entries[(tenant, digest)] = snapshot
            self._entries.move_to_end((tenant, digest))
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


class OpenedSnapshot(dict[str, EncodedValue]):
    """A session's encoded state as opened, with the digest PID 1 gave it (None when the
    state came with a snapshot restored on top, or from a runner without digests) and
    the construction's retyped attributes (``results.check_retyped``)."""

    digest: str | None = None
    retyped: list[dict[str, str]] | None = None
