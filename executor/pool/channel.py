"""Host end of the runner protocol: one multiplexed connection per sandbox.

Requests are frames ``{"id": n, "op": ..., ...}``; replies are matched to their callers by
``id``. Replies are size-capped (``max_frame``) and parsed with depth limits
(``protocol``). If the runner closes the connection or sends anything malformed, the
channel is dead and every waiter gets :class:`SandboxLost`; if a reply does not come
within the caller's timeout (the host-side watchdog), the caller gets
``SandboxLost(status="timeout")`` and must kill the sandbox.

Callers read the socket themselves, one at a time (a leader/follower read): the caller
that starts waiting while nobody reads becomes the reader, hands every frame it reads to
its caller, and once its own reply has come (or its deadline has passed) hands the
reading on to a caller still waiting. A lone caller so reads its own reply on its own
thread, with no hand-over between threads. A partly read frame stays in the channel's
buffer for the next reader, so no caller waits past its own deadline. A caller that may
not wait long (an event loop) asks :meth:`PendingReply.answered` first: it waits a short
while, reading like any caller, and leaves the request pending for a thread that waits on.

Each channel also has a watcher thread, which never reads while a caller does: it sleeps
in ``poll`` for the connection's hang-up (a reply does not wake it), so an idle channel
whose runner died is dead at once (the pool's placement reads
:attr:`RunnerChannel.alive`); and every ``CHANNEL_WATCH_S`` it reads what arrived while
nobody waited (a reply whose caller has not started waiting must not leave the runner
blocked on a full socket).

A reply may come in parts (the runner's ``calls``, ``pid1_groups``): frames with ``part:
true`` are kept, and the last frame (without it) is handed to the caller with the
parts' frames under ``parts``.
"""

from __future__ import annotations

import itertools
import logging
import math
import select
import socket
import threading
import time
from typing import Any, cast

from sandpit.sandbox_images.runner import protocol
from sandpit.sandbox_images.runner.attached import encode_attached
from sandpit.sandbox_images.runner.limits import CHANNEL_WATCH_S, MAX_FRAME_DEPTH

from ..errors import SandboxLost
from .state_text import JsonText

log = logging.getLogger(__name__)

_POLL_MAX_MS = 2**31 - 1  # poll(2) takes an int of milliseconds


