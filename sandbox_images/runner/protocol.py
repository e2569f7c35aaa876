"""Length-prefixed JSON framing and the messages of the host <-> PID 1 channel.

Stdlib only: this file is copied into the sandbox image and also imported on the host
as ``sandpit.sandbox_images.runner.protocol``. It never executes or unpickles anything.

Wire format: a frame is a 4-byte big-endian unsigned length ``n`` followed by ``n`` bytes
of UTF-8 JSON encoding one object. A frame larger than the reader's ``max_frame`` bytes,
or one that is not a JSON object, raises :class:`ProtocolViolation`; the peer that sent it
is then treated as broken (the runner kills a misbehaving child, the host kills a
misbehaving sandbox). JSON is parsed with ``parse_constant`` refusing NaN/Infinity and
a nesting-depth bound (``wire.depth_exceeds``), so a hostile peer cannot smuggle
non-standard values or blow the parser's stack.

Messages (a ``TypedDict`` each, for the type checker only: nothing here imports
``typing`` at run time). PID 1 starts with :class:`Hello`; then every host request has an
integer ``id``, and its reply echoes it::

    OpenRequest     -> OpenReply        a session: its process, class and instance
    CallRequest     -> CallReply        one tool call
    CallsRequest    -> CallsReply       tool calls of several sessions, one frame each way
    DescribeRequest -> DescribeReply    the class's OpenAI tool schemas
    StateRequest    -> StateReply       the state's rendering
    SnapshotRequest -> SnapshotReply    the last good snapshot (PID 1's copy)
    RestoreRequest  -> Reply            the instance set to a snapshot
    CloseRequest    -> Reply            the session ended
    PingRequest     -> PingReply        liveness and template counters
    RecycleRequest  -> RecycleReply     emptied and proven empty for the next tenant's use
    ExecRequest     -> ExecReply        a script in a fresh process
    ChecksRequest   -> ChecksReply      check functions, each in a fresh process

A reply with ``status == "fault"`` means the request itself was unusable (unknown
session, bad fields, caps of ``limits.py``): only ``message`` says why. A reply's fields
are typed as PID 1 vouches for them (what a session's process said is checked first,
``pid1_replies``; ``object`` where it is forwarded as it is). The host trusts none of it
and checks what it reads again.
"""
from __future__ import annotations

import json
import socket
import struct

