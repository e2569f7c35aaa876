"""One-shot jobs of a fresh sandbox process: scripts (``exec``) and check functions (``checks``).

Stdlib only. Runs inside a sandbox, in a process the runner took from its pre-started
spares (``child_session.py``, which hands its first request over to :func:`run_job` when that
request is ``exec`` or ``checks``): such a process never served an environment and
serves this one job only, then exits. Its caps are in ``limits.py``.

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

``checks`` (``{workdir, initial_state, final_state, source?, checks: [{index,
check_func}]}``), EnvScaler's rule-based reward. The states are *encoded* states (one
entry per attribute: ``["j", value]``, ``["p", base64 pickle]``, ``["u", rendering]``, see
``child_session.py``) and are restored here as Python objects, in one of two ways:

* by default (a scenario's ``check_objects: standins``; no ``source`` in the request) no
  code of the environment runs in this process or in any check's: pickles are restored by
  ``child_standins.py``, which gives the standard library's value types (sets, dates,
  Decimal, OrderedDict...) as themselves and every other class a pickle names (the
  environment's own) as a *stand-in* carrying the same attributes. So the process that
  computes a verdict holds only the runner's code, the check's own code and data: the
  code being judged cannot install hooks, patch modules or rewrite results here;
* with ``source`` (``check_objects: environment``, an explicit opt-in) the environment's
  module (or a module it creates when it loads, as BFCL's environments do) is loaded
  from ``source`` when a pickle refers to it, so its classes unpickle as themselves
  (methods, ``isinstance``) exactly as EnvScaler's in-process check sees them. Its
  module-level code then runs here: what it installs at import that this module can take
  back (profile and trace functions, builtins, ``sys`` streams and hooks, replaced
  ``sys.modules`` entries) is put back before any check runs (:class:`_ProcessState`),
  but the environment's code takes part in the verdict (its methods run inside checks,
  and audit hooks or threads it starts cannot be taken back).
``"u"`` attributes (not picklable) arrive as their rendering. ``"j"`` values that are tags
of ``child_render.py`` (only possible in states a caller wrote by hand, e.g. validation cases)
are turned back into the objects they stand for (:func:`unrender`).

This process (the *zygote*) restores both states once, then runs each check in a fresh
process of its own, forked from it: the check's ``initial_state`` global and its
``final_state`` argument are that process's private copy-on-write copies, and nothing a
check does (its modules, threads, files descriptors, tracers, patched builtins, frames it
walks) can reach another check, this process or the verdict of another check. The zygote
reads the check process's one result frame from a private pipe, kills the check's
process group, and forwards the result (re-validated) to the runner. One exception,
for speed (a fork costs ~2-3 ms of this VM's CPU, most of an evaluation): a check whose
source ``child_readonly`` proves read-only (it can change only objects it made and
reach only its states and harmless builtins) runs in the zygote itself, on the shared
states, when both states are plain data (no ``"p"`` entry, whose objects' classes could
run code). Such a check cannot change what another check sees, so the guarantee above
holds for it too; a read-only check that never returns is killed with the zygote, like
a forked one, and the next checks go on in a fresh zygote. One frame per check, in
order: ``{"id", "index", "status", "passed", "result", "error", "traceback",
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
functions :class:`_Channel` took before any check or environment code ran.
"""

from __future__ import annotations

import builtins
import os
import sys
import time
import types

from . import child_standins
from .child_codec import dumps as _json_text
from .child_codec import loads as _json_value
from .child_readonly import why_not_read_only
from .limits import (
    CHECK_RESULT_MAX_BYTES,
    CHECK_RESULT_TEXT_CAPS,
    ERROR_CHARS,
    FORK_RETRY_S,
    TRACEBACK_CHARS,
    check_files,
)
from .wire import bounded_repr, classify, error_observation

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

# traceback and linecache are imported when an exception is reported (start-up cost).

CTRL_FD = 3
"""The runner channel of a job process (``child_session.CTRL_FD``)."""
SCRIPT_NAME = "main.py"
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


ENV_MODULE = "dynamic_env"
"""Name of the environment's module in sessions (``child_session.MODULE_NAME``): pickles of
instances of its classes refer to it."""
ENV_MODULE_ALIASES = ("sandpit_env",)
"""Earlier names of that module (``child_session.LEGACY_MODULE_NAMES``)."""


