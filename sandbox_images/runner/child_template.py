"""Template process: an environment's module executed once, forked for each new session.

Stdlib only; runs inside the sandbox as a child of the runner, confined exactly like a
session process (it *is* a spare session process, ``child_spare.harden`` already applied:
rlimits, non-dumpable, seccomp filter), handed over here by ``child_spare.become`` when its
first request is ``template {id, source, class_name}``. It then:

1. decides whether the source may be loaded once for many sessions (:func:`unsuitable`):
   the code run at import (module body, class bodies, decorators, default values; not
   function bodies) must be deterministic and touch nothing outside the process, so that a
   session forked from the template starts exactly as one that executed the source itself.
   Imports (anywhere) must come from PURE_MODULES, import-time calls may only name
   IMPORT_TIME_CALLS, and ``open``/``exec``/``eval``/``compile``/``__import__`` may not appear
   at all. Anything else (``os``, ``random.seed(0)``, ``uuid4()`` or ``datetime.now()`` at import,
   threads, files) is *unsuitable*: the environment's sessions start the normal way;
2. executes the source (``child_instance.load_class``), then checks at run time that the
   process has one thread and no file descriptor beyond 0-3; ``gc.freeze()`` keeps the
   collector of forked sessions from writing to (and so copying) the template's objects;
3. answers ``{status: ok}`` (or ``{status: unsuitable, reason}``) and serves ``fork``
   requests: each carries three descriptors (SCM_RIGHTS: the new session's control socket,
   stdout and stderr streams, made by PID 1). The template forks an intermediate process
   that forks the session and exits, so the session is re-parented to PID 1 (which waits
   for it, as for a spawned session); the session calls ``setsid()``, puts the descriptors
   on 0-3, closes every other descriptor, re-arms PR_SET_PDEATHSIG (cleared by fork) once
   PID 1 is its parent, writes its pid to the template through a pipe, and serves the
   session protocol (``child_session.serve``) with the class already loaded. The template
   answers ``{status: ok, pid}``; PID 1 checks in /proc that the pid is its child and the
   leader of its own session before it uses it (nothing a template says is trusted).

Inherited from the template unchanged: rlimits (hard = soft), the seccomp filter
(irremovable), non-dumpability, the environment variables; copy-on-write memory (each
session writes only to its own copy). ``random``'s global generator is re-seeded in every
forked process by Python itself (``os.register_at_fork``).

The *jobs template* (request ``template {id, jobs: true}``, one per sandbox) is the same
process without any environment: it executes no source at all, only imports the runner's
own one-shot module (``child_oneshot.py``) and the modules restoring a state needs, then
serves ``fork`` requests in the same way. Each forked process is a fresh process (a
check batch's zygote, or PID 1's next spare) that never served an environment and never
ran untrusted code, exactly like a spare taking its first request, without the cost of
starting Python (on the sandbox's CPU quota). Once ready it blocks every signal that can
be blocked (:data:`_UNBLOCK`), and its forks unblock them.

Config templates (:func:`run_config_template`): a process forked from an environment's
template receives ``config_template {id, config}`` and keeps an *instance*: it constructs
``cls(config)`` (EnvScaler ``init_env_instance``, ``child_instance.instantiate``) and
encodes its state, then a probe process forked from it before construction does the
same with its own copy of the config (after, never beside it: two constructions at the same
time may read the same clock). It is suitable only when

* both encoded states are byte-identical (a constructor that reads the clock, random
  numbers, uuids, ``id()`` of fresh objects or anything else that varies between two
  constructions is constructed per session instead);
* construction left the module-level state as it found it (module globals, class
  attributes, default arguments: :func:`module_fingerprint`): a constructor that counts
  instances or registers itself somewhere is constructed per session, so that a session
  never sees the effects of a construction it did not make;
* no thread, descriptor or child process is left.

It then answers ``{status: ok, delta: {set: <encoded state>}}`` and serves ``fork``
exactly as above; a forked session takes the instance and its encoding cache as they are
(copy-on-write: what one session changes no other process sees).
"""

from __future__ import annotations