class _Waiter:
    """One caller waiting on a channel (or the watcher, which waits for no reply): its
    reply once set, and a lock held from creation that is released to wake the caller
    when its reply (or the channel's failure) is set or the reading is handed to it. A
    bare lock is one futex wake where a ``Future`` takes its condition's lock and a waiter
    lock of its own. Fields are changed under the channel's state lock."""

    __slots__ = ("_wake", "_woken", "done", "following", "message", "error")

    def __init__(self) -> None:
        self._wake = threading.Lock()
        self._wake.acquire()
        self._woken = False
        self.done = False
        self.following = False
        self.message: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def wake(self) -> None:
        """Release the caller's lock unless it is released already (state lock held)."""
        if not self._woken:
            self._woken = True
            self._wake.release()

    def sleep(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds to be woken (state lock not held); whether it
        was. After a wake, :meth:`rearm` under the state lock."""
        if timeout_s <= 0:
            return False
        return self._wake.acquire(timeout=-1 if timeout_s >= threading.TIMEOUT_MAX else timeout_s)

    def rearm(self) -> None:
        """After :meth:`sleep` took a wake (state lock held): the lock is held again, so
        the next :meth:`wake` releases it."""
        self._woken = False


class RunnerChannel:
    """Request/response over a connected stream socket to an in-sandbox runner (PID 1).
    ``max_frame`` (bytes) and ``max_depth`` (nesting levels) bound every reply; the
    channel owns ``sock`` (sends block; reads never block past a caller's deadline)."""

    def __init__(self, sock: socket.socket, sandbox_id: str, max_frame: int,
                 max_depth: int = MAX_FRAME_DEPTH) -> None:
        sock.settimeout(None)
        self._sock = sock
        self.sandbox_id = sandbox_id
        self._frames = protocol.FrameBuffer(max_frame, max_depth)
        self._readable = select.poll()  # used by the one reader of the moment only
        self._readable.register(sock.fileno(), select.POLLIN)
        self._ids = itertools.count(1)
        self._pending: dict[int, _Waiter] = {}
        self._parts: dict[int, list[dict[str, Any]]] = {}
        self._reader: _Waiter | None = None
        self._followers: list[_Waiter] = []
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._dead: str | None = None
        self._watcher = threading.Thread(target=self._watch, name=f"sandpit-chan-{sandbox_id}", daemon=True)
        self._watcher.start()

    @property
    def alive(self) -> bool:
        """False once the runner hung up, a frame was malformed, a send failed or the
        channel was closed (a timeout alone leaves it alive: the caller kills the sandbox)."""
        return self._dead is None

    def request(self, op: str, timeout_s: float, **fields: object) -> dict[str, Any]:
        """Send one request and wait for its reply (a dict with ``status``).

        Raises:
            SandboxLost: the connection is dead (``crashed``) or no reply came within
                ``timeout_s`` seconds (``timeout``).
            ValueError / TypeError: ``fields`` are not JSON-encodable (NaN, objects).
        """
        return self.submit(op, timeout_s, **fields)()

    def submit(self, op: str, timeout_s: float, **fields: object) -> PendingReply:
        """Send one request now; the returned :class:`PendingReply` waits for its reply
        when called (what :meth:`request` returns or raises; ``timeout_s`` counts from
        now), so a caller can send to several sandboxes before it waits for any. Raises
        ValueError / TypeError (``fields`` not JSON-encodable) and SandboxLost (the
        connection is dead) at once. A field given as a :class:`.state_text.JsonText`
        (megabytes of base64) is spliced into the frame as it is; a field ``attached``
        (a list of bytes) goes after the frame's JSON as its attachments (the runner's
        ``attached.py``: only requests whose handler reads them may carry them)."""
        request_id = next(self._ids)
        raw: dict[str, bytes] = {name: value for name, value in fields.items() if type(value) is JsonText}
        attached = fields.pop("attached", None)
        if attached is not None:
            frame = encode_attached({"id": request_id, "op": op, **fields}, cast("list[bytes]", attached))
        elif raw:
            message = {name: value for name, value in fields.items() if type(value) is not JsonText}
            frame = protocol.encode_raw({"id": request_id, "op": op, **message}, raw)
        else:
            frame = protocol.encode({"id": request_id, "op": op, **fields})
        waiting = _Waiter()
        with self._state_lock:
            if self._dead is not None:
                raise SandboxLost(f"sandbox {self.sandbox_id} is gone: {self._dead}", self.sandbox_id)
            self._pending[request_id] = waiting
        try:
            with self._send_lock:
                self._sock.sendall(frame)
        except OSError as exc:
            self._fail(f"send failed: {exc}")
        return PendingReply(self, waiting, request_id, op, timeout_s, time.monotonic() + timeout_s)

    def _wait(self, waiting: _Waiter, deadline: float, spin_until: float = 0.0) -> bool:
        """Wait until ``waiting`` is set or ``deadline`` (``time.monotonic()`` seconds)
        passes, reading the socket whenever nobody else does; whether it was set."""
        while True:
            with self._state_lock:
                if waiting.done:
                    return True
                if self._reader is None:
                    self._reader = waiting
                lead = self._reader is waiting  # also when the reading was handed to it
                if not lead and not waiting.following:
                    waiting.following = True
                    self._followers.append(waiting)
            if lead:
                self._lead(waiting, deadline, spin_until)
                return waiting.done
            woken = waiting.sleep(deadline - time.monotonic())
            with self._state_lock:
                if woken:
                    waiting.rearm()
                    continue  # set, or handed the reading
                if waiting.following:
                    waiting.following = False
                    self._followers.remove(waiting)
                if self._reader is waiting:  # handed the reading as it gave up
                    self._reader = None
                    self._hand_on()
                return waiting.done

    def _lead(self, reader: _Waiter, deadline: float, spin_until: float = 0.0) -> None:
        """As the channel's reader (``self._reader is reader``): read until ``reader`` is
        set or ``deadline`` passes (polling without sleeping until ``spin_until``), then
        hand the reading on."""
        try:
            self._read(reader, deadline, spin_until)
        finally:
            with self._state_lock:
                self._reader = None
                self._hand_on()

    def _hand_on(self) -> None:
        """Give the reading to the first follower still waiting (state lock held)."""
        while self._followers:
            follower = self._followers.pop(0)
            follower.following = False
            if not follower.done:
                self._reader = follower
                follower.wake()
                return

    def _read(self, reader: _Waiter, deadline: float, spin_until: float = 0.0) -> None:
        """Read and hand out frames until ``reader`` is set or ``deadline`` passes (what
        has arrived by then is still read); before its first sleep in ``poll``, poll
        without sleeping until the socket is readable or ``spin_until`` passes
        (:meth:`_spin`; 0: not at all). The end of the stream, a socket error or a
        malformed frame fails the channel."""
        while not reader.done:
            if spin_until:
                self._spin(min(spin_until, deadline))
                spin_until = 0.0
            remaining = deadline - time.monotonic()
            timeout_ms = None if remaining == math.inf else min(max(0.0, remaining) * 1000, _POLL_MAX_MS)
            if self._dead is not None:
                return
            if not self._readable.poll(timeout_ms):
                if time.monotonic() >= deadline:
                    return
                continue  # a wait longer than poll takes at once
            data = protocol.recv_ready(self._sock)
            if data is None:
                continue
            if not data:
                self._fail("the runner closed the connection (or it failed)")
                return
            try:
                messages = self._frames.feed(data)
            except protocol.ProtocolViolation as exc:
                self._deliver(exc.messages)
                log.warning("sandbox %s: protocol violation: %s", self.sandbox_id, exc)
                self._fail(f"protocol violation: {exc}")
                return
            self._deliver(messages)

    def _spin(self, until: float) -> None:
        """Poll the socket without sleeping until it is readable or ``until``
        (``time.monotonic()`` seconds) passes. A thread asleep in ``poll`` is woken by
        the runner's reply through the scheduler, and on a virtual machine that wake-up
        (an inter-processor interrupt, a context switch) can cost more than the call
        took; a thread that keeps polling reads the reply as it lands, for the CPU it
        burns meanwhile. Each ``poll(0)`` releases the GIL."""
        poll, clock = self._readable.poll, time.monotonic
        while not poll(0) and clock() < until:
            pass

    def _deliver(self, messages: list[dict[str, Any]]) -> None:
        """Hand each reply to its caller, gathering parts. Frames nobody waits for (an
        unsolicited id, or a caller that gave up) are dropped."""
        with self._state_lock:
            for message in messages:
                request_id = message.get("id")
                if type(request_id) is not int or request_id not in self._pending:
                    continue
                if message.get("part") is True:
                    self._parts.setdefault(request_id, []).append(message)
                    continue
                waiting = self._pending.pop(request_id)
                parts = self._parts.pop(request_id, None)
                if parts is not None:
                    message["parts"] = parts
                waiting.message, waiting.done = message, True
                if waiting is not self._reader:
                    waiting.wake()

    def _fail(self, reason: str) -> None:
        with self._state_lock:
            if self._dead is None:
                self._dead = reason
            pending, self._pending = self._pending, {}
            self._parts = {}
            for waiting in [*pending.values(), *self._followers]:
                if not waiting.done:
                    waiting.error = SandboxLost(f"sandbox {self.sandbox_id} lost: {reason}", self.sandbox_id)
                    waiting.done = True
                waiting.wake()

    def _watch(self) -> None:
        """The watcher thread: until the channel is dead, sleep in ``poll`` for a hang-up,
        then read to the end of the stream as the reader (which fails the channel); every
        CHANNEL_WATCH_S, read what has arrived if requests are pending and nobody reads."""
        hang_up = select.poll()
        hang_up.register(self._sock.fileno(), select.POLLRDHUP)
        watcher = _Waiter()  # never in the pending table: only the channel's failure sets it
        while self._dead is None:
            if hang_up.poll(CHANNEL_WATCH_S * 1000):
                self._wait(watcher, math.inf)
                return
            if self._pending:  # a deadline of now: reads what is there if nobody reads, else leaves at once
                self._wait(watcher, time.monotonic())

    def close(self) -> None:
        """Close the connection; pending and later requests fail with SandboxLost."""
        self._fail("closed by host")
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class PendingReply:
    """A request sent on a :class:`RunnerChannel` (:meth:`RunnerChannel.submit`): call it
    to wait for the reply, or ask :meth:`answered` first whether it is there within a
    short wait (a caller that may not block long, such as an event loop, waits a little
    and otherwise hands the call to a thread that calls it)."""

    __slots__ = ("_channel", "_waiting", "_id", "_op", "_timeout_s", "_deadline")

    def __init__(self, channel: RunnerChannel, waiting: _Waiter, request_id: int, op: str, timeout_s: float,
                 deadline: float) -> None:
        self._channel = channel
        self._waiting = waiting
        self._id = request_id
        self._op = op
        self._timeout_s = timeout_s
        self._deadline = deadline

    def answered(self, wait_s: float, spin_s: float = 0.0) -> bool:
        """Wait up to ``wait_s`` seconds (never past the request's deadline) for the
        reply, reading the socket meanwhile when nobody else does; True when a reply
        frame has come (calling then returns it at once). False also when the channel
        failed: calling then raises SandboxLost. The request stays pending either way.

        ``spin_s``: for the first ``spin_s`` seconds of that wait (at most ``wait_s``), a
        caller that is the channel's reader polls the socket without sleeping
        (:meth:`RunnerChannel._spin`), so a reply that comes meanwhile is read without
        the wake-up of a sleeping thread; it costs this thread's CPU for as long as it
        spins. A caller that is not the reader sleeps as without it."""
        waiting = self._waiting
        if not waiting.done:
            now = time.monotonic()
            spin_until = now + min(spin_s, wait_s) if spin_s > 0 else 0.0
            self._channel._wait(waiting, min(now + wait_s, self._deadline), spin_until)
        return waiting.done and waiting.error is None

    def __call__(self) -> dict[str, Any]:
        """Wait for the reply until the request's deadline and return it. Raises
        SandboxLost: the connection is dead (``crashed``) or no reply came within the
        request's ``timeout_s`` (``timeout``)."""
        waiting, channel = self._waiting, self._channel
        if not waiting.done and not channel._wait(waiting, self._deadline):
            with channel._state_lock:
                channel._pending.pop(self._id, None)
                channel._parts.pop(self._id, None)
                late = waiting.done  # set as its deadline passed: still its reply
            if not late:
                raise SandboxLost(f"sandbox {channel.sandbox_id} did not answer {self._op!r} within "
                                  f"{self._timeout_s:.1f} s", channel.sandbox_id, status="timeout")
        if waiting.error is not None:
            raise waiting.error
        assert waiting.message is not None
        return waiting.message