from .limits import MAX_FRAME_BYTES, MAX_FRAME_DEPTH, MAX_PATH_LENGTH
from .wire import depth_exceeds

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping  # annotations only: never evaluated in the sandbox
    from typing import Any, Literal, NotRequired, TypedDict

    from .wire import CheckFields, Delta

    Status = Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
    """What became of a call, a check or a script (``executor.results.Status``)."""
    Encoded = dict[str, list[Any]]
    """An encoded state: attribute name -> ``["j", value]`` | ``["p", base64, rendering?]``
    | ``["u", rendering]`` (``wire.is_encoded_entry``)."""

    class Hello(TypedDict):
        """PID 1's first frame: the one-time token of the file the host wrote, its pid."""

        op: Literal["hello"]
        token: str
        pid: int

    # -- requests (host -> PID 1) ------------------------------------------------------------
    class Request(TypedDict):
        """What every request carries: ``id`` (echoed by the reply); each kind adds its ``op``."""

        id: int

    class SessionRequest(Request):
        """A request to one session (``describe``, ``state``, ``snapshot``, ``close``, and
        the kinds below): its id, at most SESSION_ID_MAX_CHARS, single-use."""

        op: Literal["describe", "state", "snapshot", "close", "open", "call", "restore"]
        session: str

    class OpenRequest(SessionRequest):
        """Open a session of ``class_name`` from ``source``: ``init_config`` (EnvScaler
        ``cls(init_config)``), or ``config_hash`` (SHA-256 hex of the config's JSON bytes)
        plus ``config_b64`` (those bytes) unless PID 1 holds them; ``snapshot_b64`` (base64
        of a state's JSON text) restored over the instance; ``describe_only`` loads the class
        without an instance; ``seed`` (0 to 2**64 - 1) seeds ``random`` before the module runs."""

        source: str
        class_name: str
        init_config: NotRequired[dict[str, Any] | None]
        config_hash: NotRequired[str]
        config_b64: NotRequired[str]
        snapshot_b64: NotRequired[str]
        describe_only: NotRequired[bool]
        seed: NotRequired[int]

    class CallRequest(SessionRequest):
        """``getattr(instance, name)(**arguments)``; ``rules: "envscaler"`` for EnvScaler's
        ``step()`` (``hasattr`` decides what a call is)."""

        name: str
        arguments: dict[str, Any]
        rules: NotRequired[Literal["envscaler"]]

    class GroupedCall(TypedDict):
        """One call of a :class:`CallsRequest`: a :class:`CallRequest` without ``id``/``op``."""

        session: str
        name: str
        arguments: dict[str, Any]
        rules: NotRequired[Literal["envscaler"]]

    class CallsRequest(Request):
        """One tool call in each of several sessions (``pid1_groups``): at most
        MAX_GROUP_CALLS, no session named twice (else the whole request is a ``fault``).
        Each call runs exactly as a :class:`CallRequest` of its own (its queue, deadline
        and failure handling), every session's process is written to before any reply is
        read, and one :class:`CallsReply` answers once every call has its reply."""

        op: Literal["calls"]
        calls: list[GroupedCall]

    class RestoreRequest(SessionRequest):
        """Set restorable attributes from the snapshot (base64 of its JSON text), drop the rest."""

        snapshot_b64: str

    class CheckSource(TypedDict):
        """One check function's source (``def check_func(final_state): ...``)."""

        check_func: str

    class ExecRequest(Request):
        """Run ``code`` as ``main.py`` with ``stdin`` and ``files`` (relative path -> text)
        in a fresh process, for at most ``time_limit_s`` seconds (capped by the profile)."""

        op: Literal["exec"]
        code: str
        stdin: NotRequired[str | None]
        files: NotRequired[dict[str, str]]
        time_limit_s: NotRequired[float]

    class ChecksRequest(Request):
        """Run each check on two encoded states (JSON texts PID 1 forwards unparsed: ``attached.py``, or base64),
        each in a fresh process, at most ``time_limit_s`` s each; ``source`` only for ``check_objects: environment``."""

        op: Literal["checks"]
        checks: list[CheckSource]
        attached: NotRequired[list[bytes]]
        initial_state_b64: NotRequired[str]
        final_state_b64: NotRequired[str]
        source: NotRequired[str | None]
        time_limit_s: NotRequired[float]

    class PingRequest(Request):
        """Liveness, and counters of the templates (``PingReply``)."""

        op: Literal["ping"]

    class RecycleRequest(Request):
        """Make the sandbox fit for the next use, once its last session and job ended."""

        op: Literal["recycle"]

    # -- replies (PID 1 -> host) -------------------------------------------------------------
    class Reply(TypedDict):
        """What every reply carries: the request's ``id`` and a ``status``; a ``fault``
        carries only ``message`` (why the request was unusable)."""

        id: object
        status: str
        message: NotRequired[str]

    class OpenReply(Reply):
        """``ok``: the state as ``snapshot`` with its ``snapshot_digest`` (SHA-256 of ``snapshot_text``),
        or, for a session forked from a config template, ``template: true`` and the digest alone, or
        neither after ``snapshot_b64``; ``retyped`` keys; ``construction``: how the instance was made
        (``pid1_verdicts``). ``error``/``timeout``/``oom``/``crashed``: the ``observation`` (and
        ``traceback``) of a failed construction. A fault with ``missing_config: true``: PID 1 does
        not hold the config of ``config_hash`` (send ``config_b64``)."""

        observation: NotRequired[str]
        traceback: NotRequired[str | None]
        snapshot: NotRequired[Encoded]
        snapshot_digest: NotRequired[str]
        template: NotRequired[bool]
        construction: NotRequired[dict[str, Any]]
        retyped: NotRequired[list[Any]]
        missing_config: NotRequired[bool]

    class CallReply(Reply):
        """The call's ``status`` (``ok``, ``error``, ``rejected``, or the process's
        ``timeout``/``oom``/``crashed``) and ``observation``; the tool's own time
        (``duration_ms``; not for a failed process); ``stdout``/``stderr`` capped at
        ``output_cap_bytes``; ``delta`` (``wire.Delta``) with keyed entries ``["k",
        changes]`` (``apply_keyed``); all checked by PID 1 (``pid1_replies.call_reply``)."""

        observation: NotRequired[str]
        duration_ms: NotRequired[float]
        stdout: NotRequired[str]
        stderr: NotRequired[str]
        delta: NotRequired[Delta]
        traceback: NotRequired[str]
        observation_truncated: NotRequired[bool]
        cpu_ms: NotRequired[float]
        """On a ``timeout``: the process's CPU time during the call (``schedstat``), ms."""
        wait_ms: NotRequired[float]
        """On a ``timeout``: the process's run-queue wait during the call, ms."""
        not_started: NotRequired[bool]
        """On a ``crashed``: a new session process did not answer ``hello`` in time."""

    class CallsReply(Reply):
        """``ok`` with ``results``: the reply each call would have had alone (:class:`CallReply`, or a
        ``fault`` for an unknown session), without ``id``, in the request's order; a ``fault`` when the
        request itself was unusable. A group whose replies are large comes in parts (``part: true``,
        then the last frame), naming the positions of its ``results`` (``indices``; ``pid1_groups``)."""

        results: NotRequired[list[CallReply]]
        indices: NotRequired[list[int]]
        part: NotRequired[bool]

    class DescribeReply(Reply):
        """``ok``: ``tools`` (encoded in at most MAX_SCHEMAS_BYTES; the host checks each
        schema) and ``notes``; otherwise ``observation`` and ``traceback``, capped."""

        tools: NotRequired[list[Any]]
        notes: NotRequired[list[str]]
        observation: NotRequired[str]
        traceback: NotRequired[str]

    class StateReply(Reply):
        """The state's rendering (JSON-native attributes as they are, others as tags)."""

        state: NotRequired[object]

    class SnapshotReply(Reply):
        """PID 1's copy of the session's last good snapshot."""

        snapshot: NotRequired[Encoded]
        observation: NotRequired[object]

    class TemplateStats(TypedDict):
        """Counters of ``pid1_templates.Templates.stats`` (``ahead``: ``pid1_forks``)."""

        ready: int
        loading: int
        jobs: str
        jobs_kept: int
        spares_forked: int
        spares_rehearsed: int
        forked: int
        fallbacks: int
        failed: int
        reasons: list[str]
        configs_ready: int
        configs_loading: int
        configs_built: int
        configs_evicted: int
        configs_lru: list[str]
        configs_failed: int
        config_reasons: list[str]
        ahead: int
        ahead_taken: int

    class PingReply(Reply):
        """Open sessions, PID 1's pid (1 in a sandbox), template counters, how many sweeps
        ended on the pids cgroup's count (``counted``) or listed /proc (``listed``), and how
        many deferred starts wait for a quiet moment (``deferred``: ``pid1_loop.Loop.later``)."""

        sessions: NotRequired[int]
        pid: NotRequired[int]
        templates: NotRequired[TemplateStats]
        sweeps: NotRequired[dict[str, int]]
        deferred: NotRequired[int]

    class RecycleReply(Reply):
        """``clean`` False (with ``problems``, at most RECYCLE_MAX_PROBLEMS) when the
        sandbox must be destroyed instead of reused."""

        clean: NotRequired[bool]
        problems: NotRequired[list[str]]

    class ExecReply(Reply):
        """``ok`` (exit 0), ``error`` (non-zero exit), ``timeout`` (``exit_code`` None),
        ``oom``, ``crashed`` (a signal: ``exit_code`` ``-signal``; or no process);
        ``stdout``/``stderr`` capped at ``output_cap_bytes``, what was cut flagged."""

        exit_code: NotRequired[int | None]
        stdout: NotRequired[str]
        stderr: NotRequired[str]
        stdout_truncated: NotRequired[bool]
        stderr_truncated: NotRequired[bool]
        duration_ms: NotRequired[float]
        error: NotRequired[str | None]

    class CheckResult(CheckFields):
        """One check's result (``wire.check_result``) with its output, capped at
        CHECK_OUTPUT_CAP_BYTES per stream."""

        stdout: str
        stderr: str

    class ChecksReply(Reply):
        """One result per check, in order, and how many fresh processes the batch needed
        beyond the first (``restarts``)."""

        results: NotRequired[list[CheckResult]]
        restarts: NotRequired[int]

    AnyReply = (OpenReply | CallReply | CallsReply | DescribeReply | StateReply | SnapshotReply | PingReply | RecycleReply
                | ExecReply | ChecksReply | Reply)
    """Any frame PID 1 sends the host after :class:`Hello`."""

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
FIRST_READ = 1 << 16
"""Bytes the first ``recv`` of a read asks for: ``recv`` allocates all it asks for first,
and a megabyte (an ``mmap``, page faults, an ``munmap``) costs tens of microseconds."""


