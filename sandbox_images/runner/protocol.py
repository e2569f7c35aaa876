"""Length-prefixed JSON framing shared by the host executor and the in-sandbox runner.

Stdlib only: this file is copied into the sandbox image and also imported on the host
as ``sandpit.sandbox_images.runner.protocol``. It never executes or unpickles anything.

Wire format: a frame is a 4-byte big-endian unsigned length ``n`` followed by ``n`` bytes
of UTF-8 JSON encoding one object. A frame larger than the reader's ``max_frame`` bytes,
or one that is not a JSON object, raises :class:`ProtocolViolation`; the peer that sent it
is then treated as broken (the runner kills a misbehaving child, the host kills a
misbehaving sandbox). JSON is parsed with ``parse_constant`` refusing NaN/Infinity and
a nesting-depth bound, so a hostile peer cannot smuggle non-standard values or blow the
parser's stack.
"""

from __future__ import annotations

import json
import socket
import struct

from .limits import MAX_FRAME_BYTES, MAX_FRAME_DEPTH, MAX_PATH_LENGTH
from .wire import depth_exceeds

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

HEADER = struct.Struct(">I")

SOCKET_DIR = "/run/sandpit"
"""Where every sandbox has the host's protocol directory (bind-mounted read-only) and so
where the runner finds ``SOCKET_NAME`` and ``TOKEN_NAME``. Fixed on both sides, never
passed in the runner's environment: under gVisor ``/proc/1/environ`` is readable by every
process of the sandbox (it ignores PR_SET_DUMPABLE), so the environment names nothing
about the token, not even where it was."""
SOCKET_NAME = "runner.sock"
"""The host's listening Unix socket in ``SOCKET_DIR``; unlinked once the runner connected."""
TOKEN_NAME = "token"  # noqa: S105 - a file name, not a secret
"""The runner's one-time token file in ``SOCKET_DIR``; unlinked once the runner connected."""


READ_CHUNK = 1 << 20
"""Most bytes one non-blocking read takes from a socket."""