import ast
import builtins
import gc
import os
import select
import signal
import socket
import sys
import time

from . import child_session
from .child_codec import dumps as _json_text
from .child_codec import loads as _json_value
from .child_instance import flush_std, instantiate, load_class
from .limits import TEMPLATE_CHECK_MAX_NODES, TEMPLATE_FORK_TIMEOUT_S, TEMPLATE_REPARENT_S

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn  # annotations only: never evaluated in the sandbox

    from .child_session import Become

PURE_MODULES = frozenset({
    "__future__", "abc", "bisect", "calendar", "collections", "copy", "dataclasses", "datetime", "decimal",
    "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers",
    "operator", "random", "re", "statistics", "string", "textwrap", "typing", "typing_extensions", "uuid",
})
"""Modules an environment may import (anywhere in its source) and still be templated:
importing them runs no code of the environment and opens nothing (``random`` seeds its
global generator at import and Python re-seeds it after every fork)."""
IMPORT_TIME_CALLS = frozenset({
    "dataclass", "field", "namedtuple", "NamedTuple", "TypedDict", "TypeVar", "NewType", "Enum", "IntEnum",
    "StrEnum", "Flag", "IntFlag", "auto", "unique", "frozenset", "set", "dict", "list", "tuple", "str", "int",
    "float", "bool", "bytes", "range", "Decimal", "Fraction", "date", "timedelta", "defaultdict",
    "OrderedDict", "Counter", "deque", "staticmethod", "classmethod", "property", "abstractmethod",
    "total_ordering", "lru_cache", "cache", "wraps", "partial", "cast", "overload", "final",
    "runtime_checkable", "len", "sum", "zip", "enumerate", "isinstance", "chr", "ord", "abs", "round",
    "reversed", "any", "all", "Optional", "Union", "Literal",
})
"""Names a call executed at import may name (``dataclass(...)``, ``field(default_factory=
list)``, ``Enum("Status", ...)``): deterministic, no side effect outside the process, and
none of them calls back into the environment's own functions. Decorators count as calls.
Classes with a ``metaclass=`` or defining ``__init_subclass__``/``__set_name__``/
``__class_getitem__`` (code that runs when a class statement runs) are unsuitable."""
HOOKS = frozenset({"__init_subclass__", "__set_name__", "__class_getitem__"})
NEVER_NAMED = frozenset({"open", "exec", "eval", "compile", "__import__", "breakpoint", "input", "globals",
                         "vars", "locals", "getattr", "setattr", "delattr", "__builtins__"})
"""Names that make a source unsuitable wherever they appear (they reach what the other
rules check: files, dynamic imports, dynamic code)."""


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def unsuitable(source: str, class_name: str) -> str | None:
    """Why ``source`` must not be executed once for many sessions, or None when it may (see
    the module docstring). Parsing errors and oversize sources are reasons too."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return f"source does not parse: {type(exc).__name__}"
    nodes = 0
    for node in ast.walk(tree):
        nodes += 1
        if nodes > TEMPLATE_CHECK_MAX_NODES:
            return "source too large to check"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in PURE_MODULES:
                    return f"imports {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            if node.level or (node.module or "").split(".")[0] not in PURE_MODULES:
                return f"imports from {node.module}"
        elif isinstance(node, ast.Name) and node.id in NEVER_NAMED:
            return f"names {node.id}"
        elif isinstance(node, ast.Attribute) and node.attr in NEVER_NAMED:
            return f"names .{node.attr}"
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            return "rebinds module globals from a function"
    return _import_time_calls(tree)


def _import_time_calls(tree: ast.Module) -> str | None:
    """The first call executed at import that IMPORT_TIME_CALLS does not allow: walks the
    module body and class bodies, and of a function only its decorators and defaults."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for decorator in node.decorator_list:
                if not isinstance(decorator, ast.Call) and _called_name(decorator) not in IMPORT_TIME_CALLS:
                    return f"decorator {_called_name(decorator) or 'expression'} runs at import"
            if isinstance(node, ast.ClassDef):
                if any(k.arg == "metaclass" for k in node.keywords):
                    return "a metaclass runs at import"
                if any(isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name in HOOKS for d in node.body):
                    return "a class hook runs at import"
                stack.extend(ast.iter_child_nodes(node))
                continue
            stack.extend(node.decorator_list)
            stack.extend(node.args.defaults)
            stack.extend(d for d in node.args.kw_defaults if d is not None)
            stack.extend(a.annotation for a in (*node.args.args, *node.args.kwonlyargs) if a.annotation)
            continue
        if isinstance(node, ast.Lambda):
            stack.extend(node.args.defaults)
            continue
        if isinstance(node, ast.Call):
            name = _called_name(node.func)
            if name not in IMPORT_TIME_CALLS:
                return f"calls {name or 'an expression'} at import"
        stack.extend(ast.iter_child_nodes(node))
    return None


