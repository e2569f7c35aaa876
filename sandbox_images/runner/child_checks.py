"""Check batches of a one-shot job process: EnvScaler's rule-based reward, one verdict per check.

Stdlib only. Runs inside a sandbox, in a job process (``child_oneshot.run_job`` hands a
``checks`` request here, in the job's work directory); its caps are in ``limits.py``.

``checks`` (``{workdir, initial_state, final_state, source?, checks: [{index,
check_func}]}``), EnvScaler's rule-based reward. The states are *encoded* states, restored
here as Python objects by ``child_restore.py`` (stand-ins by default; the environment's own
classes only for a scenario that opts in with ``source``).

This process (the *zygote*) restores both states once, then runs each check in a fresh
process of its own, forked from it: the check's ``initial_state`` global and its
``final_state`` argument are that process's private copy-on-write copies, and nothing a
check does (its modules, threads, files descriptors, tracers, patched builtins, frames it
walks) can reach another check, this process or the verdict of another check. The zygote
reads the check process's one result frame from a private pipe, kills the check's
process group, and forwards the result (re-validated) to the runner. One exception,
for speed (a fork's milliseconds of CPU are most of an evaluation): a check whose
source ``child_readonly`` proves read-only (it can change only objects it made and
reach only its states and harmless builtins) runs in the zygote itself, on the shared
states, when both states are plain data (no ``"p"`` entry, whose objects' classes could
run code). Such a check cannot change what another check sees, so the guarantee above
holds for it too; a read-only check that never returns is killed with the zygote, like
a forked one, and the next checks go on in a fresh zygote. For the same reason a zygote
in which only such checks ran (every check of its batch in place, none ``oom``, on
states restored without the environment's code) serves the runner's next batch instead
of exiting (``"stays": true`` in its last frame; ``child_oneshot.run_job``): the states
it restored are dropped, and the next batch's are restored afresh. One frame per check,
in order: ``{"id", "index", "status", "passed", "result", "error", "traceback",
"duration_ms"}`` (plus ``"signal"`` when the check process was
killed); after each, the zygote waits for the runner's go-ahead ``{"op": "next",
"index"}`` (so the runner attributes output to the right check, sweeps leftovers, and
times each check from its own start). Only ``True`` (a real bool) passes:

    status    passed  when
    ok        True    returned True
    ok        False   returned False (error None)
    error     False   raised (``Error: <Type>: <message>``, traceback), or returned a
                      non-bool (``returned int 1, not a bool``), or the state could not be
                      restored (``restoring the state failed: ...``)
    rejected  False   syntax error, or no callable ``check_func`` defined
    oom       False   MemoryError in the check
    crashed   False   the check process died without a result (``os._exit``, a signal;
                      the runner reports ``oom`` when the kernel's OOM killer did it)

Timeouts are seen by the runner, which kills this process group and goes on with the next
check in a fresh zygote. A check's verdict is what its own ``check_func`` returned in its
own process: a check can only ever change its own verdict, which it could do by returning
``True``. Frames go out through ``child_codec.py``'s encoder and the descriptors and
functions ``child_oneshot`` took before any check or environment code ran
(``send``, ``wait``).
"""


from __future__ import annotations

import builtins
import os
import sys
import time

from . import child_standins
from .child_codec import dumps as _json_text
from .child_codec import loads as _json_value
from .child_instance import flush_std
from .child_readonly import why_not_read_only
from .child_restore import ProcessState, StateError, decode_state
from .limits import (
    CHECK_RESULT_MAX_BYTES,
    ERROR_CHARS,
    FORK_RETRY_S,
    TRACEBACK_CHARS,
)
from .wire import bounded_repr, check_result, classify, error_observation

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any, TypeAlias

    Send: TypeAlias = Callable[[dict[str, Any]], None]
    """Sends one frame to PID 1 (``child_oneshot._Channel.send``)."""
    Wait: TypeAlias = Callable[[], "int | None"]

    from .wire import CheckFields
    """Waits for PID 1's go-ahead and returns the index it names (``child_oneshot._Channel.wait``)."""

# traceback and linecache are imported when an exception is reported (start-up cost).

