"""Repeated ``init_config``: sent to a sandbox once (by hash afterwards), and the initial
state of sessions forked from a config template (``sandbox_images/runner/pid1_templates.py``)
known by its digest instead of being sent again.

* :func:`wire_config`: a config's exact JSON bytes (orjson) and their SHA-256. The hash is
  of bytes that keep key order and ``1``/``1.0``/``true`` apart, so two configs share a
  hash only when the sandbox would parse them into the same value. Configs orjson cannot
  write exactly (integers beyond 64 bits, lone surrogates, non-finite floats, which it
  would write as ``null``) return None: they go the old way, inside the JSON request.
* :func:`send_open` and :func:`opened_state`: the pool's ``open`` request with its config
  by hash or by bytes, and the opened session's state from the reply (encoded
  attributes), or only its digest (PID 1's SHA-256 of the state's JSON text,
  ``protocol.snapshot_text``) for a session forked from a template: the executor keeps no
  state, so whoever keeps one (the API's initial-state cache) reuses its own copy of a
  digest it knows instead of receiving megabytes again.
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any

import orjson
from cachetools import LRUCache

from ..errors import ArgumentError, SessionError
from ..results import (
    Construction,
    EncodedValue,
    OpenedState,
    check_construction,
    check_encoded,
    check_retyped,
)
from .placement import SessionSpec
from .state_text import JsonText, b64_member, state_b64

if TYPE_CHECKING:
    from .warm import PooledSandbox

CONFIGS_SENT_MAX = 64
"""Config hashes remembered per sandbox as sent to its runner (least recently used out)."""


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


class SentConfigs:
    """The config hashes a sandbox's runner was sent (what the host believes it holds),
    least recently used out past ``max_entries`` (a :class:`cachetools.LRUCache` behind a
    lock: sessions placed in one sandbox open concurrently). A belief only: a runner that
    let one go answers ``missing_config`` and the bytes are sent again (:func:`send_open`)."""

    def __init__(self, max_entries: int = CONFIGS_SENT_MAX) -> None:
        self._hashes: LRUCache[str, None] = LRUCache(maxsize=max_entries)
        self._lock = threading.Lock()

    def __contains__(self, config_hash: object) -> bool:
        with self._lock:
            return config_hash in self._hashes

    def __len__(self) -> int:
        with self._lock:
            return len(self._hashes)

    def touch(self, config_hash: str) -> None:
        """``config_hash`` was just used (most recently used now); unknown ones are ignored."""
        with self._lock:
            self._hashes.get(config_hash)

    def add(self, config_hash: str) -> None:
        """The runner was sent ``config_hash`` (the least recently used one may go)."""
        with self._lock:
            self._hashes[config_hash] = None

    def discard(self, config_hash: str) -> None:
        """The runner let ``config_hash`` go."""
        with self._lock:
            self._hashes.pop(config_hash, None)

    def clear(self) -> None:
        """The runner forgot every config (a recycle)."""
        with self._lock:
            self._hashes.clear()


def config_key(spec: SessionSpec) -> tuple[str, str, str] | None:
    """(source sha256, class name, config hash) of a session whose config goes by hash."""
    if spec.config_hash is None or spec.describe_only:
        return None
    return (hashlib.sha256(spec.source.encode("utf-8", "surrogatepass")).hexdigest(), spec.class_name,
            spec.config_hash)


def snapshot_field(snapshot: dict[str, EncodedValue]) -> JsonText | None:
    """The ``open`` request's ``snapshot_b64`` of ``snapshot`` (encoded attributes): the
    base64 of its JSON text (:func:`.state_text.state_b64`), which the runner forwards to the
    session's process unparsed and does not send back; None for an empty one. Raises
    ArgumentError (not JSON-encodable, or text UTF-8 cannot carry)."""
    if not snapshot:
        return None
    try:
        return state_b64(snapshot)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ArgumentError(f"snapshot is not JSON-encodable: {str(exc)[:200]}") from None


def send_open(sandbox: PooledSandbox, spec: SessionSpec, snapshot_b64: JsonText | None,
              fields: dict[str, Any]) -> dict[str, Any]:
    """The runner's reply to ``open``. A config with wire bytes goes by hash when the
    sandbox was sent it before, else as base64 bytes with the hash; a ``missing_config``
    answer (the runner let it go) is asked again with the bytes. ``snapshot_b64``: from
    :func:`snapshot_field`. Raises SandboxLost, ValueError/TypeError (not JSON-encodable)."""
    common = {"session": spec.session_id, "source": spec.source, "class_name": spec.class_name, **fields}
    if snapshot_b64 is not None:
        common["snapshot_b64"] = snapshot_b64
    if spec.seed is not None:
        common["seed"] = spec.seed
    request = sandbox.handle.request
    if spec.config_json is None or spec.config_hash is None:
        return request("open", init_config=spec.init_config, **common)
    if spec.config_hash in sandbox.configs:
        reply = request("open", config_hash=spec.config_hash, **common)
        if reply.get("status") != "fault" or reply.get("missing_config") is not True:
            sandbox.configs.touch(spec.config_hash)
            return reply
        sandbox.configs.discard(spec.config_hash)
    reply = request("open", config_hash=spec.config_hash,
                    config_b64=b64_member(spec.config_json), **common)
    if reply.get("status") != "fault":
        sandbox.configs.add(spec.config_hash)
    return reply


def opened_state(spec: SessionSpec, sandbox: PooledSandbox, reply: dict[str, Any],
                 restored: bool) -> tuple[OpenedState, list[dict[str, str]]]:
    """The state of a session the runner opened and the construction's retyped attributes
    (``results.check_retyped``). The state is the reply's encoded attributes, or, for a
    session forked from a config template (``template: true``, no snapshot), only the
    digest the runner gave it: the caller that needs the attributes and does not know
    them by that digest asks the sandbox (``read_state``). No state is kept here. Raises
    SessionError, ProtocolViolation (malformed reply)."""
    digest = reply.get("snapshot_digest")
    digest = digest if isinstance(digest, str) and len(digest) == 64 and not restored else None
    key = config_key(spec)
    if key is not None:
        sandbox.config_keys.add(key)
    retyped = check_retyped(reply.get("retyped"))
    construction = check_construction(reply.get("construction"))
    if reply.get("template") is True:
        if digest is None:
            raise SessionError("sandbox opened a session from a template without naming its state")
        return OpenedState(digest=digest, construction=Construction(path="template")), retyped
    if construction is not None and construction.path == "template":  # a template's state comes by digest only
        construction = Construction(path="constructed", reason="other")
    if restored:  # the caller gave the state; the reply's copy of it is not needed
        return OpenedState(construction=construction), retyped
    return OpenedState(attributes=check_encoded(reply.get("snapshot") or {}, "snapshot"), digest=digest,
                       construction=construction), retyped