def _called_name(func: ast.AST) -> str | None:
    """``f`` of ``f(...)`` or ``m.f(...)``; None for any other callee."""
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _extra_state(own: int) -> str | None:
    """What the executed module left that a fork would share: threads, descriptors (other
    than 0-2 and ``own``, the template's channel)."""
    return _extra_threads() or _extra_descriptors(own)


def _extra_threads() -> str | None:
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1
    return f"{threads} threads after import" if threads != 1 else None


def _extra_descriptors(own: int) -> str | None:
    try:
        fds = {int(fd) for fd in os.listdir("/proc/self/fd")}
    except OSError:
        return "cannot list descriptors"
    extra = sorted(fd for fd in fds if fd > 2 and fd != own and _is_open(fd))
    return f"descriptors {extra[:8]} open after import" if extra else None


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False  # the listing's own descriptor, closed since


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = _json_text(message, ascii=True).encode("utf-8", "replace")
    sock.sendall(len(data).to_bytes(4, "big") + data)


def _recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request frame and the descriptors that came with it. Raises EOFError when PID 1
    closed the channel."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 3)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        more = sock.recv(1 << 16)
        if not more:
            raise EOFError
        data += more
    length = int.from_bytes(data[:4], "big")
    message = _json_value(data[4:4 + length].decode("utf-8"))
    if not isinstance(message, dict):
        raise EOFError
    return message, list(fds)


def run_template(msg: dict[str, Any], session: child_session.Session, become: Become) -> NoReturn:
    """Serve as the template of ``msg``'s environment until PID 1 closes the channel (or
    kills it); never returns. ``session`` is the spare process's (unused) session object:
    its control descriptor and limits; ``become`` (``child_spare.become``) is handed to
    every process forked from the template, whose first request it may take over."""
    os.chdir("/")  # read-only: nothing written at import can be shared by forked sessions
    sock = socket.socket(fileno=os.dup(session.fd))  # fd 3 stays free for the sessions' channel
    os.close(session.fd)
    request_id = msg.get("id", "")
    if msg.get("jobs") is True:
        _run_jobs_template(sock, request_id, session.limits, become)
    source, class_name = msg.get("source"), msg.get("class_name")
    reason = None if isinstance(source, str) and isinstance(class_name, str) else "malformed request"
    cls: type | None = None
    if reason is None:
        assert isinstance(source, str) and isinstance(class_name, str)
        reason = unsuitable(source, class_name)
    if reason is None:
        try:
            cls = load_class(source, class_name)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the normal path reports it per session
            reason = f"import failed: {type(exc).__name__}"
    if reason is None:
        reason = _extra_state(sock.fileno())
    if reason is not None or cls is None:
        _send(sock, {"id": request_id, "status": "unsuitable", "reason": str(reason)[:200]})
        os._exit(0)
    flush_std()
    gc.collect()
    gc.freeze()
    _send(sock, {"id": request_id, "status": "ok"})
    _serve_forks(sock, cls, session.limits, become)


