"""The direct data path of the Ray backend: a replica's session requests to a sandbox
host over one gRPC channel with TLS, with a deadline on every request.

A Ray actor call costs a millisecond or so of round trip on its own, more than a whole
local tool call. So the requests of the step path (``open_session``, ``call``,
``restore``, ``read``, ``close_session``, ``noop``: the :data:`DIRECT` methods of
:class:`~sandpit.executor.ray.host.SandboxHost`) go over a *host link* on ``grpcio``,
while Ray keeps placement, lifecycle and everything else (creating hosts, pool work,
drains, liveness)::

    RayExecutor (replica) ── one gRPC channel per host (HTTP/2, TLS) ──► LinkServer in
        HostLink: one unary call per request, deadline = timeout_s      the host actor

* **Endpoint.** The host actor's :class:`LinkServer` listens on its node's address (port
  chosen by the kernel) and hands out :meth:`LinkServer.endpoint`, ``{"address", "port",
  "token", "certificate"}``, through Ray, like every other actor method. A replica opens
  ``HostLink(host, address, port, token, max_frame, certificate)``.
* **TLS.** At start the server makes an ECDSA P-256 key and a self-signed certificate
  whose subject alternative name is the node's address (:func:`self_signed`). The key never
  leaves the host actor's memory. A replica trusts exactly that certificate (it is the
  channel's only root), so no CA is involved and a peer holding another host's certificate,
  or none, fails the handshake. There is no plaintext mode.
* **Authentication.** Every call carries ``authorization: Bearer <token>`` (the host's
  random 32 bytes as hex), compared in constant time before the request body is looked
  at. A call without it is answered ``UNAUTHENTICATED`` and counted in
  :attr:`LinkServer.refused`. Whoever can reach Ray can call the host actor anyway, so the
  token adds no new trust; TLS keeps it, and the data, from the network.
* **Wire.** One gRPC method per :data:`DIRECT` op, ``/sandpit.hostlink.v1.SandboxHost/<op>``,
  plus ``hello`` (a token check at open, answered by the server itself). Bodies are the
  runner protocol's JSON (``sandbox_images/runner/protocol.py``: NaN refused, UTF-8,
  depth-bounded) without its 4-byte header, since gRPC frames messages itself: a request is
  ``{"args": [...]}``; the answer is exactly what the host actor method returns
  (``{"ok": ...}`` or ``{"error": ...}``), as through Ray.
* **Deadlines.** A request's ``timeout_s`` is its gRPC deadline. A call whose deadline
  passed (or whose caller cancelled it) before a worker took it is never dispatched: gRPC
  drops it while it waits, and the server checks again before dispatching. A dispatch
  already running when its caller gives up runs to its end (a thread cannot be stopped;
  the host's own timeouts bound it) and its answer is dropped.
* **Limits.** Bodies of at most ``max_frame`` bytes each way (gRPC's message limits, and
  checked before sending), nested at most ``MAX_FRAME_DEPTH + LINK_MAX_EXTRA_DEPTH``
  levels. HTTP/2 carries all of a replica's requests on one connection, so what a host
  caps is calls in progress: gRPC's own ``maximum_concurrent_rpcs``, ``LINK_MAX_CALLS``
  (running, or waiting for one of ``workers`` threads; more are answered
  ``RESOURCE_EXHAUSTED`` before anything runs; :meth:`LinkServer.calls` counts those being
  dispatched). A connection has ``hello_timeout_s`` to finish its TLS handshake
  and is closed after ``LINK_IDLE_S`` without a call. Keepalive pings every
  ``LINK_KEEPALIVE_S`` seconds, unanswered for ``LINK_KEEPALIVE_TIMEOUT_S``, detect a dead
  peer on either side. (Caps: ``sandbox_images/runner/limits.py``.)

Failures, mapped in one place (:func:`_open_refused`, :func:`_request_failed`)::

    when               gRPC status                              raised
    opening the link   UNAVAILABLE (nothing listens, TLS          LinkRefused: nothing was sent,
                       handshake failed), UNAUTHENTICATED,        the request goes through Ray
                       no READY within the connect timeout,
                       any other
    a request          DEADLINE_EXCEEDED                          SandboxLost(status="timeout")
                       INVALID_ARGUMENT (body not JSON, too       ValueError: the host refused it
                       deep: refused before dispatch)             before running anything
                       RESOURCE_EXHAUSTED (over the host's        CapacityError: nothing ran, the
                       LINK_MAX_CALLS)                            link stays up (503, Retry-After)
                       anything else (UNAVAILABLE, INTERNAL,      SandboxLost(status="crashed");
                       CANCELLED, UNAUTHENTICATED...), a          the link is dead (``alive``
                       malformed answer                           False)

Apart from a refusal before dispatch, a request's outcome is unknown once it may have been sent, so every
failure after sending is a :class:`SandboxLost` and the env re-opens from its committed
head. ``alive`` also turns False when the channel leaves READY (server gone, keepalive
failed, idle close); the replica then opens a new link.

Threading: the server runs gRPC's sync server on a ``ThreadPoolExecutor`` of ``workers``
threads; a :class:`HostLink` is safe to share between threads (gRPC channels are).
"""