def recv_ready(sock: socket.socket) -> bytes | None:
    """What ``sock`` holds now, without waiting: the bytes, ``b""`` at end of stream or on
    a socket error (the peer is gone), ``None`` when nothing has arrived yet."""
    try:
        return sock.recv(READ_CHUNK, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


class ProtocolViolation(Exception):
    """The peer sent bytes that are not a well-formed, in-limit frame. Raised by
    :meth:`FrameBuffer.feed`, ``messages`` holds the frames that were complete and valid
    before the offending one (in order)."""

    messages: list[dict[str, Any]] = []


def _refuse_constant(name: str) -> float:
    raise ProtocolViolation(f"non-standard JSON constant {name!r} in frame")


def _check_depth(payload: bytes, limit: int) -> None:
    """Raise :class:`ProtocolViolation` when ``payload`` nests deeper than ``limit`` levels
    (:func:`wire.depth_exceeds`, before the payload reaches ``json``)."""
    if depth_exceeds(payload, limit):
        raise ProtocolViolation(f"frame nested deeper than {limit} levels")


def encode(message: dict[str, Any], errors: str = "strict") -> bytes:
    """Serialize one message to a frame (header + compact JSON). Raises ``ValueError``
    for NaN/Infinity and ``TypeError`` for non-JSON values. A string holding a lone
    surrogate (which UTF-8 cannot carry) raises ``UnicodeEncodeError`` (a ValueError),
    or becomes ``?`` with ``errors="replace"`` (what the runner uses: a session's text
    must never stop PID 1)."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    data = body.encode("utf-8", errors)
    return HEADER.pack(len(data)) + data


def encode_raw(message: dict[str, Any], raw: dict[str, bytes], errors: str = "strict") -> bytes:
    """:func:`encode` of ``message`` plus members whose values are JSON text already
    (``raw``: name -> UTF-8 JSON bytes), spliced in without being parsed or re-encoded
    (PID 1 forwards an ``init_config`` it holds as the host's bytes, and its snapshots).
    The caller vouches that each raw value is one well-formed JSON value."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8", errors)
    parts = [body[:-1]]
    for name, value in raw.items():
        parts.append(b"," if len(parts) > 1 or len(body) > 2 else b"")
        parts.append(json.dumps(name).encode("ascii") + b":" + value)
    parts.append(b"}")
    data = b"".join(parts)
    return HEADER.pack(len(data)) + data


def snapshot_text(snapshot: dict[str, Any]) -> bytes:
    """The JSON text of an encoded snapshot as PID 1 sends it (compact, UTF-8, a lone
    surrogate as ``?``): what ``snapshot_digest`` hashes, so equal snapshots get equal
    digests whichever path (constructed, or forked from a config template) made them."""
    return json.dumps(snapshot, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8", "replace")


def decode_payload(payload: bytes, max_depth: int = MAX_FRAME_DEPTH) -> dict[str, Any]:
    """Parse one frame body. Raises :class:`ProtocolViolation` unless it is a JSON object."""
    _check_depth(payload, max_depth)
    try:
        message = json.loads(payload.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolViolation(f"frame is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolViolation("frame is not a JSON object")
    return message


class FrameBuffer:
    """Incremental frame reader for non-blocking sockets.

    ``feed(data)`` appends received bytes and returns the list of complete messages.
    ``max_frame`` is in bytes; a larger declared length raises :class:`ProtocolViolation`
    immediately, before the body is buffered. The exception's ``messages`` are the valid
    frames of ``data`` that preceded the bad one.
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        messages: list[dict[str, Any]] = []
        try:
            while len(self._buf) >= HEADER.size:
                (length,) = HEADER.unpack_from(self._buf, 0)
                if length > self.max_frame:
                    raise ProtocolViolation(
                        f"frame of {length} bytes exceeds the {self.max_frame}-byte limit"
                    )
                end = HEADER.size + length
                if len(self._buf) < end:
                    break
                payload = bytes(self._buf[HEADER.size:end])
                del self._buf[:end]
                messages.append(decode_payload(payload))
        except ProtocolViolation as exc:
            exc.messages = messages
            raise
        return messages

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes from a blocking socket; raises ``EOFError`` on close."""
    chunks = []
    remaining = n
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("peer closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, max_frame: int = MAX_FRAME_BYTES,
               max_depth: int = MAX_FRAME_DEPTH) -> dict[str, Any]:
    """Blocking read of one frame (at most ``max_frame`` bytes, nested at most
    ``max_depth`` levels). Raises ``EOFError`` or :class:`ProtocolViolation`."""
    (length,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    if length > max_frame:
        raise ProtocolViolation(f"frame of {length} bytes exceeds the {max_frame}-byte limit")
    return decode_payload(recv_exact(sock, length), max_depth)


def apply_keyed(base: object, change: object) -> list[Any] | None:
    """Apply a keyed delta entry's payload to the attribute's previous encoding ``["j",
    value]``; returns the new ``["j", value]`` or None when the change does not apply
    (malformed, or the base is not JSON): the caller treats that as a protocol violation.
    ``base`` is never modified: the result shares every untouched node with it (copy on
    write along the changed paths), so unchanged subtrees keep their identity.

    Two payload versions (``child_delta.py`` sends v2):

    * v1 ``{"set": {key: value}, "del": [key]}``: top-level keys of a JSON object;
    * v2 ``{"v": 2, "ops": [op, ...]}``: path operations, applied in order, ``op`` one of
      ``["s", path, value]`` (replace the node at ``path``, or add a dict key at the end;
      ``[]`` replaces the whole value), ``["d", path]`` (delete an existing dict key),
      ``["r", path, n, items]`` (keep the list's first ``n`` items, then append ``items``).
      ``path`` is at most MAX_PATH_LENGTH dict keys (str) and list indexes (int, in range).
    """
    if not (isinstance(base, list) and len(base) == 2 and base[0] == "j"):
        return None
    if not isinstance(change, dict):
        return None
    if change.get("v") == 2:
        ops = change.get("ops")
        if not isinstance(ops, list):
            return None
        try:
            return ["j", apply_path_ops(base[1], ops)]
        except (LookupError, TypeError, ValueError):
            return None
    if not isinstance(base[1], dict):
        return None
    sets, dels = change.get("set"), change.get("del")
    if not isinstance(sets, dict) or not isinstance(dels, list) or not all(isinstance(k, str) for k in dels):
        return None
    merged = dict(base[1])
    merged.update(sets)
    for key in dels:
        merged.pop(key, None)
    return ["j", merged]


def apply_path_ops(value: Any, ops: list[Any]) -> Any:
    """``value`` after the path operations ``ops`` (see :func:`apply_keyed`), copying only
    the containers on the changed paths. Raises ``ValueError`` (malformed operation, path
    too long), ``LookupError`` (a path that does not exist, an index out of range) or
    ``TypeError`` (a step into a scalar, a key of the wrong type)."""
    root = value
    fresh: set[int] = set()  # ids of the containers copied here (safe to change in place)
    alive: list[Any] = []  # ...kept referenced, so that no id is reused while we look

    def writable(node: Any) -> Any:
        if type(node) is dict:
            node = dict(node)
        elif type(node) is list:
            node = list(node)
        else:
            raise TypeError("a path goes through a scalar")
        fresh.add(id(node))
        alive.append(node)
        return node

    for op in ops:
        if not isinstance(op, list) or not op or op[0] not in ("s", "d", "r"):
            raise ValueError("malformed operation")
        kind = op[0]
        if len(op) != {"s": 3, "d": 2, "r": 4}[kind] or not isinstance(op[1], list):
            raise ValueError("malformed operation")
        path = op[1]
        if len(path) > MAX_PATH_LENGTH:
            raise ValueError("path too long")
        if not path:
            if kind == "s":
                root = op[2]
                continue
            if kind == "d":
                raise ValueError("cannot delete the whole value")
        if id(root) not in fresh:
            root = writable(root)
        parent = root
        for step in path[:-1] if path else []:
            child = _step(parent, step)
            if id(child) not in fresh:
                child = writable(child)
                parent[step] = child
            parent = child
        last = path[-1] if path else None
        if kind == "s":
            if type(parent) is dict and type(last) is str:
                parent[last] = op[2]
            else:
                _step(parent, last)  # must exist: list items are replaced, never added
                parent[last] = op[2]
        elif kind == "d":
            if type(parent) is not dict or type(last) is not str:
                raise TypeError("delete of a non-key")
            del parent[last]
        else:
            target = parent if not path else _step(parent, last)
            keep, items = op[2], op[3]
            if type(target) is not list or type(keep) is not int or not 0 <= keep <= len(target) \
                    or not isinstance(items, list):
                raise ValueError("malformed resize")
            if id(target) in fresh:  # ours already: in place (each container is copied at most once)
                del target[keep:]
                target.extend(items)
                continue
            resized = target[:keep] + items
            fresh.add(id(resized))
            alive.append(resized)
            if path:
                parent[last] = resized
            else:
                root = resized
    return root


def _step(node: Any, key: Any) -> Any:
    """``node[key]`` for a dict and a str key or a list and an in-range int index."""
    if type(node) is dict and type(key) is str:
        return node[key]
    if type(node) is list and type(key) is int and 0 <= key < len(node):
        return node[key]
    raise TypeError("a path step does not fit its container")