def _run_jobs_template(sock: socket.socket, request_id: object, limits: dict[str, Any],
                       become: Become) -> NoReturn:
    """Serve as the sandbox's jobs template (module docstring): preload the one-shot
    module and what restoring a state imports, then fork fresh job processes; never returns."""
    import base64  # noqa: F401 - preloaded for the forked zygotes (decode_state)
    import io  # noqa: F401
    import linecache  # noqa: F401 - and for a check's traceback: a zygote forgets what its checks import
    import pickle  # noqa: F401
    import traceback  # noqa: F401

    from . import child_oneshot  # noqa: F401 - preloaded: the forked processes run its jobs

    reason = _extra_state(sock.fileno())
    if reason is not None:
        _send(sock, {"id": request_id, "status": "unsuitable", "reason": reason[:200]})
        os._exit(0)
    flush_std()
    gc.collect()
    gc.freeze()
    _UNBLOCK.append(signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals()))
    _send(sock, {"id": request_id, "status": "ok"})
    _serve_forks(sock, None, limits, become)


_UNBLOCK: list[set[int | signal.Signals]] = []
"""The signal mask the jobs template had before it blocked every signal that can be
blocked, restored in each process it forks (:func:`_become_session`). The template may
outlive a recycle (``pid1_templates``): blocked, a signal another process of the uid
sends it (SIGINT, SIGTERM, SIGUSR1...) stays pending and never runs a handler or ends it
halfway through a fork, so what the template is cannot be changed from outside; SIGKILL
ends it and SIGSTOP holds it, and PID 1 sees both. A forked process starts with no
pending signal (fork clears them)."""


def module_fingerprint(cls: type) -> bytes | None:
    """Pickled module-level state of the environment's module: globals that are not
    modules, functions or classes; of every class defined there, its attributes that are
    not functions; of every function, its default arguments. None when some of it cannot
    be pickled (the caller then treats the module as unsuitable)."""
    import pickle
    import types as pytypes

    module = sys.modules.get(cls.__module__)
    if module is None:
        return None
    state: list[Any] = []
    seen: set[int] = set()

    def function_defaults(func: Any) -> None:
        state.append((getattr(func, "__qualname__", ""), getattr(func, "__defaults__", None),
                      getattr(func, "__kwdefaults__", None)))

    def visit_class(klass: type) -> None:
        if id(klass) in seen:
            return
        seen.add(id(klass))
        for name, value in list(vars(klass).items()):
            if name.startswith("__") and name.endswith("__"):
                continue
            inner = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if isinstance(inner, pytypes.FunctionType):
                function_defaults(inner)
            elif isinstance(inner, property):
                continue
            elif isinstance(inner, type):
                if inner.__module__ == module.__name__:
                    visit_class(inner)
            else:
                state.append((klass.__qualname__, name, value))

    for name, value in list(vars(module).items()):
        if name.startswith("__") and name.endswith("__") or isinstance(value, pytypes.ModuleType):
            continue
        if isinstance(value, pytypes.FunctionType):
            function_defaults(value)
        elif isinstance(value, type):
            if value.__module__ == module.__name__:
                visit_class(value)
        else:
            state.append((name, value))
    try:
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - unpicklable module state: not provably unchanged
        return None


def _construct(cls: type, config: dict[str, Any], limits: dict[str, Any]) -> tuple[child_session.Session, bytes]:
    """An instance of ``cls`` from ``config`` (EnvScaler semantics) in a session object,
    and its full encoded state (JSON text of ``{"set": ..., "del": []}``)."""
    state = child_session.Session(-1, limits)
    state.cls = cls
    state.instance = instantiate(cls, config, state.retyped)
    return state, state.delta_json(full=True).encode("utf-8", "replace")


