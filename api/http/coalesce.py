"""One socket write per response: uvicorn's HTTP protocol over a transport that joins a
held write with the next one (:class:`CoalescingTransport`).

uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start`` and its body at ``http.response.body``: two ``send`` system calls
for every small response, and on loopback two wake-ups of the client, the first for a head
it cannot use without the body. :class:`CoalescingHttpProtocol` is uvicorn's
``httptools`` protocol with its transport wrapped: a write is held, and the next write of
the same event-loop pass goes to the socket's transport joined to it (the head and body
of a response, one ``send``); a write no other follows in its pass goes out alone at the
start of the loop's next pass (``call_soon``), before the loop waits for I/O again.

Contract: the bytes reach the underlying transport in the order written, nothing is
dropped except by :meth:`~CoalescingTransport.abort`; ``close`` and ``write_eof`` first
hand over what is held; a write of :data:`FLUSH_BYTES` or more is not held; write-buffer
sizes count the held bytes, and flow control is the underlying transport's (it pauses
the protocol as it always did). Held bytes of a transport already closing are dropped,
as that transport would drop them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FLUSH_BYTES = 64 * 1024
"""Writes this large (bytes) go to the underlying transport at once, never held."""


class CoalescingTransport(asyncio.Transport):
    """``transport`` with a write held until the next write of the same event-loop pass
    (sent joined) or the loop's next pass (module docstring). Every other method is the
    underlying transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        held = self._held
        if held is not None:  # the second write of the pass: both go now, in one
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held + data)
            return
        if len(data) >= FLUSH_BYTES:
            self._transport.write(data)
            return
        self._held = bytes(data)
        self._loop.call_soon(self._flush)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def _flush(self) -> None:
        """Hand the held bytes to the underlying transport; a no-op when nothing is held
        (a second write of the pass took them)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)


class CoalescingHttpProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` HTTP/1.1 protocol writing through a
    :class:`CoalescingTransport` (``uvicorn.run(..., http=CoalescingHttpProtocol)``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))
