"""The host end of the runner protocol (``sandpit.executor.pool.channel``) over a real
socket pair, the runner's end played by this test with the protocol's own frames:
replies matched by id whatever their order, parts gathered, the watchdog's timeout, a late
reply after it, a runner that closes or sends garbage, and a reply read twice."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.executor.errors import SandboxLost
from sandpit.executor.pool.channel import RunnerChannel
from sandpit.sandbox_images.runner import protocol

MAX_FRAME = 1 << 20


@pytest.fixture
def pair() -> Iterator[tuple[RunnerChannel, socket.socket]]:
    host, runner = socket.socketpair()
    channel = RunnerChannel(host, "sb-test", MAX_FRAME)
    yield channel, runner
    channel.close()
    runner.close()


def read_request(runner: socket.socket) -> dict[str, Any]:
    return protocol.recv_frame(runner, MAX_FRAME)


def test_replies_reach_their_callers_in_any_order(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    first = channel.submit("call", 5, name="a")
    second = channel.submit("call", 5, name="b")
    requests = [read_request(runner), read_request(runner)]
    assert [r["op"] for r in requests] == ["call", "call"]
    for request in reversed(requests):
        runner.sendall(protocol.encode({"id": request["id"], "status": "ok", "value": request["name"]}))
    assert second()["value"] == "b"
    assert first()["value"] == "a"


def test_a_reply_read_twice_is_the_same(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    reply = channel.submit("ping", 5)
    request = read_request(runner)
    runner.sendall(protocol.encode({"id": request["id"], "status": "ok"}))
    assert reply() == reply() == {"id": request["id"], "status": "ok"}


def test_parts_come_with_the_last_frame(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    reply = channel.submit("calls", 5)
    request = read_request(runner)
    for i in range(3):
        runner.sendall(protocol.encode({"id": request["id"], "part": True, "n": i}))
    runner.sendall(protocol.encode({"id": request["id"], "status": "ok"}))
    message = reply()
    assert [p["n"] for p in message["parts"]] == [0, 1, 2]


def test_a_concurrent_caller_is_woken_by_its_own_reply(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    got: list[dict[str, Any]] = []
    reply = channel.submit("slow", 5)
    waiter = threading.Thread(target=lambda: got.append(reply()))
    waiter.start()
    request = read_request(runner)
    time.sleep(0.05)
    assert not got, "nothing before the reply"
    runner.sendall(protocol.encode({"id": request["id"], "status": "ok"}))
    waiter.join(5)
    assert got == [{"id": request["id"], "status": "ok"}]


def test_no_reply_in_time_is_a_timeout_and_a_late_reply_is_dropped(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    reply = channel.submit("spin", 0.05)
    request = read_request(runner)
    started = time.monotonic()
    with pytest.raises(SandboxLost) as lost:
        reply()
    assert lost.value.status == "timeout"
    assert time.monotonic() - started < 2
    runner.sendall(protocol.encode({"id": request["id"], "status": "ok"}))  # too late: nobody waits
    runner.sendall(protocol.encode({"id": 999, "status": "ok"}))  # unsolicited
    again = channel.submit("ping", 5)
    request = read_request(runner)
    runner.sendall(protocol.encode({"id": request["id"], "status": "ok", "after": True}))
    assert again()["after"] is True
    assert channel.alive


def test_a_runner_that_closes_fails_every_waiter_and_later_requests(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    replies = [channel.submit("call", 5) for _ in range(3)]
    runner.close()
    for reply in replies:
        with pytest.raises(SandboxLost) as lost:
            reply()
        assert lost.value.status == "crashed"
    with pytest.raises(SandboxLost):
        channel.submit("call", 5)
    assert not channel.alive


@pytest.mark.parametrize("garbage", [b"\x00\x00\x00\x05{bad}", b"\xff\xff\xff\xff" + b"x" * 16,
                                     b"\x00\x00\x00\x02[]"])
def test_garbage_from_the_runner_kills_the_channel(pair: tuple[RunnerChannel, socket.socket], garbage: bytes) -> None:
    channel, runner = pair
    reply = channel.submit("call", 5)
    runner.sendall(garbage)
    with pytest.raises(SandboxLost) as lost:
        reply()
    assert lost.value.status == "crashed"
    assert not channel.alive


def test_close_fails_what_waits(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, _ = pair
    reply = channel.submit("call", 5)
    channel.close()
    with pytest.raises(SandboxLost):
        reply()
