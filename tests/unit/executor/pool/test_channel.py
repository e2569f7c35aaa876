"""The host end of the runner protocol (``sandpit.executor.pool.channel``) over a real
socket pair, the runner's end played by this test with the protocol's own frames:
replies matched by id whatever their order, parts gathered, the watchdog's timeout, a late
reply after it, a runner that closes or sends garbage, a reply read twice; and the
callers' own reading (leader/follower): many callers on threads with some giving up, a
runner that stalls mid-frame, a reply sent before its caller waits, a hang-up while idle,
and the watcher thread's end; a short wait for a reply (``answered``) that leaves the
request pending, never waits past its deadline, and hands the reading on to a thread
that waits on."""

from __future__ import annotations

import base64
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sandpit.executor.errors import SandboxLost
from sandpit.executor.pool.channel import RunnerChannel
from sandpit.executor.pool.state_text import b64_member
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


DEEP = b'{"a":' + b"[" * 300 + b"]" * 300 + b"}"


@pytest.mark.parametrize("garbage", [b"\x00\x00\x00\x05{bad}", b"\xff\xff\xff\xff" + b"x" * 16,
                                     b"\x00\x00\x00\x02[]", len(DEEP).to_bytes(4, "big") + DEEP])
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


def test_many_callers_on_threads_each_get_their_own_reply(pair: tuple[RunnerChannel, socket.socket]) -> None:
    """16 threads x 30 requests; the runner answers in shuffled batches, sends parts and
    unsolicited frames, and never answers ``drop`` requests, whose callers give up after
    0.2 s while others wait: every answered caller gets its own reply, nobody waits for a
    reading that nobody does, and the channel stays alive."""
    channel, runner = pair
    stop = threading.Event()

    def serve() -> None:
        rng = random.Random(7)  # noqa: S311 - a reply order, not a secret
        held: list[dict[str, Any]] = []
        runner.settimeout(0.02)
        while not stop.is_set():
            try:
                held.append(read_request(runner))
                if len(held) < 5:
                    continue
            except (TimeoutError, EOFError, OSError):
                pass
            rng.shuffle(held)
            out = b""
            for request in held:
                if request["op"] == "drop":
                    continue
                out += protocol.encode({"id": request["id"] + 1_000_000, "status": "ok"})  # unsolicited
                out += protocol.encode({"id": request["id"], "part": True, "n": request["n"]})
                out += protocol.encode({"id": request["id"], "status": "ok", "n": request["n"]})
            held = []
            if out:
                runner.sendall(out)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    errors: list[str] = []

    def caller(k: int) -> None:
        for i in range(30):
            n = k * 1000 + i
            try:
                if i % 15 == 7:
                    with pytest.raises(SandboxLost) as lost:
                        channel.request("drop", 0.2, n=n)
                    assert lost.value.status == "timeout"
                    continue
                reply = channel.request("call", 10, n=n)
                assert reply["n"] == n and [p["n"] for p in reply["parts"]] == [n]
            except BaseException as exc:  # noqa: BLE001 - gathered, asserted below
                errors.append(f"caller {k}, request {i}: {exc!r}")
                return

    callers = [threading.Thread(target=caller, args=(k,)) for k in range(16)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(60)
    stop.set()
    server.join(5)
    assert errors == []
    assert channel.alive


def test_a_runner_that_stalls_mid_frame_times_out_its_caller_and_the_stream_goes_on(
        pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    first = channel.submit("spin", 0.2)
    request = read_request(runner)
    frame = protocol.encode({"id": request["id"], "status": "ok"})
    runner.sendall(frame[:5])  # the header and one byte of the body
    started = time.monotonic()
    with pytest.raises(SandboxLost) as lost:
        first()
    assert lost.value.status == "timeout"
    assert time.monotonic() - started < 2, "the caller waited past its deadline for the rest of the frame"
    second = channel.submit("ping", 5)
    again = read_request(runner)
    runner.sendall(frame[5:] + protocol.encode({"id": again["id"], "status": "ok", "n": 2}))
    assert second()["n"] == 2
    assert channel.alive


def test_a_large_reply_sent_before_its_caller_waits_does_not_block_the_runner(
        pair: tuple[RunnerChannel, socket.socket]) -> None:
    """A reply four times the socket's buffer, sent while its caller has not started
    waiting (a batched step waits on its sandboxes one by one): the watcher reads it, so
    the runner's send ends; the caller then finds it."""
    channel, runner = pair
    reply = channel.submit("snapshot", 30)
    request = read_request(runner)
    blob = "x" * (900 * 1024)
    sent = threading.Event()

    def send() -> None:
        runner.sendall(protocol.encode({"id": request["id"], "status": "ok", "blob": blob}))
        sent.set()

    threading.Thread(target=send, daemon=True).start()
    assert sent.wait(10), "the runner stayed blocked on a reply nobody waited for"
    assert reply()["blob"] == blob


def watchers(sandbox_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"sandpit-chan-{sandbox_id}"]


def eventually(condition: Callable[[], bool], within_s: float = 5) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_an_idle_channel_is_dead_once_the_runner_hangs_up() -> None:
    host, runner = socket.socketpair()
    channel = RunnerChannel(host, "sb-idle", MAX_FRAME)
    assert channel.alive and watchers("sb-idle")
    runner.close()
    assert eventually(lambda: not channel.alive), "nobody noticed the hang-up of an idle channel"
    with pytest.raises(SandboxLost):
        channel.submit("ping", 5)
    assert eventually(lambda: not watchers("sb-idle"))
    channel.close()


def test_close_ends_the_watcher_thread() -> None:
    host, runner = socket.socketpair()
    channel = RunnerChannel(host, "sb-close", MAX_FRAME)
    assert watchers("sb-close")
    channel.close()
    assert eventually(lambda: not watchers("sb-close"))
    assert not channel.alive
    runner.close()


def test_a_hang_up_while_a_caller_reads_fails_the_caller_and_ends_the_watcher() -> None:
    host, runner = socket.socketpair()
    channel = RunnerChannel(host, "sb-hangup", MAX_FRAME)
    uncaught: list[threading.ExceptHookArgs] = []
    previous, threading.excepthook = threading.excepthook, uncaught.append
    try:
        reply = channel.submit("call", 10)
        statuses: list[str] = []

        def wait() -> None:
            try:
                reply()
            except SandboxLost as exc:
                statuses.append(exc.status)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.1)  # the caller reads the socket by now
        runner.close()
        waiter.join(5)
        assert statuses == ["crashed"]
        assert eventually(lambda: not watchers("sb-hangup"))
    finally:
        threading.excepthook = previous
        channel.close()
    assert [repr(args.exc_value) for args in uncaught] == []


def test_timeouts_longer_than_poll_and_locks_take_still_wait_for_the_reply(
        pair: tuple[RunnerChannel, socket.socket]) -> None:
    """1e10 s is past both poll(2)'s int of milliseconds and ``threading.TIMEOUT_MAX``:
    the reader and a follower (two callers at once) both get their replies."""
    channel, runner = pair
    replies = [channel.submit("call", 1e10, n=n) for n in range(2)]
    got: list[int] = []
    waiters = [threading.Thread(target=lambda r=r: got.append(r()["n"])) for r in replies]
    for thread in waiters:
        thread.start()
    time.sleep(0.05)
    for _ in range(2):
        request = read_request(runner)
        runner.sendall(protocol.encode({"id": request["id"], "status": "ok", "n": request["n"]}))
    for thread in waiters:
        thread.join(5)
    assert sorted(got) == [0, 1]


def test_a_short_wait_for_a_reply_leaves_it_pending(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    reply = channel.submit("call", 5, name="a")
    request = read_request(runner)
    started = time.monotonic()
    assert not reply.answered(0.05)
    assert 0.04 < time.monotonic() - started < 1
    runner.sendall(protocol.encode({"id": request["id"], "status": "ok", "value": "a"}))
    assert reply.answered(5) and reply.answered(0)
    assert reply()["value"] == "a"


def test_a_reply_not_answered_in_a_short_wait_comes_to_a_thread_that_waits_on(
        pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    other = channel.submit("call", 5, name="other")
    mine = channel.submit("call", 5, name="mine")
    requests = {r["name"]: r for r in (read_request(runner), read_request(runner))}
    assert not mine.answered(0.01)  # it read the socket meanwhile, then gave the reading up
    got: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: got.append(mine()))
    waiter.start()
    time.sleep(0.05)
    runner.sendall(protocol.encode({"id": requests["other"]["id"], "status": "ok", "value": "other"}))
    runner.sendall(protocol.encode({"id": requests["mine"]["id"], "status": "ok", "value": "mine"}))
    waiter.join(5)
    assert got and got[0]["value"] == "mine"
    assert other.answered(0) and other()["value"] == "other"


def test_a_short_wait_stops_at_the_deadline_and_at_a_lost_runner(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    late = channel.submit("spin", 0.05)
    read_request(runner)
    started = time.monotonic()
    assert not late.answered(10)
    assert time.monotonic() - started < 2
    with pytest.raises(SandboxLost) as timed_out:
        late()
    assert timed_out.value.status == "timeout"
    lost = channel.submit("call", 5)
    read_request(runner)
    runner.close()
    assert not lost.answered(5)  # the channel failed: no reply, and calling raises
    with pytest.raises(SandboxLost):
        lost()


def test_a_spinning_wait_reads_a_reply_that_comes_while_it_polls(pair: tuple[RunnerChannel, socket.socket]) -> None:
    """``answered(wait_s, spin_s)``: the reader polls without sleeping for ``spin_s`` and
    takes a reply that lands meanwhile; the frames around it reach their own callers."""
    channel, runner = pair
    other = channel.submit("call", 5, name="other")
    mine = channel.submit("call", 5, name="mine")
    requests = {r["name"]: r for r in (read_request(runner), read_request(runner))}

    def answer() -> None:
        time.sleep(0.02)
        runner.sendall(protocol.encode({"id": requests["other"]["id"], "status": "ok", "value": "other"}))
        time.sleep(0.02)
        runner.sendall(protocol.encode({"id": requests["mine"]["id"], "status": "ok", "value": "mine"}))

    answerer = threading.Thread(target=answer)
    answerer.start()
    try:
        assert mine.answered(10, spin_s=10)  # the spin, bounded by the wait, outlasts both replies
    finally:
        answerer.join(5)
    assert mine()["value"] == "mine"
    assert other.answered(0) and other()["value"] == "other"


def test_a_spin_is_bounded_by_its_own_length_and_by_the_wait(pair: tuple[RunnerChannel, socket.socket]) -> None:
    """With no reply, a wait returns False at its end whatever ``spin_s`` says, and the
    thread's CPU time is at most the spin's length (a small margin for the rest): the
    spin never runs past ``spin_s`` or past ``wait_s``; without one the wait sleeps."""
    channel, runner = pair
    reply = channel.submit("call", 30, name="a")
    request = read_request(runner)
    for wait_s, spin_s in ((0.2, 0.05), (0.05, 30.0), (0.2, 0.0), (0.1, -1.0)):
        cpu, started = time.thread_time(), time.monotonic()
        assert not reply.answered(wait_s, spin_s)
        elapsed, spun = time.monotonic() - started, time.thread_time() - cpu
        assert wait_s * 0.8 < elapsed < wait_s + 1.0, (wait_s, spin_s, elapsed)
        assert spun < max(min(spin_s, wait_s), 0.0) + 0.03, (wait_s, spin_s, spun)
    runner.sendall(protocol.encode({"id": request["id"], "status": "ok", "value": "a"}))
    assert reply.answered(5, spin_s=5) and reply()["value"] == "a"


def test_a_spinning_wait_sees_a_lost_runner(pair: tuple[RunnerChannel, socket.socket]) -> None:
    """The runner hanging up while the reader spins fails the channel at once: no reply,
    and calling raises SandboxLost."""
    channel, runner = pair
    lost = channel.submit("call", 30)
    read_request(runner)
    threading.Timer(0.02, runner.close).start()
    started = time.monotonic()
    assert not lost.answered(10, spin_s=10)
    assert time.monotonic() - started < 5
    with pytest.raises(SandboxLost):
        lost()


def test_a_json_text_field_is_spliced_into_the_frame_as_it_is(pair: tuple[RunnerChannel, socket.socket]) -> None:
    channel, runner = pair
    reply = channel.submit("restore", 5, session="s", snapshot_b64=b64_member(b'{"a":["j",1]}'), seed=None)
    request = read_request(runner)
    assert request == {"id": request["id"], "op": "restore", "session": "s", "seed": None,
                       "snapshot_b64": base64.b64encode(b'{"a":["j",1]}').decode("ascii")}
    runner.sendall(protocol.encode({"id": request["id"], "status": "ok"}))
    assert reply()["status"] == "ok"
    with pytest.raises(TypeError):  # bytes that are not a JsonText are refused as before
        channel.submit("restore", 5, snapshot_b64=b'"e30="')
