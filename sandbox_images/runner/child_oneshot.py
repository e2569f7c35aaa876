"""One-shot jobs of a fresh sandbox process: scripts (``exec``) and check functions (``checks``).

Stdlib only. Runs inside a sandbox, in a process PID 1 took from its pre-started spares
(``child_spare.become`` hands its first request over to :func:`run_job` when that request
is ``exec`` or ``checks``), or forked for it from the jobs template: such a process never
served an environment and serves this one job only, then exits; the one exception is a
check batch's zygote whose checks all ran in place (read-only checks on plain states,
``child_checks``), which serves the runner's next check batch instead (:func:`run_job`).
Its caps are in ``limits.py``.

``exec`` (``{workdir, code, stdin, files}``): ``code`` runs as a script, like ``python3 -I
main.py``: ``__name__ == "__main__"`` in a fresh ``__main__`` module, ``sys.argv ==
["main.py"]``, ``sys.path`` without the script's directory or the one holding the runner's
package (and no module of that package in ``sys.modules``), the working directory
``workdir`` (empty but for ``files``, written here first), ``stdin`` on fd 0 (an anonymous
in-memory file), ``exit``/``quit`` builtins. The outcome is the process's
own: exit status (``SystemExit`` as Python maps it; an uncaught exception prints its
traceback on stderr and exits 1), stdout and stderr (pipes the runner reads). The only
frame sent on the control channel is ``{"id", "status": "oom"}`` just before exiting on
an uncaught ``MemoryError``, which the runner reports as ``oom`` instead of ``error``.

``checks``: the check batch's zygote, ``child_checks.py``. Frames to PID 1 go out through
``child_codec.py``'s encoder and the descriptors and functions :class:`_Channel` took before
any script, check or environment code ran.
"""

from __future__ import annotations

import builtins
import os
import sys
import types

from . import child_checks
from .child_checks import register_source
from .child_codec import dumps as _json_text
from .child_codec import loads as _json_value
from .child_instance import flush_std
from .limits import MAX_FRAME_BYTES, ZYGOTE_MAX_BATCHES, check_files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

# traceback and linecache are imported when an exception is reported (start-up cost).

CTRL_FD = 3
"""The runner channel of a job process (``child_session.CTRL_FD``)."""
SCRIPT_NAME = "main.py"
HEADER_SIZE = 4


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