from __future__ import annotations

import datetime
import functools
import hmac
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sandpit.sandbox_images.runner import protocol
from sandpit.sandbox_images.runner.limits import (
    LINK_CONNECT_TIMEOUT_S,
    LINK_HELLO_TIMEOUT_S,
    LINK_IDLE_S,
    LINK_KEEPALIVE_S,
    LINK_KEEPALIVE_TIMEOUT_S,
    LINK_MAX_CALLS,
    LINK_MAX_EXTRA_DEPTH,
    MAX_FRAME_DEPTH,
)

from ..errors import CapacityError, LinkRefused, SandboxLost

log = logging.getLogger("sandpit.executor")

DIRECT = frozenset({"open_session", "call", "restore", "read", "close_session", "noop"})
"""Host actor methods served on the link (the session requests: a replica that takes over
an env from another re-attaches its session with ``open_session`` on the step path)."""

SERVICE = "sandpit.hostlink.v1.SandboxHost"
"""The gRPC service name: a request for op ``x`` is the unary method ``/SERVICE/x``."""
HELLO = "hello"
"""The method a :class:`HostLink` calls once at open to check its token (not an op)."""
CERTIFICATE_DAYS = 3650
"""Validity of a host's certificate. It is pinned, and its key lives only in the host
actor's memory and dies with it, so expiry adds nothing: it only must not cut a
long-lived host's links."""

_AUTH_HEADER = "authorization"
_DEPTH = MAX_FRAME_DEPTH + LINK_MAX_EXTRA_DEPTH