def run_config_template(msg: dict[str, Any], session: child_session.Session, become: Become) -> NoReturn:
    """Serve as the config template of ``msg["config"]`` (see the module docstring) until
    PID 1 closes the channel (or kills it); never returns. ``session`` is this process's
    session object, forked from the environment's template (its class preloaded);
    ``become`` is handed on to the sessions forked from it, as by :func:`run_template`."""
    import hashlib

    os.chdir("/")
    sock = socket.socket(fileno=os.dup(session.fd))
    os.close(session.fd)
    request_id = msg.get("id", "")
    cls, config = session.preloaded, msg.get("config")
    reason: str | None = None
    if cls is None or not isinstance(config, dict):
        reason = "malformed request"
    before = module_fingerprint(cls) if reason is None and cls is not None else None
    if reason is None and before is None:
        reason = "module state cannot be fingerprinted"
    probe, report, go = -1, -1, -1
    if reason is None:
        read_end, write_end = os.pipe()
        wait_end, go = os.pipe()
        flush_std()
        probe = os.fork()
        if probe == 0:  # the probe: a second, independent construction from its own copy
            try:
                os.close(read_end)
                os.close(go)
                # only once the template's construction is over: run side by side on two
                # cores, both read the clock within the same microsecond now and then, and
                # a constructor that stores datetime.now() passed as repeatable (seen in CI)
                if os.read(wait_end, 1) != b"g":
                    os._exit(0)
                _, text = _construct(cls, config, session.limits)  # type: ignore[arg-type]
                digest = hashlib.sha256(text + (module_fingerprint(cls) or b"?")).hexdigest()  # type: ignore[arg-type]
                os.write(write_end, digest.encode("ascii"))
            finally:
                os._exit(0)
        os.close(write_end)
        os.close(wait_end)
        report = read_end
    state: child_session.Session | None = None
    text = b""
    if reason is None:
        try:
            state, text = _construct(cls, config, session.limits)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the normal path reports it per session
            reason = f"construction failed: {type(exc).__name__}"
    if go >= 0:
        if reason is None:
            os.write(go, b"g")  # the probe's turn
        os.close(go)  # a probe not told to go reads end-of-file and exits
    if probe > 0:
        ready, _, _ = select.select([report], [], [], float(session.limits.get("call_timeout_s", 30.0)))
        theirs = os.read(report, 128).decode("ascii", "replace") if ready else ""
        os.close(report)
        try:
            os.kill(probe, 9)
        except OSError:
            pass
        os.waitpid(probe, 0)
        after = module_fingerprint(cls) if cls is not None else None
        if reason is None and (after is None or after != before):
            reason = "construction changed module-level state"
        if reason is None and not theirs:  # it died, ran out of memory or time: no verdict
            reason = "the second construction did not report (it died, ran out of memory or time)"
        elif reason is None and theirs != hashlib.sha256(text + after).hexdigest():  # type: ignore[operator]
            reason = "two constructions differ"
    if reason is None:
        reason = _extra_state(sock.fileno()) or _extra_children()
    if reason is not None or state is None:
        _send(sock, {"id": request_id, "status": "unsuitable", "reason": str(reason)[:200]})
        os._exit(0)
    flush_std()
    body = f'{{"id":{_json_text(request_id, ascii=True)},"status":"ok","delta":'.encode() + text + b"}"
    sock.sendall(len(body).to_bytes(4, "big") + body)
    preload = (cls, (state.instance, state.cache, state.retyped))
    del config, msg, state, text, body
    gc.collect()
    gc.freeze()
    _serve_forks(sock, preload, session.limits, become)


def _extra_children() -> str | None:
    """A child process left by construction (it would outlive nothing: PID 1 sweeps it,
    but the template must not hold one)."""
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return None
    except OSError:
        return "cannot wait for children"
    return f"construction left a child process ({pid})" if pid else "construction left a child process"


def _serve_forks(sock: socket.socket, cls: Any, limits: dict[str, Any], become: Become) -> NoReturn:
    runner, me = os.getppid(), os.getpid()
    _CHANNEL.append(sock)
    _prctl()  # loaded once here: each forked session would otherwise dlopen libc again (~0.4 ms)
    while True:
        try:
            msg, fds = _recv(sock)
        except (EOFError, OSError, ValueError):
            os._exit(0)
        try:
            if msg.get("op") != "fork" or len(fds) != 3:
                _send(sock, {"id": msg.get("id", ""), "status": "error", "reason": "expected fork with 3 fds"})
                continue
            pid = _fork(fds, cls, limits, runner, become)
            _send(sock, {"id": msg.get("id", ""), "status": "ok" if pid else "error", "pid": pid})
        except OSError:
            os._exit(0)
        finally:
            for fd in fds if os.getpid() == me else ():  # a forked job ending (``_become_session``) closes none
                try:
                    os.close(fd)
                except OSError:
                    pass


