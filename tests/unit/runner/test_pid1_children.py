"""PID 1's process table (``pid1_children``): capped output buffers and the non-blocking
reads of a child's output streams, on real socket streams (a peer that writes, stays
silent, or goes away)."""

from __future__ import annotations

import os
import socket
import time

from sandpit.sandbox_images.runner import pid1_children


def test_output_keeps_the_cap_and_counts_the_rest() -> None:
    out = pid1_children.Output(5)
    out.add(b"abc")
    out.add(b"defgh")
    out.add(b"ij")
    assert (bytes(out.data), out.dropped) == (b"abcde", 5)
    assert out.text() == "abcde" and out.text(marker=True) == "abcde\n...[5 bytes dropped]"
    out.reset()
    assert (out.text(), out.dropped) == ("", 0)
    assert pid1_children.Output(0).text() == ""




def test_a_stream_reads_what_is_there_then_nothing_then_its_end() -> None:
    ours, theirs = pid1_children.stream()
    try:
        os.set_blocking(ours, False)
        assert pid1_children.read_once(ours) is None  # nothing yet: not the end
        os.write(theirs, b"x" * 200_000)
        out = pid1_children.Output(1000)
        pid1_children.drain(ours, out, max_reads=1)
        assert len(out.data) == 1000 and out.dropped == pid1_children.READ_SIZE - 1000  # one read only
        pid1_children.drain(ours, out)  # the rest, until nothing is there
        assert len(out.data) + out.dropped == 200_000
        os.write(theirs, b"gone")
        os.close(theirs)
        theirs = -1
        pid1_children.drain(ours, None)  # discarded
        assert pid1_children.read_once(ours) == b""  # the writer closed it: the end
    finally:
        os.close(ours)
        if theirs >= 0:
            os.close(theirs)


def test_a_stream_is_one_way_and_a_closed_descriptor_reads_as_its_end() -> None:
    ours, theirs = pid1_children.stream()
    with socket.socket(fileno=ours) as reader, socket.socket(fileno=theirs) as writer:
        try:
            reader.send(b"back")  # PID 1's end cannot write into the child's stream
        except OSError:
            pass
        else:
            raise AssertionError("the read end accepted a write")
        writer.setblocking(False)
        try:
            data = writer.recv(10)  # nor can the child read what PID 1 never sent
        except BlockingIOError:
            data = None
        assert not data
    assert pid1_children.read_once(ours) == b""  # closed: EBADF counts as the end


def test_signal_and_exit_descriptions() -> None:
    assert pid1_children.describe_exit(9) == "killed by signal SIGKILL"
    assert pid1_children.describe_exit(3 << 8) == "exited with status 3"
    assert pid1_children.signal_name(200) == "200"


def test_schedstat_of_a_live_process_and_of_none() -> None:
    fd = pid1_children.open_sched(os.getpid())
    assert fd >= 0
    try:
        first = pid1_children.read_sched(fd)
        assert first is not None and first[0] >= 0 and first[1] >= 0
        started = time.thread_time()
        while time.thread_time() - started < 0.02:  # 20 ms of CPU: longer than a scheduler tick
            sum(range(10_000))
        time.sleep(0.001)  # the kernel folds a running task's time into schedstat when it switches out
        second = pid1_children.read_sched(fd)  # the same descriptor, read again from offset 0
        assert second is not None and second[0] > first[0] and second[1] >= first[1]
    finally:
        os.close(fd)
    assert pid1_children.read_sched(fd) is None  # closed
    assert pid1_children.open_sched(2**22 + 12345) == -1  # no such process
    assert pid1_children.read_sched(-1) is None
