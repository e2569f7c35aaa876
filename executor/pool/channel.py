"""Host end of the runner protocol: one multiplexed connection per sandbox.

Requests are frames ``{"id": n, "op": ..., ...}``; a daemon reader thread matches replies
to waiting callers by ``id``. Replies are size-capped (``max_frame``) and parsed with
depth limits (``protocol``). If the runner closes the connection or sends anything
malformed, the channel is dead and every waiter gets :class:`SandboxLost`; if a reply
does not come within the caller's timeout (the host-side watchdog), the caller gets
``SandboxLost(status="timeout")`` and must kill the sandbox.

A reply may come in parts (the runner's ``calls``, ``pid1_groups``): frames with ``part:
true`` are kept, and the last frame (without it) is handed to the caller with the
parts' frames under ``parts``.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sandpit.sandbox_images.runner import protocol
from sandpit.sandbox_images.runner.limits import MAX_FRAME_DEPTH

from ..errors import SandboxLost

log = logging.getLogger(__name__)


class _Reply:
    """One request's reply, handed from the reader thread to the caller: a lock held
    from creation and released once, when the reply (or the channel's failure) is set.
    A bare lock is one futex wake for the hand-over where a ``Future`` takes its
    condition's lock and a waiter lock of its own."""

    __slots__ = ("_ready", "message", "error")

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()
        self.message: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def set(self, message: dict[str, Any] | None, error: BaseException | None = None) -> None:
        """Give the caller ``message`` (or ``error``); called at most once per reply
        (whoever pops it from the channel's pending table, under its state lock)."""
        self.message, self.error = message, error
        self._ready.release()

    def wait(self, timeout_s: float) -> bool:
        """Whether the reply was set within ``timeout_s`` seconds (again true at once for
        a reply already set: the lock is given back)."""
        if not self._ready.acquire(timeout=timeout_s):
            return False
        self._ready.release()
        return True


class RunnerChannel:
    """Request/response over a connected socket: a Unix socket to an in-sandbox runner,
    or a host link's TCP connection to a sandbox host (:mod:`sandpit.executor.ray.link`). ``max_frame``
    (bytes) and ``max_depth`` (nesting levels) bound every reply."""

    def __init__(self, sock: socket.socket, sandbox_id: str, max_frame: int,
                 max_depth: int = MAX_FRAME_DEPTH) -> None:
        sock.settimeout(None)
        self._sock = sock
        self.sandbox_id = sandbox_id
        self._max_frame = max_frame
        self._max_depth = max_depth
        self._ids = itertools.count(1)
        self._pending: dict[int, _Reply] = {}
        self._parts: dict[int, list[dict[str, Any]]] = {}
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._dead: str | None = None
        self._reader = threading.Thread(target=self._read_loop, name=f"sandpit-chan-{sandbox_id}", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._dead is None

    def request(self, op: str, timeout_s: float, **fields: object) -> dict[str, Any]:
        """Send one request and wait for its reply (a dict with ``status``).

        Raises:
            SandboxLost: the connection is dead (``crashed``) or no reply came within
                ``timeout_s`` seconds (``timeout``).
            ValueError / TypeError: ``fields`` are not JSON-encodable (NaN, objects).
        """
        return self.submit(op, timeout_s, **fields)()

    def submit(self, op: str, timeout_s: float, **fields: object) -> Callable[[], dict[str, Any]]:
        """Send one request now; the returned function waits for its reply (what
        :meth:`request` returns or raises; ``timeout_s`` counts from now), so a caller can
        send to several sandboxes before it waits for any. Raises ValueError / TypeError
        (``fields`` not JSON-encodable) and SandboxLost (the connection is dead) at once."""
        request_id = next(self._ids)
        frame = protocol.encode({"id": request_id, "op": op, **fields})
        waiting = _Reply()
        with self._state_lock:
            if self._dead is not None:
                raise SandboxLost(f"sandbox {self.sandbox_id} is gone: {self._dead}", self.sandbox_id)
            self._pending[request_id] = waiting
        try:
            with self._send_lock:
                self._sock.sendall(frame)
        except OSError as exc:
            self._fail(f"send failed: {exc}")
        deadline = time.monotonic() + timeout_s

        def reply() -> dict[str, Any]:
            if not waiting.wait(max(0.0, deadline - time.monotonic())):
                with self._state_lock:
                    self._pending.pop(request_id, None)
                    self._parts.pop(request_id, None)
                raise SandboxLost(f"sandbox {self.sandbox_id} did not answer {op!r} within {timeout_s:.1f} s",
                                  self.sandbox_id, status="timeout")
            if waiting.error is not None:
                raise waiting.error
            assert waiting.message is not None
            return waiting.message

        return reply

    def _fail(self, reason: str) -> None:
        with self._state_lock:
            if self._dead is None:
                self._dead = reason
            pending, self._pending = self._pending, {}
            self._parts = {}
        for waiting in pending.values():
            waiting.set(None, SandboxLost(f"sandbox {self.sandbox_id} lost: {reason}", self.sandbox_id))

    def _read_loop(self) -> None:
        reason = "connection closed"
        try:
            while True:
                message = protocol.recv_frame(self._sock, self._max_frame, self._max_depth)
                request_id = message.get("id")
                with self._state_lock:
                    if type(request_id) is not int or request_id not in self._pending:
                        continue  # unsolicited, or its caller gave up (timeout)
                    if message.get("part") is True:
                        self._parts.setdefault(request_id, []).append(message)
                        continue
                    waiting = self._pending.pop(request_id)
                    parts = self._parts.pop(request_id, None)
                if parts is not None:
                    message["parts"] = parts
                waiting.set(message)
        except EOFError:
            reason = "runner closed the connection"
        except protocol.ProtocolViolation as exc:
            reason = f"protocol violation: {exc}"
            log.warning("sandbox %s: %s", self.sandbox_id, reason)
        except OSError as exc:
            reason = f"connection error: {exc}"
        self._fail(reason)

    def close(self) -> None:
        """Close the connection; pending and later requests fail with SandboxLost."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._fail("closed by host")