def self_signed(address: str) -> tuple[bytes, bytes]:
    """A new ECDSA P-256 private key and a self-signed certificate for ``address`` (an IP
    address, or a DNS name), as PEM ``(key, certificate)``. The certificate's subject
    alternative name is ``address``, so TLS checks it against the address a replica
    dials; it is valid from an hour ago (clock skew between nodes) for
    :data:`CERTIFICATE_DAYS` days."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sandpit host link {address}"[:64])])
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(address))
    except ValueError:
        alt = x509.DNSName(address)
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
                   .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)


def _target(address: str, port: int) -> str:
    """``address:port`` as gRPC takes it (an IPv6 address in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _body(message: dict[str, Any]) -> bytes:
    """``message`` as the runner protocol encodes it, without the frame header. Raises
    ValueError (NaN, infinity, a lone surrogate) or TypeError (not JSON)."""
    return protocol.encode(message)[protocol.HEADER.size:]


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


class _Router(grpc.GenericRpcHandler):
    """Checks each call's token, then hands it to its op's handler (the server's half of
    the failure table in the module docstring)."""

    def __init__(self, server: LinkServer, token: bytes) -> None:
        self._server = server
        self._expected = b"Bearer " + token.hex().encode("ascii")
        self._handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
            f"/{SERVICE}/{op}": grpc.unary_unary_rpc_method_handler(self._behaviour(op)) for op in DIRECT}
        self._handlers[f"/{SERVICE}/{HELLO}"] = grpc.unary_unary_rpc_method_handler(self._hello)
        self._refuse: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(
            self._unauthenticated)

    def _token_ok(self, metadata: Any) -> bool:
        presented = b""
        for key, value in metadata or ():
            if key == _AUTH_HEADER and isinstance(value, str) and value.isascii():
                presented = value.encode("ascii")
        return hmac.compare_digest(presented, self._expected)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        if not self._token_ok(handler_call_details.invocation_metadata):
            self._server._count_refused()
            return self._refuse
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None and method.startswith(f"/{SERVICE}/"):
            return grpc.unary_unary_rpc_method_handler(functools.partial(self._not_direct, method))
        return handler  # None: UNIMPLEMENTED

    @staticmethod
    def _unauthenticated(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong host link token")

    @staticmethod
    def _hello(request: bytes, context: grpc.ServicerContext) -> bytes:
        return _body({"ok": None})

    @staticmethod
    def _not_direct(method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        return _body(_error("ValueError", f"not a host link request: method {method[:200]!r}"))

    def _behaviour(self, op: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def behaviour(request: bytes, context: grpc.ServicerContext) -> bytes:
            return self._server._serve(op, request, context)
        return behaviour


class LinkServer:
    """The host actor's end: a gRPC server with TLS on ``(address, 0)`` that answers each
    authenticated request with ``dispatch(op, args)`` on a pool of ``workers`` threads.

    Args:
        dispatch: called as ``dispatch(op, args)`` with ``op`` in :data:`DIRECT` and
            ``args`` a list; must return a JSON-shaped ``{"ok"|"error": ...}`` dict and not
            raise (an exception is answered as ``{"error": {"type": "ExecutorError", ...}}``).
        address: the IP address to listen on (the node's address; the certificate names it).
        token: the shared secret (bytes; clients send it hex-encoded).
        max_frame: largest request or answer body in bytes (the executor's ``max_frame_bytes``).
        workers: requests served at once (threads).
        hello_timeout_s: seconds a new connection has to finish its TLS handshake.
        keepalive_s: seconds between keepalive pings (``LINK_KEEPALIVE_S``); pings
            from clients more often than half of it are refused by gRPC.
        max_calls: calls accepted at once (``LINK_MAX_CALLS``).

    Raises:
        OSError: nothing could listen on ``address``.
    """

    def __init__(self, dispatch: Callable[[str, list[Any]], dict[str, Any]], address: str, token: bytes,
                 max_frame: int, workers: int, hello_timeout_s: float = LINK_HELLO_TIMEOUT_S, *,
                 keepalive_s: float = LINK_KEEPALIVE_S, max_calls: int = LINK_MAX_CALLS) -> None:
        self._dispatch = dispatch
        self._token = token
        self._max_frame = max_frame
        self._lock = threading.Lock()
        self._closed = False
        self.refused = 0
        """Calls answered UNAUTHENTICATED (a missing or wrong token)."""
        self._in_progress = 0
        self.address = address
        key, certificate = self_signed(address)
        self.certificate = certificate.decode("ascii")
        """This server's certificate (PEM): the one root a :class:`HostLink` trusts."""
        self._workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandpit-link")
        options = [
            ("grpc.max_receive_message_length", max_frame),
            ("grpc.max_send_message_length", max_frame),
            ("grpc.server_handshake_timeout_ms", int(hello_timeout_s * 1000)),
            ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(LINK_KEEPALIVE_TIMEOUT_S * 1000)),
            ("grpc.http2.ping_timeout_ms", int(LINK_KEEPALIVE_TIMEOUT_S * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", int(keepalive_s * 500)),
            ("grpc.max_connection_idle_ms", int(LINK_IDLE_S * 1000)),
            ("grpc.so_reuseport", 0),
        ]
        self._server = grpc.server(self._workers, handlers=[_Router(self, token)], options=options,
                                   maximum_concurrent_rpcs=max_calls)
        try:
            self.port: int = self._listen(_target(address, 0), key, certificate)
        except RuntimeError as exc:  # grpcio raises where older versions returned 0
            self._workers.shutdown(wait=False)
            raise OSError(f"host link: cannot listen on {address}: {exc}") from exc
        if not self.port:
            self._workers.shutdown(wait=False)
            raise OSError(f"host link: cannot listen on {address}")
        self._server.start()

    def _listen(self, target: str, key: bytes, certificate: bytes) -> int:
        """Listen on ``target`` with TLS under ``certificate``; the port (0: failed)."""
        return self._server.add_secure_port(target, grpc.ssl_server_credentials([(key, certificate)]))

    def endpoint(self) -> dict[str, Any]:
        """What a replica needs to open a :class:`HostLink`, as plain data for Ray:
        ``{"address", "port", "token" (64 hex digits), "certificate" (PEM)}``."""
        return {"address": self.address, "port": self.port, "token": self._token.hex(),
                "certificate": self.certificate}

    def _count_refused(self) -> None:
        with self._lock:
            self.refused += 1

    def _serve(self, op: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        """One authenticated request for ``op``: decode, dispatch, encode (module docstring)."""
        if not context.is_active():  # the caller gave up after gRPC handed the call to a worker
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before dispatch")
        try:
            message = protocol.decode_payload(request, _DEPTH)
        except protocol.ProtocolViolation as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed host link request: {exc}")
        args = message.get("args")
        if not isinstance(args, list):
            return _body(_error("ValueError", f"host link request for {op!r} without an argument list"))
        with self._lock:
            self._in_progress += 1
        try:
            answer = self._dispatch(op, args)
        except Exception as exc:  # noqa: BLE001 - a request never takes the server down
            answer = _error("ExecutorError", f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._in_progress -= 1
        try:
            body = _body(answer)
        except (ValueError, TypeError) as exc:
            body = _body(_error("ExecutorError", f"the answer cannot be sent: {exc}"))
        if len(body) > self._max_frame:
            log.warning("host link: the answer to %r is %d bytes, over the %d-byte limit", op, len(body),
                        self._max_frame)
            context.abort(grpc.StatusCode.INTERNAL,
                          f"answer of {len(body)} bytes exceeds the {self._max_frame}-byte limit")
        return body

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed server is not reopened: start a new one)."""
        return self._closed

    def calls(self) -> int:
        """Calls being dispatched now (each holds one of the ``workers`` threads)."""
        with self._lock:
            return self._in_progress

    def close(self) -> None:
        """Stop listening and cancel every call in progress (they fail on the replicas'
        side with SandboxLost). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._server.stop(grace=None)
        self._workers.shutdown(wait=False, cancel_futures=True)


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """The status code and details of a failed call (what gRPC raises is also a ``grpc.Call``)."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    return (code() if callable(code) else None), (details() if callable(details) else str(exc))


def _open_refused(host: str, target: str, exc: grpc.RpcError) -> LinkRefused:
    """The error for a failed ``hello`` (module docstring: every status refuses the link)."""
    code, details = _status(exc)
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return LinkRefused(f"host {host} at {target} refused the link's token")
    return LinkRefused(f"host {host} at {target} refused the link: {getattr(code, 'name', code)}: {details}")


def _request_failed(host: str, op: str, timeout_s: float,
                    exc: grpc.RpcError) -> SandboxLost | CapacityError | ValueError:
    """The error for a failed request (module docstring). A :class:`SandboxLost` with
    status ``crashed`` means the link is dead."""
    code, details = _status(exc)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return SandboxLost(f"sandbox host {host} did not answer {op!r} within {timeout_s:.1f} s", host,
                           status="timeout")
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(f"sandbox host {host} refused the request {op!r}: {details}")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return CapacityError(f"sandbox host {host} holds as many calls as it takes; {op!r} did not run")
    name = getattr(code, "name", "UNKNOWN")
    return SandboxLost(f"the link to sandbox host {host} failed {op!r}: {name}: {details}", host)


_POLLER_END_S = 0.5
"""Longest wait of :meth:`HostLink.close` for grpc's connectivity poller to end (seconds;
it wakes every 0.2 s)."""


class HostLink:
    """A replica's end: one gRPC channel with TLS to a host's :class:`LinkServer`, pinned
    to its ``certificate`` and shared by every thread of the replica.

    Args:
        host: the host's name (for errors; ``SandboxLost.sandbox_id``).
        address, port: where the server listens (:meth:`LinkServer.endpoint`).
        token: the host's token, 64 hex digits.
        max_frame: largest request or answer body in bytes.
        certificate: the server's certificate (PEM), the only one trusted.
        connect_timeout_s: seconds to reach READY and pass the token check.
        keepalive_s: seconds between keepalive pings (at least half the server's).
        keepalive_timeout_s: seconds a ping may go unanswered before the link is dead.

    Raises (constructor): LinkRefused when the channel, its TLS handshake or its token
    check fails; nothing was sent.
    """

    def __init__(self, host: str, address: str, port: int, token: str, max_frame: int, certificate: str, *,
                 connect_timeout_s: float = LINK_CONNECT_TIMEOUT_S, keepalive_s: float = LINK_KEEPALIVE_S,
                 keepalive_timeout_s: float = LINK_KEEPALIVE_TIMEOUT_S) -> None:
        self.host = host
        self._max_frame = max_frame
        self._metadata = ((_AUTH_HEADER, f"Bearer {token}"),)
        self._dead: str | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._was_ready = False
        target = _target(address, port)
        options = [
            ("grpc.max_receive_message_length", max_frame),
            ("grpc.max_send_message_length", max_frame),
            ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
            ("grpc.http2.ping_timeout_ms", int(keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.enable_retries", 0),  # a request's outcome is unknown once sent: never resent
            ("grpc.use_local_subchannel_pool", 1),  # its own connection: closing it closes this link only
        ]
        try:
            self._channel = self._open_channel(target, certificate.encode("ascii"), options)
        except (ValueError, UnicodeEncodeError) as exc:
            raise LinkRefused(f"cannot open a link to host {host} at {target}: {exc}") from exc
        self._channel.subscribe(self._on_state, try_to_connect=True)
        if not self._ready.wait(connect_timeout_s) or not self._was_ready:
            reason = self._dead or f"not connected within {connect_timeout_s:.1f} s"
            self.close()
            raise LinkRefused(f"cannot open a link to host {host} at {target}: {reason}")
        self._calls: dict[str, grpc.UnaryUnaryMultiCallable[bytes, bytes]] = {
            op: self._channel.unary_unary(f"/{SERVICE}/{op}") for op in (*DIRECT, HELLO)}
        try:
            self._calls[HELLO](b"{}", timeout=connect_timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            self.close()
            raise _open_refused(host, target, exc) from exc

    @staticmethod
    def _open_channel(target: str, certificate: bytes, options: list[tuple[str, Any]]) -> grpc.Channel:
        """The channel to ``target``, trusting only ``certificate``."""
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=certificate), options)

    def _on_state(self, state: grpc.ChannelConnectivity) -> None:
        """Connectivity callback: READY opens the link; leaving READY afterwards (or a
        failure before it) kills it."""
        if state is grpc.ChannelConnectivity.READY:
            self._was_ready = True
            self._ready.set()
        elif self._was_ready:
            self._die(f"connection {state.name.lower()}")
        elif state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
            self._die(f"connection {state.name.lower()} (nothing listens, or the TLS handshake failed)")
            self._ready.set()

    def _die(self, reason: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = reason

    @property
    def alive(self) -> bool:
        """Whether requests can be sent: False once closed, broken or disconnected."""
        return self._dead is None

    def request(self, op: str, args: list[Any], timeout_s: float) -> dict[str, Any]:
        """Send ``op(*args)`` with a deadline of ``timeout_s`` seconds and return the host's
        answer (``{"ok"|"error": ...}``). An op outside :data:`DIRECT` is answered
        ``{"error": {"type": "ValueError"}}`` without being sent.

        Raises:
            SandboxLost: the link is dead or broke (``crashed``), or no answer came within
                ``timeout_s`` (``timeout``): see the module docstring's table.
            ValueError / TypeError: ``args`` are not JSON-encodable or encode to more than
                ``max_frame`` bytes, or the host refused the body as malformed; nothing ran.
        """
        call = self._calls.get(op) if op != HELLO else None
        if call is None:
            return _error("ValueError", f"not a host link request: op {op!r}")
        body = _body({"args": args})
        if len(body) > self._max_frame:
            raise ValueError(f"request {op!r} of {len(body)} bytes exceeds the link's {self._max_frame}-byte limit")
        if self._dead is not None:
            raise SandboxLost(f"the link to sandbox host {self.host} is gone: {self._dead}", self.host)
        try:
            reply = call(body, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            error = _request_failed(self.host, op, timeout_s, exc)
            if isinstance(error, SandboxLost) and error.status == "crashed":
                self._die(str(error))
            raise error from exc
        try:
            answer = protocol.decode_payload(reply, _DEPTH)
        except protocol.ProtocolViolation as exc:
            answer = {"malformed": str(exc)}
        if "ok" not in answer and "error" not in answer:
            self._die("malformed answer")
            raise SandboxLost(f"host {self.host} sent a malformed answer to {op!r}", sandbox_id=self.host)
        return answer

    def close(self) -> None:
        """Close the channel (requests in flight fail with SandboxLost). Idempotent.

        Once unsubscribed, grpc's connectivity poller (a thread of the channel's) ends at
        its next wake-up, at most 0.2 s later; closing the channel while it waits makes it
        raise ``ValueError: Cannot monitor channel state: Channel closed!`` in that thread
        (grpcio 1.85). So the close waits for the poller to end, at most
        :data:`_POLLER_END_S` seconds (grpc keeps that state private: without it, the
        channel is closed at once)."""
        self._die("closed by the replica")
        self._channel.unsubscribe(self._on_state)
        connectivity = getattr(self._channel, "_connectivity_state", None)
        deadline = time.monotonic() + _POLLER_END_S
        while getattr(connectivity, "polling", False) and time.monotonic() < deadline:
            time.sleep(0.005)
        self._channel.close()