# -- process side ----------------------------------------------------------------------
class _Channel:
    """Frames to the runner over the control fd, with the functions captured at start so
    a check that patches ``os`` or ``json`` later cannot change how results are sent."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._write = os.write
        self._read = os.read
        self._dumps = _json_text

    def wait(self) -> int | None:
        """Block until the runner's go-ahead arrives and return the index of the check it
        names (the last one, if several frames came together); None when the channel is
        closed or the frame is not a go-ahead."""
        data = self._read(self.fd, 4096)
        index = None
        while len(data) >= HEADER_SIZE:
            end = HEADER_SIZE + int.from_bytes(data[:HEADER_SIZE], "big")
            try:
                index = _json_value(data[HEADER_SIZE:end].decode("utf-8"))["index"]
            except (ValueError, KeyError, TypeError, RecursionError):
                return None
            data = data[end:]
        return index if type(index) is int else None

    def request(self) -> dict[str, Any] | None:
        """Block until the runner's next request arrives and return it (a kept zygote's
        next ``checks`` batch); None when the channel closes or the frame is not a JSON
        object of at most MAX_FRAME_BYTES."""
        header = self._read_exact(HEADER_SIZE)
        length = int.from_bytes(header, "big") if header is not None else MAX_FRAME_BYTES + 1
        body = self._read_exact(length) if length <= MAX_FRAME_BYTES else None
        if body is None:
            return None
        try:
            message = _json_value(body.decode("utf-8"))
        except (ValueError, RecursionError):
            return None
        return message if type(message) is dict else None

    def _read_exact(self, size: int) -> bytes | None:
        chunks, left = [], size
        while left:
            chunk = self._read(self.fd, min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def send(self, message: dict[str, Any]) -> None:
        data = self._dumps(message).encode("utf-8", "replace")
        view = memoryview(len(data).to_bytes(HEADER_SIZE, "big") + data)
        while view:
            view = view[self._write(self.fd, view):]


def _enter_workdir(workdir: str) -> None:
    os.chdir(workdir)
    os.environ["HOME"] = workdir
    os.environ["TMPDIR"] = workdir
    os.environ["PWD"] = workdir


def _script_environment(workdir: str) -> types.ModuleType:
    """Make this process look like ``python3 -I main.py`` just started: a fresh
    ``__main__``, ``sys.argv``, a ``sys.path`` without the directory holding the runner's
    package, no module of that package in ``sys.modules``, and the ``exit``/``quit``
    builtins ``site`` would add."""
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the runner package's
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != parent]
    package = __package__ or ""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:  # the runner's
        sys.modules.pop(name, None)
    main = types.ModuleType("__main__")
    main.__file__ = os.path.join(workdir, SCRIPT_NAME)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__spec__ = None
    main.__loader__ = None
    sys.modules["__main__"] = main
    sys.argv = [SCRIPT_NAME]
    sys.orig_argv = [sys.executable, "-I", SCRIPT_NAME]
    try:
        import _sitebuiltins

        builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
        builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    except Exception:  # noqa: BLE001 - exit() is a convenience
        pass
    return main


def _stdin_from(text: str) -> None:
    """Put ``text`` on fd 0 as an anonymous in-memory file (read from its start)."""
    data = text.encode("utf-8")
    try:
        fd = os.memfd_create("stdin", 0)
    except (AttributeError, OSError):  # no memfd (old gVisor): an unlinked file in the workdir
        fd = os.open(".stdin", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(".stdin")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)


def _write_files(files: dict[str, str]) -> None:
    for path, text in check_files(files).items():
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, mode=0o700, exist_ok=True)
        with open(path, "x", encoding="utf-8", newline="") as handle:
            handle.write(text)


def _exit_status(exc: SystemExit) -> int:
    """The exit status Python gives a ``SystemExit`` (printing a non-int code to stderr)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def run_script(msg: dict[str, Any], channel: _Channel) -> int:
    """Serve one ``exec`` request; returns the exit status for the interpreter's normal
    shutdown (which runs ``atexit`` handlers, joins threads and flushes, as Python does)."""
    token = msg.get("id")
    try:
        _write_files(msg.get("files") or {})
        _stdin_from(msg.get("stdin") or "")
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"sandpit: could not prepare the working directory: {exc}\n")
        return 1
    source = msg["code"]
    main = _script_environment(msg["workdir"])
    del msg
    try:
        code = compile(source, SCRIPT_NAME, "exec", dont_inherit=True)
        exec(code, main.__dict__)  # noqa: S102 - this is the sandbox
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - Python's own top level: print and exit 1
        register_source(SCRIPT_NAME, source)
        _print_uncaught(exc)
        if isinstance(exc, MemoryError):
            flush_std()
            try:
                channel.send({"id": token, "status": "oom"})
            except Exception:  # noqa: BLE001 - the script may have closed the channel
                pass
        return 1
    return 0


def _print_uncaught(exc: BaseException) -> None:
    """Report an uncaught exception as the interpreter would (``sys.excepthook``, which
    the script may have replaced), without this module's frame."""
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None and tb.tb_frame.f_code.co_filename == __file__ else tb
    try:
        if sys.excepthook is sys.__excepthook__:  # Python's own, but with the script's lines
            import traceback

            traceback.print_exception(type(exc), exc.with_traceback(tb), tb)  # (from linecache)
        else:
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    except BaseException:  # noqa: BLE001
        try:
            sys.stderr.write(f"{type(exc).__name__}\n")
        except BaseException:  # noqa: BLE001
            pass


def run_job(msg: dict[str, Any], ctrl_fd: int) -> None:
    """Entry point (``child_spare.become``) for a process whose first request is ``exec``
    or ``checks``, run in the request's work directory. Never returns: ``exec`` ends
    through ``SystemExit`` (normal interpreter shutdown), ``checks`` through ``os._exit``:
    after a batch whose every check ran in this process (``child_checks.run_checks``
    returns True, which it tells the runner), the zygote waits for the runner's next
    ``checks`` request, in that request's work directory, at most ZYGOTE_MAX_BATCHES
    batches in all; it exits on anything else or when the runner closes the channel."""
    channel = _Channel(ctrl_fd)
    try:
        os.set_inheritable(ctrl_fd, False)  # processes the job starts never get the channel
    except OSError:
        pass
    _enter_workdir(msg["workdir"])
    if msg.get("op") == "exec":
        status = run_script(msg, channel)
        raise SystemExit(status)
    for batch in range(1, ZYGOTE_MAX_BATCHES + 1):
        try:
            kept = child_checks.run_checks(msg, channel.send, channel.wait, stay=batch < ZYGOTE_MAX_BATCHES)
        except BaseException:  # noqa: BLE001 - a broken channel: the runner sees the exit
            kept = False
        flush_std()
        del msg
        following = channel.request() if kept else None
        if following is None or following.get("op") != "checks" or type(following.get("workdir")) is not str:
            break
        msg = following
        _enter_workdir(msg["workdir"])
    os._exit(0)
