"""An asyncio load generator for many stepping clients: one keep-alive HTTP/1.1 connection
per client, all in one thread of the benchmark's process.

A thread per client (``http.client`` under ``RawClient``) costs this process a thread
switch, a GIL hand-over and a Python-level HTTP parser per request, and a thousand such
threads on the machine's cores compete with the server they measure. Here each client is a
coroutine: a step is one ``write`` of a request built from prepared bytes and one read of
the reply (status line, headers, a ``Content-Length`` or chunked body). The clients of a
real deployment are other machines; this keeps what they cost this one small.

:func:`run_spread` drives clients that step, wait a think time (:func:`pauses`), and step
again until a deadline (client ``i`` starts at ``offsets[i]``); :func:`run_burst` has every client step
once at the same instant. Both return, per step, ``(start, ms, reply, error, server_ms)``:
``ms`` and ``reply`` (the parsed JSON) for a ``200`` answered ``ok``, else ``ms`` None and
``error`` saying what went wrong (a broken connection is re-opened at the client's next
step); ``server_ms`` is the ``total`` of the reply's ``Server-Timing`` (the server's own time
for the step: :func:`server_total_ms`), None when it has none.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

Step = tuple[float, float | None, dict[str, Any], str, float | None]
"""``(perf_counter at the start, ms or None, reply JSON or {}, error or "", the server's
own ms or None)``."""


def server_total_ms(value: str | None) -> float | None:
    """The ``total`` of a ``Server-Timing`` header value (milliseconds: the server's time
    for a step, from its body read to its reply ready), or None when ``value`` is None or
    names no well-formed ``total``."""
    for entry in (value or "").split(","):
        name, _, params = entry.strip().partition(";")
        if name.strip() == "total":
            for param in params.split(";"):
                key, _, number = param.strip().partition("=")
                if key == "dur":
                    try:
                        return float(number)
                    except ValueError:
                        return None
    return None


def pauses(think_s: float, jitter: float, seed: int) -> Iterator[float]:
    """One client's think times between its steps (seconds), endless: ``think_s`` each when
    ``jitter`` is 0, else drawn uniformly from ``[think_s * (1 - jitter), think_s * (1 +
    jitter)]`` (mean ``think_s``) by a generator seeded with ``seed``, so a run draws the
    same pauses again. An agent's model takes a varying time to answer; with one fixed
    pause, clients that a single stall delayed together stay in step for the rest of the
    run and arrive as a burst every think time. Raises ValueError (``jitter`` outside [0, 1)
    or ``think_s`` negative)."""
    if not 0 <= jitter < 1 or think_s < 0:
        raise ValueError(f"think time {think_s} s with jitter {jitter}: want think_s >= 0 and 0 <= jitter < 1")
    draw = random.Random(seed)  # noqa: S311 - load timing, not security
    while True:
        yield think_s * (1 + jitter * (2 * draw.random() - 1)) if jitter else think_s


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status code and the headers (names lower-cased, the last of a repeated one) of
    an HTTP/1.1 reply's head, without its blank line. Raises ValueError (IndexError) on a
    malformed status line."""
    lines = head.decode("latin-1").split("\r\n")
    code = int(lines[0].split(" ", 2)[1])
    return code, {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}


class Stepper:
    """Prepared request bytes for ``bump`` steps on the server at ``url`` (``http://host:port``)
    as the tenant of ``api_key``."""

    def __init__(self, url: str, api_key: str, body: dict[str, Any] | None = None) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        payload = json.dumps(body or {"name": "bump", "arguments": {}}).encode()
        self._tail = (f"HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Bearer {api_key}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload

    def request(self, env_id: str) -> bytes:
        """The bytes of one step request on ``env_id``."""
        return b"POST /v1/envs/" + env_id.encode() + b"/step " + self._tail

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new keep-alive connection."""
        return await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    async def step(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                   env_id: str) -> tuple[int, dict[str, str], bytes]:
        """One step over ``conn``: ``(status code, headers as parse_head gives them, body
        bytes)``. Raises OSError, asyncio.IncompleteReadError, ValueError (a malformed reply)."""
        reader, writer = conn
        writer.write(self.request(env_id))
        head = await reader.readuntil(b"\r\n\r\n")
        code, headers = parse_head(head[:-4])
        if "content-length" in headers:
            return code, headers, await reader.readexactly(int(headers["content-length"]))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    return code, headers, bytes(body)
                body += chunk[:-2]
        raise ValueError(f"reply {code} without a length")


async def _timed(stepper: Stepper, state: dict[str, Any], env_id: str) -> Step:
    """One step of a client whose connection is ``state["conn"]`` (opened when None)."""
    begun = time.perf_counter()
    try:
        if state.get("conn") is None:
            state["conn"] = await stepper.connect()
        code, headers, raw = await stepper.step(state["conn"], env_id)
        reply = json.loads(raw)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        conn, state["conn"] = state.get("conn"), None
        if conn is not None:
            conn[1].close()
        return begun, None, {}, repr(exc)[:200], None
    if code != 200 or reply.get("status") != "ok":
        return begun, None, reply if isinstance(reply, dict) else {}, f"{code}: {str(reply)[:200]}", None
    return begun, (time.perf_counter() - begun) * 1000, reply, "", server_total_ms(headers.get("server-timing"))


def _close(states: list[dict[str, Any]]) -> None:
    for state in states:
        if state.get("conn") is not None:
            state["conn"][1].close()
            state["conn"] = None


def run_spread(stepper: Stepper, env_ids: list[str], offsets: list[float], think_s: float,
               seconds: float, jitter: float = 0.0) -> list[Step]:
    """Each of ``env_ids`` is a client: it waits its offset (seconds), then steps, waits a
    think time (:func:`pauses` of ``think_s`` and ``jitter``, seeded with the client's
    index) and steps again until ``seconds`` have passed since the call. Returns every
    step (module docstring), in no particular order. Raises ValueError (:func:`pauses`)."""
    async def main() -> list[Step]:
        stop_at = time.perf_counter() + seconds
        states: list[dict[str, Any]] = [{} for _ in env_ids]

        async def client(index: int) -> list[Step]:
            steps: list[Step] = []
            think = pauses(think_s, jitter, index)
            await asyncio.sleep(offsets[index])
            while time.perf_counter() < stop_at:
                steps.append(await _timed(stepper, states[index], env_ids[index]))
                if think_s:
                    await asyncio.sleep(next(think))
            return steps

        try:
            done = await asyncio.gather(*(client(index) for index in range(len(env_ids))))
        finally:
            _close(states)
        return [step for steps in done for step in steps]

    return asyncio.run(main())


def run_burst(stepper: Stepper, env_ids: list[str]) -> list[Step]:
    """Every one of ``env_ids`` steps once, all sent at the same instant (connections
    opened first). Returns the steps (module docstring), in the order of ``env_ids``."""
    async def main() -> list[Step]:
        states: list[dict[str, Any]] = [{} for _ in env_ids]
        try:
            for state in states:
                state["conn"] = await stepper.connect()
            return list(await asyncio.gather(*(_timed(stepper, state, env_id)
                                               for state, env_id in zip(states, env_ids, strict=True))))
        finally:
            _close(states)

    return asyncio.run(main())
