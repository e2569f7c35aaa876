"""PID 1's channel to the host: connect, prove the token, then frames in and out (stdlib only).

The host listens on a Unix socket in its protocol directory, bind-mounted read-only at
``protocol.SOCKET_DIR``; next to it is a file holding this sandbox's one-time token. PID 1
connects (:func:`connect`), sends ``{"op": "hello", "token", "pid"}`` (:func:`hello`)
and points its standard streams at ``/dev/null`` (:func:`detach_stdio`); the host unlinks
both files once it accepted. From then on :class:`Host` reads length-prefixed JSON
requests (``protocol.py``, at most ``max_request_bytes`` each) in the event loop, hands
each to the runner's dispatcher, and writes the replies. A frame that breaks the protocol,
or the host closing the socket, ends the loop (PID 1 exits, the container with it); a
request whose handling raises is answered ``fault`` and the loop goes on.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time

from . import protocol
from .attached import HostFrameBuffer
from .limits import TOKEN_MAX_CHARS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any

    from .pid1_loop import Loop
    from .protocol import AnyReply

SOCKET_PATH = f"{protocol.SOCKET_DIR}/{protocol.SOCKET_NAME}"
TOKEN_PATH = f"{protocol.SOCKET_DIR}/{protocol.TOKEN_NAME}"
"""The per-container token is a file the host writes next to the socket and unlinks as
soon as the runner has connected. Neither it nor its path is in the runner's environment,
which gVisor's /proc/1/environ shows to every process of the same uid (it ignores
PR_SET_DUMPABLE): both paths are fixed (``protocol.SOCKET_DIR``)."""


def connect(path: str, deadline_s: float) -> socket.socket:
    """A blocking Unix socket connected to ``path``, retried every 10 ms while the host
    has not started listening (ENOENT, ECONNREFUSED) for up to ``deadline_s`` seconds.
    Raises the last OSError after that, or at once for any other error."""
    end = time.monotonic() + deadline_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() > end or exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                raise
            time.sleep(0.01)


def read_token(path: str = TOKEN_PATH) -> str:
    """The one-time token from the file the host wrote, at most TOKEN_MAX_CHARS characters
    ("" when absent: the host then refuses the hello)."""
    try:
        with open(path) as handle:
            return handle.read(TOKEN_MAX_CHARS).strip()
    except OSError:
        return ""


def hello(sock: socket.socket, token: str) -> None:
    """Send the first frame: ``{"op": "hello", "token", "pid"}``. Raises OSError."""
    sock.sendall(protocol.encode({"op": "hello", "token": token, "pid": os.getpid()}))


def detach_stdio() -> None:
    """Point fds 0-2 at /dev/null once connected. Docker's stdin and log pipes are host
    files that gVisor lets any process of the runner's uid open through /proc/1/fd
    (measured: it ignores PR_SET_DUMPABLE), which would let a session write into or read
    from the container's log. Costs the runner's own diagnostics after start-up (only
    the start-up output is ever read, by ``Sandbox.start`` on failure)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


class Host:
    """The connected host socket in the loop: requests to ``handle`` (each a frame not yet
    checked: ``Any`` until the request's handler checks its fields), replies back. ``sock``
    is blocking; it is read only when the selector reports it readable."""

    def __init__(self, sock: socket.socket, loop: Loop, max_request_bytes: int,
                 handle: Callable[[Any], None]) -> None:
        self.sock = sock
        self.loop = loop
        self.frames = HostFrameBuffer(max_request_bytes)
        self.handle = handle
        loop.watch(sock, self._readable)

    def reply(self, message: AnyReply) -> None:
        """Send one reply. Text a session escaped into its JSON that UTF-8 cannot carry (a
        lone surrogate) becomes ``?`` instead of an exception in PID 1. Raises OSError
        when the host is gone."""
        self.sock.sendall(protocol.encode(message, errors="replace"))

    def reply_raw(self, message: AnyReply, raw: dict[str, bytes]) -> None:
        """:meth:`reply` with members that are JSON text already (``protocol.encode_raw``)."""
        self.sock.sendall(protocol.encode_raw(message, raw, errors="replace"))

    def fault(self, request_id: object, message: str) -> None:
        """Answer a request that was unusable: ``{"id", "status": "fault", "message"}``."""
        self.reply({"id": request_id, "status": "fault", "message": message})

    def _readable(self, sock: socket.socket) -> None:
        data = protocol.recv_ready(sock)
        if data is None:
            return
        if not data:  # end of stream, or the connection failed: the host is gone
            self.loop.stop()
            return
        try:
            messages = self.frames.feed(data)
        except protocol.ProtocolViolation as exc:
            sys.stderr.write(f"sandpit-runner: host protocol violation: {exc}\n")
            self.loop.stop()
            return
        for msg in messages:
            try:
                self.handle(msg)
            except Exception as exc:  # noqa: BLE001 - a bad request must not kill the runner
                sys.stderr.write(f"sandpit-runner: request failed: {exc!r}\n")
                self.fault(msg.get("id"), f"runner error: {type(exc).__name__}: {exc}")