class StateError(Exception):
    """An encoded state could not be restored (a pickle that does not load, the
    environment's module failing to load, a malformed entry)."""


def _load_env_module(source: str | None) -> types.ModuleType:
    """The environment's module, loaded from ``source`` on first use (only when a pickle
    refers to it). Raises StateError when there is no source or it fails to load."""
    module = sys.modules.get(ENV_MODULE)
    if module is not None:
        return module
    if not source:
        raise StateError("the state holds instances of the environment's classes, but no environment "
                         "source was given to load them")
    module = types.ModuleType(ENV_MODULE)
    module.__file__ = "<environment>"
    module.__builtins__ = builtins  # type: ignore[attr-defined]  # the real module, as EnvScaler's exec gives it
    for name in (ENV_MODULE, *ENV_MODULE_ALIASES):
        sys.modules[name] = module
    try:
        exec(compile(source, "<environment>", "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - sandbox
    except MemoryError:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported as the state's error
        for name in (ENV_MODULE, *ENV_MODULE_ALIASES):
            sys.modules.pop(name, None)
        raise StateError(f"loading the environment's module failed: {error_observation(exc, ERROR_CHARS)}") from None
    return module


CHECK_OBJECTS = ("standins", "environment")
"""How a check batch restores objects of the environment's classes (a scenario's
``check_objects``): ``standins`` rebuilds them without running any environment code
(``child_standins.py``); ``environment`` loads the environment's module from ``source``
so its classes unpickle as themselves (its code then runs in this process)."""


def decode_state(encoded: dict[str, Any], source: str | None, objects: str = "standins",
                 factory: child_standins.StandInFactory | None = None) -> dict[str, Any]:
    """Python objects of an encoded state (module docstring). With ``objects ==
    "standins"`` no code of the environment runs: pickles are restored by
    ``child_standins.loads`` (pass one ``factory`` for both states of a check batch);
    ``"environment"`` loads the environment's module from ``source`` when a pickle refers
    to it. Raises StateError; MemoryError propagates."""
    import base64

    unpickle = _environment_unpickler(source) if objects == "environment" else None
    if factory is None:
        factory = child_standins.StandInFactory()
    state: dict[str, Any] = {}
    for name, entry in encoded.items():
        kind = entry[0]
        if kind == "j":
            state[name] = unrender(entry[1])
        elif kind == "p":
            try:
                blob = base64.b64decode(entry[1])
                state[name] = unpickle(blob) if unpickle is not None else child_standins.loads(blob, factory)
            except (MemoryError, StateError):
                raise
            except BaseException as exc:  # noqa: BLE001 - a pickle that does not load
                raise StateError(f"attribute {name!r} could not be restored: {error_observation(exc, ERROR_CHARS)}") from None
        else:
            state[name] = entry[1] if len(entry) > 1 else None
    return state


def _environment_unpickler(source: str | None) -> Any:
    """``pickle.loads`` that loads the environment's module (from ``source``) before a
    class of it, or of a module its code creates when it loads (BFCL's embedded
    packages), is looked up: the ``check_objects: environment`` opt-in."""
    import io
    import pickle

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            if module == ENV_MODULE or module in ENV_MODULE_ALIASES:
                _load_env_module(source)
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                if not source or ENV_MODULE in sys.modules:
                    raise
                _load_env_module(source)
                return super().find_class(module, name)

    return lambda blob: _Unpickler(io.BytesIO(blob)).load()


class _ProcessState:
    """What the environment's module may change in this process when it is loaded for
    ``check_objects: environment``, taken before it runs and put back after (so hooks and
    patches it installs at import do not act on the checks): builtins, the standard
    streams and hooks of ``sys``, replaced ``sys.modules`` entries, profile and trace
    functions. It cannot take back audit hooks, threads it started, or changes made
    inside module objects; the README says so."""

    def __init__(self) -> None:
        self.builtins = dict(builtins.__dict__)
        self.modules = dict(sys.modules)
        self.sys_attrs = {name: getattr(sys, name, None) for name in _SYS_ATTRS}
        self.import_hooks = (list(sys.meta_path), list(sys.path_hooks))

    def restore(self) -> None:
        sys.setprofile(None)
        sys.settrace(None)
        threading = sys.modules.get("threading")
        if threading is not None and self.modules.get("threading") is threading:
            threading.setprofile(None)
            threading.settrace(None)
        current = builtins.__dict__
        for name, value in self.builtins.items():
            if current.get(name, _MISSING) is not value:
                current[name] = value
        for name in [name for name in current if name not in self.builtins]:
            del current[name]
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
        for name, value in self.sys_attrs.items():
            if value is not None and getattr(sys, name, None) is not value:
                setattr(sys, name, value)
        sys.meta_path[:], sys.path_hooks[:] = self.import_hooks
        sys.setprofile(None)
        sys.settrace(None)


_SYS_ATTRS = ("stdout", "stderr", "stdin", "excepthook", "displayhook", "unraisablehook", "breakpointhook",
              "meta_path", "path_hooks", "path")
_MISSING = object()


def unrender(value: Any) -> object:
    """Objects back from a rendering's tags (``child_render.py``) where Python can rebuild them:
    sets, frozensets, tuples, bytes, dates and times, Decimal, Fraction, complex, UUID,
    non-finite floats, dicts with non-str keys; ``$object`` becomes a
    ``types.SimpleNamespace`` of its attributes, ``$enum`` its value; ``$repr``,
    ``$cycle`` and ``$truncated`` stay as they are. Plain JSON comes back unchanged."""
    kind = type(value)
    if kind is list:
        return [unrender(item) for item in value]
    if kind is not dict:
        return value
    if len(value) != 1:
        return {key: unrender(item) for key, item in value.items()}
    tag, body = next(iter(value.items()))
    if not (type(tag) is str and tag.startswith("$")):
        return {tag: unrender(body)}
    try:
        return _unrender_tag(tag, body, value)
    except (TypeError, ValueError, ArithmeticError):
        return value


def _unrender_tag(tag: str, body: Any, whole: dict[str, Any]) -> object:
    if tag in ("$set", "$frozenset", "$tuple") and type(body) is list:
        items = [unrender(item) for item in body]
        return set(items) if tag == "$set" else frozenset(items) if tag == "$frozenset" else tuple(items)
    if tag in ("$bytes", "$bytearray") and type(body) is str:
        import base64

        data = base64.b64decode(body)
        return data if tag == "$bytes" else bytearray(data)
    if tag in ("$datetime", "$date", "$time") and type(body) is str:
        import datetime

        kind: type[datetime.datetime | datetime.date | datetime.time] = {
            "$datetime": datetime.datetime, "$date": datetime.date, "$time": datetime.time}[tag]
        return kind.fromisoformat(body)
    if tag == "$timedelta" and type(body) in (int, float):
        import datetime

        return datetime.timedelta(seconds=body)
    if tag == "$decimal" and type(body) is str:
        import decimal

        return decimal.Decimal(body)
    if tag == "$fraction" and type(body) is str:
        import fractions

        return fractions.Fraction(body)
    if tag == "$complex" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    if tag == "$uuid" and type(body) is str:
        import uuid

        return uuid.UUID(body)
    if tag == "$float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "$dict" and type(body) is list:
        return {_hashable(unrender(pair[0])): unrender(pair[1]) for pair in body}
    if tag == "$enum" and type(body) is dict:
        return unrender(body.get("value"))
    if tag == "$object" and type(body) is dict and type(body.get("attrs")) is dict:
        return types.SimpleNamespace(**{k: unrender(v) for k, v in body["attrs"].items() if k.isidentifier()})
    return whole


def _hashable(key: object) -> object:
    if type(key) is list:
        return tuple(_hashable(k) for k in key)
    if type(key) is dict:
        return tuple(sorted((str(k), repr(v)) for k, v in key.items()))
    return key


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
        _register_source(CHECK_FILENAME, source)
        out.update(status="error", passed=False, error=error_observation(exc, ERROR_CHARS),
                   traceback=bounded_traceback(exc, skip=1))
    return _timed(out, started)


def _timed(out: dict[str, Any], started: float) -> dict[str, Any]:
    out["duration_ms"] = (time.perf_counter() - started) * 1000.0
    return out


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

    def send(self, message: dict[str, Any]) -> None:
        data = self._dumps(message).encode("utf-8", "replace")
        view = memoryview(len(data).to_bytes(HEADER_SIZE, "big") + data)
        while view:
            view = view[self._write(self.fd, view):]


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


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
    _enter_workdir(msg["workdir"])
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
        _register_source(SCRIPT_NAME, source)
        _print_uncaught(exc)
        if isinstance(exc, MemoryError):
            _flush_std()
            try:
                channel.send({"id": token, "status": "oom"})
            except Exception:  # noqa: BLE001 - the script may have closed the channel
                pass
        return 1
    return 0


def _register_source(filename: str, source: str) -> None:
    """Let tracebacks show the lines of ``source`` (compiled as ``filename``)."""
    try:
        import linecache

        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    except Exception:  # noqa: BLE001 - only decoration
        pass


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


def run_checks(msg: dict[str, Any], channel: _Channel) -> None:
    """Serve one ``checks`` request as the zygote (module docstring): restore both states
    once, then one forked process per check (a read-only check on plain states runs
    here instead), each after the runner's go-ahead naming it
    (``{"op": "next", "index"}``), so what a check prints is all in the pipes before the
    next one starts. Returns when all are sent or the channel closes; exits after a
    ``MemoryError`` while restoring the states."""
    token = msg.get("id")
    _enter_workdir(msg["workdir"])
    sys.argv = ["check_func"]
    checks = {item["index"]: item["check_func"] for item in msg["checks"]}
    index = msg["checks"][0]["index"]
    source = msg.get("source")  # given only for a scenario's `check_objects: environment`
    objects = "environment" if source else "standins"
    plain = _plain_data(msg["initial_state"]) and _plain_data(msg["final_state"])
    state_error = None
    initial: dict[str, Any] | None
    final: dict[str, Any] | None
    saved = _ProcessState() if objects == "environment" else None
    try:
        factory = child_standins.StandInFactory()
        initial = decode_state(msg["initial_state"], source, objects, factory)
        final = decode_state(msg["final_state"], source, objects, factory)
    except MemoryError:
        initial = final = None
        _flush_std()
        try:
            channel.send({"id": token, "index": index, "status": "oom", "passed": False, "result": None,
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
    channel.send({"id": token, "ready": True})  # the checks' own time limits start now
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
            except OSError as exc:  # no pid for the check's process, even after retries
                out = {"status": "crashed", "passed": False, "result": None, "traceback": None, "duration_ms": 0.0,
                       "error": f"the check process could not be started: {exc}"[:ERROR_CHARS]}
        _flush_std()
        channel.send({"id": token, "index": index, **out})
        if index == max(checks):
            return
        index = channel.wait()
        if index not in checks:
            return


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
    _flush_std()  # nothing buffered here may be printed twice by the child
    started = time.perf_counter()
    pid = _fork()
    if pid == 0:  # the check process
        try:
            os.close(read_fd)
            os.close(CTRL_FD)  # the runner channel stays with the zygote
            os.setpgid(0, 0)
            out = _run_or_oom(source, initial, final, started)
            _flush_std()
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
        return result
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


_RESULT_STATUSES = ("ok", "error", "rejected", "oom")


def _result_fields(raw: bytes) -> dict[str, Any] | None:
    """The fields of a check process's result, rebuilt with exact types and caps (None
    when it is not a well-formed result)."""
    try:
        message = _json_value(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if type(message) is not dict or message.get("status") not in _RESULT_STATUSES:
        return None
    passed, duration = message.get("passed"), message.get("duration_ms")
    if type(passed) is not bool or not (type(duration) is int or type(duration) is float):
        return None
    out: dict[str, Any] = {"status": message["status"], "passed": passed and message["status"] == "ok",
                           "duration_ms": float(duration)}
    for name, cap in CHECK_RESULT_TEXT_CAPS.items():
        value = message.get(name)
        if value is not None and type(value) is not str:
            return None
        out[name] = value[:cap] if value is not None else None
    return out


def run_job(msg: dict[str, Any], ctrl_fd: int) -> None:
    """Entry point from ``child_session.py`` for a spare whose first request is ``exec`` or
    ``checks``. Never returns: ``exec`` ends through ``SystemExit`` (normal interpreter
    shutdown), ``checks`` through ``os._exit``."""
    channel = _Channel(ctrl_fd)
    try:
        os.set_inheritable(ctrl_fd, False)  # processes the job starts never get the channel
    except OSError:
        pass
    if msg.get("op") == "exec":
        status = run_script(msg, channel)
        raise SystemExit(status)
    try:
        run_checks(msg, channel)
    except BaseException:  # noqa: BLE001 - a broken channel: the runner sees the exit
        pass
    _flush_std()
    os._exit(0)