CTRL_FD = 3
"""The control channel to PID 1 (``child_session.CTRL_FD``): a check's process closes it."""
CHECK_FILENAME = "<check_func>"
HEADER_SIZE = 4


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def bounded_traceback(exc: BaseException, skip: int = 0) -> str:
    """The traceback of ``exc`` without its first ``skip`` frames (ours), last 8 frames,
    at most ``TRACEBACK_CHARS`` characters (head and tail kept)."""
    import traceback

    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb, limit=-8))
    except Exception:  # noqa: BLE001 - a hostile exception's __str__
        text = f"{type(exc).__name__}: <unprintable>\n"
    if len(text) > TRACEBACK_CHARS:
        head = TRACEBACK_CHARS // 4
        text = (text[:head] + f"\n...[{len(text) - TRACEBACK_CHARS} characters cut]...\n"
                + text[-(TRACEBACK_CHARS - head):])
    return text


def syntax_error_text(exc: SyntaxError | ValueError) -> str:
    """``syntax error: <msg> (line N)`` for a source that does not compile (a NUL byte
    raises ValueError)."""
    if isinstance(exc, SyntaxError):
        where = f" (line {exc.lineno})" if exc.lineno else ""
        return f"syntax error: {exc.msg}{where}"[:ERROR_CHARS]
    return f"syntax error: {exc}"[:ERROR_CHARS]