def recv_ready(sock: socket.socket) -> bytes | None:
    """What ``sock`` holds now, without waiting, at most READ_CHUNK bytes (a second read
    only when the first, of FIRST_READ, came back full): the bytes, ``b""`` at end of
    stream or on a socket error (the peer is gone), ``None`` when nothing has arrived."""
    try:
        data = sock.recv(FIRST_READ, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""
    if len(data) < FIRST_READ:
        return data
    try:
        more = sock.recv(READ_CHUNK - FIRST_READ, socket.MSG_DONTWAIT)
    except OSError:  # nothing more now (or the peer went: the next read says so)
        return data
    return data + more


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


def encode(message: Mapping[str, Any], errors: str = "strict") -> bytes:
    """Serialize one message to a frame (header + compact JSON). Raises ``ValueError``
    for NaN/Infinity and ``TypeError`` for non-JSON values. A string holding a lone
    surrogate (which UTF-8 cannot carry) raises ``UnicodeEncodeError`` (a ValueError),
    or becomes ``?`` with ``errors="replace"`` (what the runner uses: a session's text
    must never stop PID 1)."""
    data = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8", errors)
    return HEADER.pack(len(data)) + data


def encode_raw(message: Mapping[str, Any], raw: dict[str, bytes], errors: str = "strict") -> bytes:
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


def snapshot_text(snapshot: dict[str, Any], errors: str = "replace") -> bytes:
    """The JSON text of an encoded snapshot (compact, UTF-8; PID 1's: a lone surrogate as ``?``, the host's:
    ``errors="strict"``): what ``snapshot_digest`` hashes, so equal snapshots get equal digests whichever
    path (constructed, or forked from a config template) made them. Raises ValueError, TypeError."""
    return json.dumps(snapshot, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8", errors)


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
    immediately, before the body is buffered; so does a body nested deeper than ``max_depth``
    levels. The exception's ``messages`` are the valid frames of ``data`` before the bad one."""

    size_bits = 0xFFFFFFFF  # a header's bits that give the size (``attached.HostFrameBuffer``: not its flag)

    def __init__(self, max_frame: int = MAX_FRAME_BYTES, max_depth: int = MAX_FRAME_DEPTH) -> None:
        self.max_frame, self.max_depth = max_frame, max_depth
        self._buf = bytearray()

    def decode(self, header: int, payload: bytes) -> dict[str, Any]:
        """The message of one frame's ``payload`` (``header``: its size header as read)."""
        return decode_payload(payload, self.max_depth)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        messages: list[dict[str, Any]] = []
        try:
            while len(self._buf) >= HEADER.size:
                (header,) = HEADER.unpack_from(self._buf, 0)
                length = header & self.size_bits
                if length > self.max_frame:
                    raise ProtocolViolation(f"frame of {length} bytes exceeds the {self.max_frame}-byte limit")
                end = HEADER.size + length
                if len(self._buf) < end:
                    break
                payload = bytes(self._buf[HEADER.size:end])
                del self._buf[:end]
                messages.append(self.decode(header, payload))
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
    chunks, remaining = [], n
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
    if not (isinstance(base, list) and len(base) == 2 and base[0] == "j") or not isinstance(change, dict):
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
    merged = {**base[1], **sets}
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