_CHANNEL: list[socket.socket] = []
"""The template's own channel to PID 1 (:func:`_serve_forks`), detached in each forked
process (:func:`_become_session`): that process closed its descriptor, and the socket
object must never close the number again, which by then may be one of the process's own
files (an ``exec`` job ends through the interpreter's shutdown, which frees it)."""


def _fork(fds: list[int], cls: Any, limits: dict[str, Any], runner: int, become: Become) -> int:
    """Fork a session (see the module docstring); its pid, or 0 when it did not report."""
    read_end, write_end = os.pipe()
    flush_std()
    intermediate = os.fork()
    if intermediate == 0:
        me = os.getpid()
        try:
            os.close(read_end)
            if os.fork() == 0:
                _become_session(fds, write_end, cls, limits, me, runner, become)
        finally:
            if os.getpid() == me:  # the intermediate; the session only leaves by an exec job's SystemExit
                os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], TEMPLATE_FORK_TIMEOUT_S)
        data = os.read(read_end, 32) if ready else b""
    finally:
        os.close(read_end)
        os.waitpid(intermediate, 0)
    try:
        return int(data.decode("ascii")) if data else 0
    except ValueError:
        return 0


_PRCTL: list[Any] = []
"""libc's ``prctl`` (ctypes), once loaded (:func:`_prctl`)."""


def _prctl() -> Any:
    """libc's ``prctl`` through ctypes, loaded on first use and kept (a template loads it
    before it forks, so its sessions inherit it). Raises what ctypes raises when it cannot."""
    if not _PRCTL:
        import ctypes

        _PRCTL.append(ctypes.CDLL(None).prctl)
    return _PRCTL[0]


def _become_session(fds: list[int], report: int, cls: Any, limits: dict[str, Any], parent: int,
                    runner: int, become: Become) -> NoReturn:
    """In the forked session: own process session, descriptors 0-3 only, death signal,
    pid reported, then the session protocol with ``cls`` preloaded (None: a fresh process
    of the jobs template, a check batch's zygote or a spare). Never returns, but for the
    ``SystemExit`` that ends an ``exec`` job (``child_oneshot.run_job``), which passes up
    to the interpreter's normal shutdown (``atexit`` handlers, threads joined, files
    flushed) and its exit status, as in a spawned process."""
    try:
        if _UNBLOCK:  # forked from the jobs template: signals as the template had them before
            signal.pthread_sigmask(signal.SIG_SETMASK, _UNBLOCK[0])
        os.setsid()
        ctrl, out, err = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((devnull, 0), (out, 1), (err, 2), (ctrl, 3)):
            os.dup2(source, target)
        keep = {0, 1, 2, 3, report}
        for entry in os.listdir("/proc/self/fd"):
            fd = int(entry)
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for channel in _CHANNEL:
            channel.detach()
        deadline = time.monotonic() + TEMPLATE_REPARENT_S
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.0002)
        if os.getppid() != runner:
            os._exit(0)
        try:
            _prctl()(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = 1, SIGKILL: die with the runner
        except Exception:  # noqa: BLE001 - the container dies with PID 1 anyway
            pass
        os.write(report, str(os.getpid()).encode("ascii"))
        os.close(report)
        sys.argv = ["environment"]
        forked = child_session.Session(child_session.CTRL_FD, limits)
        if isinstance(cls, tuple):  # a config template's: the class, the instance, its encodings, retyped keys
            forked.preloaded, forked.preinstance = cls
        else:
            forked.preloaded = cls
        child_session.serve(forked, become)
    except SystemExit:
        raise  # an exec job's end (``child_oneshot.run_job``): the interpreter's shutdown, as when spawned
    except BaseException:  # noqa: BLE001, S110 - the process ends here whatever happened
        pass
    os._exit(0)