def run_check(source: str, initial: object, final: object) -> dict[str, Any]:
    """Run one check on ``initial`` (the ``initial_state`` global) and ``final`` (the
    argument) in this process and return its result fields (without ``id``/``index``).
    ``MemoryError`` propagates: the caller reports it and exits."""
    started = time.perf_counter()
    out: dict[str, Any] = {"status": "ok", "passed": False, "result": None, "error": None, "traceback": None}
    try:
        code = compile(source, CHECK_FILENAME, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        out.update(status="rejected", error=syntax_error_text(exc))
        return _timed(out, started)
    namespace: dict[str, Any] = {"__name__": "check_func_module", "__builtins__": builtins, "initial_state": initial}
    try:
        exec(code, namespace)  # noqa: S102 - this is the sandbox
        check_func = namespace.get("check_func")
        if check_func is None:
            out.update(status="rejected", error="no check_func defined")
            return _timed(out, started)
        if not callable(check_func):
            out.update(status="rejected", error=f"check_func is a {type(check_func).__name__}, not a function")
            return _timed(out, started)
        value = check_func(final)
        out["result"] = bounded_repr(value)
        out["status"], out["passed"], out["error"] = classify(value)
    except MemoryError:
        raise
    except BaseException as exc:  # noqa: BLE001 - EnvScaler: an error is a failed check
        register_source(CHECK_FILENAME, source)
        out.update(status="error", passed=False, error=error_observation(exc, ERROR_CHARS),
                   traceback=bounded_traceback(exc, skip=1))
    return _timed(out, started)


def _timed(out: dict[str, Any], started: float) -> dict[str, Any]:
    out["duration_ms"] = (time.perf_counter() - started) * 1000.0
    return out


def register_source(filename: str, source: str) -> None:
    """Let tracebacks show the lines of ``source`` (compiled as ``filename``)."""
    try:
        import linecache

        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    except Exception:  # noqa: BLE001 - only decoration
        pass


def run_checks(msg: dict[str, Any], send: Send, wait: Wait, stay: bool = False) -> bool:
    """Serve one ``checks`` request as the zygote (module docstring): restore both states
    once, then one forked process per check (a read-only check on plain states runs
    here instead), each after the runner's go-ahead naming it
    (``{"op": "next", "index"}``), so what a check prints is all in the pipes before the
    next one starts. Returns when all are sent or the channel closes; exits after a
    ``MemoryError`` while restoring the states.

    Returns True, and says so in the last result's frame (``"stays": true``), when
    ``stay`` is given and every check ran in place and returned a result other than
    ``oom`` on states restored without the environment's code: no code but read-only
    checks ran in this process, so it may serve the next batch (``child_oneshot.run_job``)."""
    token = msg.get("id")
    sys.argv = ["check_func"]
    checks = {item["index"]: item["check_func"] for item in msg["checks"]}
    index = msg["checks"][0]["index"]
    source = msg.get("source")  # given only for a scenario's `check_objects: environment`
    objects = "environment" if source else "standins"
    plain = _plain_data(msg["initial_state"]) and _plain_data(msg["final_state"])
    state_error = None
    initial: dict[str, Any] | None
    final: dict[str, Any] | None
    saved = ProcessState() if objects == "environment" else None
    try:
        factory = child_standins.StandInFactory()
        untagged = msg.get("untagged") or ()
        initial = decode_state(msg["initial_state"], source, objects, factory, "initial_state" not in untagged)
        final = decode_state(msg["final_state"], source, objects, factory, "final_state" not in untagged)
    except MemoryError:
        initial = final = None
        flush_std()
        try:
            send({"id": token, "index": index, "status": "oom", "passed": False, "result": None,
                          "error": "Error: MemoryError: restoring the states ran out of memory",
                          "traceback": None, "duration_ms": 0.0, "fatal": True})
        finally:
            os._exit(0)
    except StateError as exc:
        initial = final = None
        state_error = f"restoring the state failed: {exc}"[:ERROR_CHARS]
    finally:
        if saved is not None:
            saved.restore()
    del msg
    modules = set(sys.modules)  # what the forked checks inherit (see _check_in_place)
    send({"id": token, "ready": True})  # the checks' own time limits start now
    stays = stay and plain and objects == "standins" and state_error is None
    while True:
        if state_error is not None:
            out = {"status": "error", "passed": False, "result": None, "error": state_error, "traceback": None,
                   "duration_ms": 0.0}
        else:
            try:
                read_only = plain and why_not_read_only(checks[index]) is None
                _forget_new_modules(modules)  # a \N{...} escape in the source imports unicodedata
                if read_only:
                    out = _check_in_place(checks[index], initial, final)
                    _forget_new_modules(modules)
                else:
                    out = _forked_check(checks[index], initial, final)
                stays = stays and read_only and out["status"] != "oom"
            except OSError as exc:  # no pid for the check's process, even after retries
                stays = False
                out = {"status": "crashed", "passed": False, "result": None, "traceback": None, "duration_ms": 0.0,
                       "error": f"the check process could not be started: {exc}"[:ERROR_CHARS]}
        flush_std()
        if index == max(checks):
            send({"id": token, "index": index, **out, **({"stays": True} if stays else {})})
            return stays
        send({"id": token, "index": index, **out})
        index = wait()
        if index not in checks:
            return False


def _plain_data(encoded: object) -> bool:
    """Whether an encoded state restores as plain data only (no ``"p"`` entry: an
    unpickled object's class could run code when a check compares or iterates it)."""
    return type(encoded) is dict and all(type(entry) is list and entry and entry[0] in ("j", "u")
                                         for entry in encoded.values())


def _check_in_place(source: str, initial: object, final: object) -> dict[str, Any]:
    """Run a read-only check (``child_readonly``) in this process, on the states every
    check of the batch shares (it cannot change them); its result fields, as
    :func:`run_check` builds and caps them (a forked check's are re-validated because
    that process could forge them; this one cannot reach them). What it can leave in the
    process besides is undone here: the flags of the decimal context (a ``localcontext``
    for its run), its source lines in ``linecache``; the caller forgets modules it
    imported (:func:`_forget_new_modules`).
    A ``MemoryError`` is the check's ``oom`` (what it allocated is freed as the error
    unwinds); a check that never returns is killed with this process by the runner, like
    a forked one."""
    started = time.perf_counter()
    decimal = sys.modules.get("decimal")  # None: no Decimal exists here, so no context to change
    try:
        if decimal is None:
            out = _run_or_oom(source, initial, final, started)
        else:
            with decimal.localcontext():  # the flags its arithmetic raises end with it
                out = _run_or_oom(source, initial, final, started)
    finally:
        linecache = sys.modules.get("linecache")
        if linecache is not None:  # its lines, registered for its traceback, go with it
            linecache.cache.pop(CHECK_FILENAME, None)
    return out


def _forget_new_modules(modules: set[str]) -> None:
    """Take out of ``sys.modules`` what was imported since it was ``modules``: a codec
    lookup of a read-only check (``str(b, "idna")``) or of the analysis (a named escape
    ``\\N{BULLET}``) imports modules as a side effect, which a later forked check would inherit."""
    if len(sys.modules) != len(modules):
        for name in [name for name in sys.modules if name not in modules]:
            del sys.modules[name]


def _run_or_oom(source: str, initial: object, final: object, started: float) -> dict[str, Any]:
    """:func:`run_check`, with a ``MemoryError`` reported as the check's ``oom`` (timed
    from ``started``, a ``perf_counter`` reading)."""
    try:
        return run_check(source, initial, final)
    except MemoryError:
        return {"status": "oom", "passed": False, "result": None,
                "error": "Error: MemoryError: the check ran out of memory", "traceback": None,
                "duration_ms": (time.perf_counter() - started) * 1000.0}


def _forked_check(source: str, initial: object, final: object) -> dict[str, Any]:
    """Run one check in a fresh process forked from this one; its result fields,
    validated. The child writes one length-prefixed JSON object to a private socket and
    exits; it never holds the runner channel. Its process group is killed once it has
    answered or died (a process it left holding the pipe cannot stall the zygote)."""
    import socket

    # a socketpair, not a pipe: under gVisor a process of the same uid could open a pipe
    # through /proc/<pid>/fd and write a forged result; sockets cannot be opened that way
    read_end, write_end = socket.socketpair()
    read_fd, write_fd = read_end.detach(), write_end.detach()
    flush_std()  # nothing buffered here may be printed twice by the child
    started = time.perf_counter()
    pid = _fork()
    if pid == 0:  # the check process
        try:
            os.close(read_fd)
            os.close(CTRL_FD)  # the runner channel stays with the zygote
            os.setpgid(0, 0)
            out = _run_or_oom(source, initial, final, started)
            flush_std()
            data = _json_text(out).encode("utf-8", "replace")
            view = memoryview(len(data).to_bytes(HEADER_SIZE, "big") + data)
            while view:
                view = view[os.write(write_fd, view):]
        except BaseException:  # noqa: BLE001 - the zygote reports the missing result
            pass
        os._exit(0)
    os.close(write_fd)
    raw, wait_status = _await_result(read_fd, pid)
    try:
        os.killpg(pid, 9)  # what the check left behind in its group
    except OSError:
        pass
    if wait_status is None:
        wait_status = os.waitpid(pid, 0)[1]
    elapsed = (time.perf_counter() - started) * 1000.0
    result = _result_fields(raw) if raw is not None else None
    if result is not None:
        return dict(result)
    code = os.waitstatus_to_exitcode(wait_status)
    out = {"status": "crashed", "passed": False, "result": None, "traceback": None, "duration_ms": elapsed,
           "error": (f"the check process was killed by signal {-code}" if code < 0
                     else f"the check process exited with status {code} without a result")}
    if code < 0:
        out["signal"] = -code
    return out


def _fork() -> int:
    """``os.fork()``, retried on EAGAIN for up to FORK_RETRY_S seconds."""
    deadline = time.monotonic() + FORK_RETRY_S
    while True:
        try:
            return os.fork()
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _await_result(read_fd: int, pid: int) -> tuple[bytes | None, int | None]:
    """Read the check process's one frame from ``read_fd``: ``(body, None)`` once it is
    complete, ``(None, wait status)`` when the process died without one (or sent more than
    CHECK_RESULT_MAX_BYTES). Polls the process every 50 ms while waiting; closes ``read_fd``."""
    import select

    buffer = b""
    try:
        while True:
            readable, _, _ = select.select([read_fd], [], [], 0.05)
            if readable:
                chunk = os.read(read_fd, 65536)
                buffer += chunk
                if len(buffer) >= HEADER_SIZE:
                    length = int.from_bytes(buffer[:HEADER_SIZE], "big")
                    if length > CHECK_RESULT_MAX_BYTES:
                        return None, _kill_and_wait(pid)
                    if len(buffer) >= HEADER_SIZE + length:
                        return buffer[HEADER_SIZE:HEADER_SIZE + length], None
                if not chunk:
                    return None, _kill_and_wait(pid)
                continue
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                while True:  # what it wrote just before dying still counts
                    readable, _, _ = select.select([read_fd], [], [], 0)
                    chunk = os.read(read_fd, 65536) if readable else b""
                    if not chunk:
                        break
                    buffer += chunk
                if len(buffer) >= HEADER_SIZE:
                    length = int.from_bytes(buffer[:HEADER_SIZE], "big")
                    if length <= CHECK_RESULT_MAX_BYTES and len(buffer) >= HEADER_SIZE + length:
                        return buffer[HEADER_SIZE:HEADER_SIZE + length], wait_status
                return None, wait_status
    finally:
        os.close(read_fd)


def _kill_and_wait(pid: int) -> int:
    try:
        os.killpg(pid, 9)
    except OSError:
        pass
    return os.waitpid(pid, 0)[1]


def _result_fields(raw: bytes) -> CheckFields | None:
    """The fields of a check process's result (``wire.check_result``: it never reports
    ``crashed``); None when it is not a well-formed result."""
    try:
        message = _json_value(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return check_result(message, ("ok", "error", "rejected", "oom"))

