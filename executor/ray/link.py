"""The direct data path of the Ray backend: a replica's session requests to a sandbox host
over one TCP connection, not through Ray's actor calls.

A Ray actor call costs about 1 ms of round trip on its own (``benchmarks/scale.py``
measures it as ``actor_rtt_ms``), more than a whole local tool call. So the requests of
the step path (``open_session``, ``call``, ``restore``, ``read``, ``close_session``,
``noop``: the :data:`DIRECT` methods of :class:`~sandpit.executor.ray.host.SandboxHost`)
go over a *host link* instead, while Ray keeps placement, lifecycle and everything else
(creating hosts, pool work, drains, liveness)::

    RayExecutor (replica) ── one TCP connection per host, multiplexed ──► LinkServer in
        HostLink: RunnerChannel framing                                  the host actor

* **Endpoint.** The host actor's :class:`LinkServer` listens on its node's address (the
  one Ray uses for the node; port chosen by the kernel) and the replica learns
  ``{"address", "port", "token"}`` from the actor's ``endpoint`` method, through Ray.
* **Authentication.** The first frame on a connection must be ``{"op": "hello",
  "token": <hex>}`` carrying the host's random 32-byte token (compared in constant time),
  within :data:`LINK_HELLO_TIMEOUT_S`; anything else closes the connection. Whoever can reach
  Ray can call the host actor anyway, so the token adds no new trust, and a process that
  merely reaches the port can do nothing. Like Ray's own traffic by default, the link is
  not encrypted: on a network that others can read, run the cluster on a private network
  (or send everything through Ray with its TLS settings: ``SANDPIT_RAY_DIRECT_CALLS=false``).
* **Frames** are the runner protocol's (``sandbox_images/runner/protocol.py``: 4-byte
  length + JSON, NaN refused, size- and depth-bounded): requests ``{"id", "op", "args"}``,
  replies ``{"id", "status": "ok", "answer"}`` where ``answer`` is exactly what the same
  actor method returns through Ray (``{"ok": ...}`` or ``{"error": ...}``). Requests run
  concurrently on the server's thread pool; replies are matched by ``id``
  (:class:`~sandpit.executor.pool.channel.RunnerChannel`).
* **Failure.** A link that breaks (peer gone, malformed frame, no reply within the
  timeout) fails its requests with :class:`SandboxLost`; the replica then asks Ray whether
  the host actor is still alive and treats the host as lost only if it is not (the
  caller's recovery is the same either way: the env re-opens from its committed head).
  A link that cannot be *opened* loses nothing (no request was sent): the request goes
  through Ray instead and the link is tried again after :data:`LINK_RETRY_AFTER_S`.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandpit.sandbox_images.runner import protocol
from sandpit.sandbox_images.runner.limits import (
    LINK_CONNECT_TIMEOUT_S,
    LINK_HELLO_MAX_BYTES,
    LINK_HELLO_TIMEOUT_S,
    LINK_MAX_CONNECTIONS,
    LINK_MAX_EXTRA_DEPTH,
    MAX_FRAME_DEPTH,
)

from ..errors import LinkRefused, SandboxLost
from ..pool.channel import RunnerChannel

log = logging.getLogger("sandpit.executor")

DIRECT = frozenset({"open_session", "call", "restore", "read", "close_session", "noop"})
"""Host actor methods served on the link (the session requests: a replica that takes over
an env from another re-attaches its session with ``open_session`` on the step path)."""


class LinkServer:
    """The host actor's end: accepts authenticated connections on ``(address, 0)`` and
    answers each request frame with ``dispatch(op, args)`` (an ``{"ok"|"error": ...}``
    dict) on a pool of ``workers`` threads.

    Args:
        dispatch: called as ``dispatch(op, args)`` with ``op`` in :data:`DIRECT` and
            ``args`` a list; must return a JSON-shaped dict and not raise (an exception is
            answered as ``{"error": {"type": "ExecutorError", ...}}``).
        address: the IP address to listen on (the node's address).
        token: the shared secret (bytes; clients send it hex-encoded).
        max_frame: largest request frame in bytes (the executor's ``max_frame_bytes``).
        workers: requests served at once.
        hello_timeout_s: seconds a new connection has to authenticate.
    """

    def __init__(self, dispatch: Callable[[str, list[Any]], dict[str, Any]], address: str, token: bytes,
                 max_frame: int, workers: int, hello_timeout_s: float = LINK_HELLO_TIMEOUT_S) -> None:
        self._dispatch = dispatch
        self._hello_timeout_s = hello_timeout_s
        self._token = token.hex().encode("ascii")
        self._max_frame = max_frame
        self._depth = MAX_FRAME_DEPTH + LINK_MAX_EXTRA_DEPTH
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((address, 0))
        self._listener.listen(128)
        self.address = address
        self.port: int = self._listener.getsockname()[1]
        self._workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandpit-link")
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.refused = 0
        """Connections closed for a bad or missing hello, or over :data:`LINK_MAX_CONNECTIONS`."""
        threading.Thread(target=self._accept_loop, name="sandpit-link-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _peer = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = len(self._conns) >= LINK_MAX_CONNECTIONS or self._closed
                if not full:
                    self._conns.add(conn)
            if full:
                self._count_refused()
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="sandpit-link-conn", daemon=True).start()

    def _count_refused(self) -> None:
        with self._lock:
            self.refused += 1

    def _hello(self, conn: socket.socket) -> bool:
        """True when the connection's first frame is a hello with the token."""
        conn.settimeout(self._hello_timeout_s)
        try:
            hello = protocol.recv_frame(conn, LINK_HELLO_MAX_BYTES, 4)
        except (EOFError, OSError, protocol.ProtocolViolation):
            return False
        token = hello.get("token")
        if hello.get("op") != "hello" or not isinstance(token, str) or not token.isascii():
            return False
        if not hmac.compare_digest(token.encode("ascii"), self._token):
            return False
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(protocol.encode({"id": 0, "status": "ok"}))
        return True

    def _serve(self, conn: socket.socket) -> None:
        """One connection: hello, then request frames until it closes or misbehaves."""
        send_lock = threading.Lock()
        try:
            if not self._hello(conn):
                self._count_refused()
                return
            while True:
                message = protocol.recv_frame(conn, self._max_frame, self._depth)
                request_id, op, args = message.get("id"), message.get("op"), message.get("args")
                if not isinstance(request_id, int) or isinstance(request_id, bool):
                    raise protocol.ProtocolViolation("request without an integer id")
                if op not in DIRECT or not isinstance(args, list):
                    answer = {"error": {"type": "ValueError", "message": f"not a host link request: op {op!r}"}}
                    self._reply(conn, send_lock, request_id, answer)
                    continue
                self._workers.submit(self._run, conn, send_lock, request_id, op, args)
        except (EOFError, OSError, RuntimeError):  # RuntimeError: the server closed (no new work)
            pass
        except protocol.ProtocolViolation as exc:
            log.warning("host link: closing a connection: %s", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _run(self, conn: socket.socket, send_lock: threading.Lock, request_id: int, op: str,
             args: list[Any]) -> None:
        try:
            answer = self._dispatch(op, args)
        except Exception as exc:  # noqa: BLE001 - a request never takes the connection down
            answer = {"error": {"type": "ExecutorError", "message": f"{type(exc).__name__}: {exc}"}}
        self._reply(conn, send_lock, request_id, answer)

    @staticmethod
    def _reply(conn: socket.socket, send_lock: threading.Lock, request_id: int, answer: dict[str, Any]) -> None:
        try:
            frame = protocol.encode({"id": request_id, "status": "ok", "answer": answer})
        except (ValueError, TypeError) as exc:
            frame = protocol.encode({"id": request_id, "status": "ok", "answer": {
                "error": {"type": "ExecutorError", "message": f"the answer cannot be sent: {exc}"}}})
        try:
            with send_lock:
                conn.sendall(frame)
        except OSError:
            pass  # the connection is gone: its reader ends it

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed server is not reopened: start a new one)."""
        return self._closed

    def connections(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._conns)

    def close(self) -> None:
        """Stop listening and close every connection (their pending requests fail on the
        replicas' side with SandboxLost)."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._workers.shutdown(wait=False, cancel_futures=True)


class HostLink:
    """A replica's end: one authenticated, multiplexed connection to a host's
    :class:`LinkServer`.

    Raises (constructor): LinkRefused when the connection or its hello fails.
    """

    def __init__(self, host: str, address: str, port: int, token: str, max_frame: int) -> None:
        self.host = host
        try:
            sock = socket.create_connection((address, port), timeout=LINK_CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise LinkRefused(f"cannot connect to host {host} at {address}:{port}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(protocol.encode({"op": "hello", "token": token}))
            reply = protocol.recv_frame(sock, LINK_HELLO_MAX_BYTES, 4)
        except (OSError, EOFError, protocol.ProtocolViolation) as exc:
            sock.close()
            raise LinkRefused(f"host {host} at {address}:{port} refused the link: {exc}") from exc
        if reply.get("status") != "ok":
            sock.close()
            raise LinkRefused(f"host {host} at {address}:{port} refused the link: {reply}")
        self._channel = RunnerChannel(sock, host, max_frame, MAX_FRAME_DEPTH + LINK_MAX_EXTRA_DEPTH)

    @property
    def alive(self) -> bool:
        return self._channel.alive

    def request(self, op: str, args: list[Any], timeout_s: float) -> dict[str, Any]:
        """Send ``op(*args)`` and return the host's answer (``{"ok"|"error": ...}``).

        Raises:
            SandboxLost: the link broke or no reply came within ``timeout_s`` seconds.
            ValueError / TypeError: ``args`` are not JSON-encodable (nothing was sent).
        """
        reply = self._channel.request(op, timeout_s, args=args)
        answer = reply.get("answer")
        if not isinstance(answer, dict) or ("ok" not in answer and "error" not in answer):
            self.close()
            raise SandboxLost(f"host {self.host} sent a malformed answer", sandbox_id=self.host)
        return answer

    def close(self) -> None:
        """Close the connection (requests in flight fail with SandboxLost)."""
        self._channel.close()
