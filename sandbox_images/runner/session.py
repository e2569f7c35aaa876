"""Session child: the one process in a sandbox that executes untrusted environment code.

Stdlib only; runs inside the sandbox container as a child of the runner (``runner.py``),
one process per session. It is started before any untrusted code exists ("spare"), then
receives an ``init`` request carrying the environment source (or, as its first and only
request, a one-shot ``exec``/``checks`` job, handed over to ``oneshot.py``). From then on it serves one
request at a time over fd 3 (a socketpair to the runner, length-prefixed JSON frames, see
``protocol.py``). fd 0 is /dev/null and fds 1/2 are pipes the runner reads and caps, so
nothing the environment prints can reach the protocol channel.

Semantics follow EnvScaler:
- instance creation: ``cls(init_config)`` when ``__init__`` takes a positional parameter,
  otherwise ``cls()`` followed by ``setattr(instance, key, value)`` for every config key;
- tool call: ``getattr(instance, name)(**arguments)``; observation ``str(result)``; an
  exception becomes the observation ``"Error: <Type>: <message>"`` plus a bounded
  traceback and the episode goes on;
- state: the instance's public attributes (``vars(instance)`` minus names starting ``_``);
- tools: ``describe`` answers the OpenAI tool schemas of the class (``schemas.py``). An
  ``init`` with ``describe_only`` loads the module and checks the class but never
  instantiates it (registration has no ``init_config``); such a session only describes.

State encoding (one entry per public attribute), used for deltas, snapshots and restore:
``["j", value]`` JSON-native value (exact types: dict with str keys, list, str, int,
float (finite), bool, None); ``["p", base64]`` pickle (opaque, only ever decoded inside a
sandbox); ``["u", repr]`` neither (cannot be restored; the attribute keeps whatever
``init`` produced). Text is sent as UTF-8: a lone surrogate in an observation or a
``"j"`` value, which UTF-8 cannot carry, arrives as ``?``.

What this process reports is trusted only as far as its own session: the runner matches
replies by a random per-request id and kills the process on any protocol violation.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import types

# pickle, base64 and traceback are imported where used: most sessions never need them,
# and every spare process would pay for them at start (CPU of the sandbox's quota).

CTRL_FD = 3
MODULE_NAME = "sandpit_env"
JSON_SCALARS = (str, int, float, bool, type(None))
TRACEBACK_LIMIT_BYTES = 4096
UNSERIALIZABLE_REPR_BYTES = 1024
VIEW_MAX_DEPTH = 12
VIEW_MAX_ITEMS = 10000

HEADER_SIZE = 4
IMAGE_PACKAGES = "/usr/lib/python3/dist-packages"
"""Debian-packaged libraries of the image (``base.json``'s ``include``, e.g. mpmath). The
child runs with ``-S`` (no ``site``), so this is appended to ``sys.path`` explicitly, after
the standard library. Not a boundary: environment code could append it itself."""


def _json_native(value: object) -> bool:
    """True when ``value`` round-trips through JSON with exact types (iterative walk)."""
    stack = [value]
    seen = 0
    while stack:
        item = stack.pop()
        kind = type(item)
        seen += 1
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is float:
            if item != item or item in (float("inf"), float("-inf")):
                return False
            continue
        if kind is dict:
            for key, sub in item.items():
                if type(key) is not str:
                    return False
                stack.append(sub)
            continue
        if kind is list:
            stack.extend(item)
            continue
        return False
    return True


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_value(value: object, cached: tuple[str, str] | None) -> tuple[str, str]:
    """Encode one attribute. Returns ``(kind, text)``; for ``"j"`` the text is JSON."""
    try:
        text = _dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = None
    if text is not None:
        if cached is not None and cached[0] == "j" and cached[1] == text:
            return cached
        if _json_native(value):
            return ("j", text)
    import base64
    import pickle

    try:
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        raise
    except Exception:  # unpicklable: locks, generators, modules, lambdas...
        return ("u", _bounded_repr(value))
    encoded = base64.b64encode(blob).decode("ascii")
    if cached is not None and cached[0] == "p" and cached[1] == encoded:
        return cached
    return ("p", encoded)


KEYED_MIN_BYTES = 32 * 1024
"""JSON objects whose encoding is at least this large are tracked key by key: a call that
changes a few records sends ``["k", {"set": {key: value}, "del": [key]}]`` instead of the
whole object (runner and host merge it into their snapshots)."""
_MISSING = object()


def keyed_delta(value: dict, previous: dict) -> str | None:
    """Key-level changes of a large JSON object since ``previous`` (a private JSON copy
    of its last encoding, updated in place). Returns ``""`` when nothing changed, the
    JSON text of a ``["k", ...]`` entry otherwise, or None when the object is no longer
    JSON-native (the caller re-encodes it whole).

    Equality is Python's ``==`` (C speed): a change that keeps values equal but alters
    their type (``1`` -> ``1.0`` or ``True``) inside a record, or only reorders keys, is not
    seen until that record changes otherwise (a top-level value's type change is seen)."""
    if value == previous:
        return ""
    sets: list[tuple[str, str]] = []
    added = 0
    for key, item in value.items():
        if type(key) is not str:
            return None
        before = previous.get(key, _MISSING)
        if before is _MISSING:
            added += 1
        elif type(before) is type(item) and before == item:
            continue
        if not _json_native(item):
            return None
        try:
            sets.append((key, _dumps(item)))
        except (TypeError, ValueError, RecursionError):
            return None
    removed = [key for key in previous if key not in value] if len(previous) + added != len(value) else []
    for key, text in sets:
        previous[key] = json.loads(text)
    for key in removed:
        del previous[key]
    body = ",".join(f"{_dumps(key)}:{text}" for key, text in sets)
    return '["k",{"set":{' + body + '},"del":' + _dumps(removed) + "}]"


def _bounded_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a hostile __repr__
        text = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
    return text[:UNSERIALIZABLE_REPR_BYTES]


def view(value: object, depth: int = 0) -> object:
    """Best-effort JSON rendering of any value, for showing opaque state to clients.

    Objects with ``__dict__`` become ``{"__class__": name, <public attrs>...}``; sets and
    tuples become lists; dict keys become strings; anything else becomes its repr.
    Bounded by depth and item count so a cyclic or huge structure still renders.
    """
    if value is None or type(value) in (str, int, bool):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    if depth >= VIEW_MAX_DEPTH:
        return _bounded_repr(value)
    if isinstance(value, dict):
        return {str(k): view(v, depth + 1) for k, v in list(value.items())[:VIEW_MAX_ITEMS]}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)[:VIEW_MAX_ITEMS]
        if isinstance(value, (set, frozenset)):
            try:
                items = sorted(items)
            except TypeError:
                pass
        return [view(v, depth + 1) for v in items]
    if isinstance(value, (str, int)):  # subclasses such as enums
        return value if not hasattr(value, "name") else str(value)
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        out: dict[str, object] = {"__class__": type(value).__name__}
        for key, sub in list(attrs.items())[:VIEW_MAX_ITEMS]:
            if not str(key).startswith("_"):
                out[str(key)] = view(sub, depth + 1)
        return out
    return _bounded_repr(value)


class Session:
    """One environment instance and its encoded-state cache."""

    def __init__(self, ctrl_fd: int, limits: dict) -> None:
        self.fd = ctrl_fd
        self.limits = limits
        self.instance: object | None = None
        self.cls: type | None = None
        self.describe_only = False
        self.cache: dict[str, tuple[str, str]] = {}

    # -- framing ---------------------------------------------------------------------
    def _read_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = os.read(self.fd, min(n, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv(self) -> dict:
        length = int.from_bytes(self._read_exact(HEADER_SIZE), "big")
        return json.loads(self._read_exact(length).decode("utf-8"))

    def send_text(self, body: str) -> None:
        data = body.encode("utf-8", "replace")  # a lone surrogate (not UTF-8) becomes "?"
        payload = len(data).to_bytes(HEADER_SIZE, "big") + data
        view_ = memoryview(payload)
        while view_:
            written = os.write(self.fd, view_)
            view_ = view_[written:]

    def reply(self, request_id: str, fields: dict, raw: dict[str, str] | None = None) -> None:
        """Send ``fields`` plus pre-serialized JSON members ``raw`` (name -> JSON text)."""
        body = _dumps({"id": request_id, **fields})
        if raw:
            extra = ",".join(f"{_dumps(k)}:{v}" for k, v in raw.items())
            body = body[:-1] + "," + extra + "}"
        self.send_text(body)

    # -- state -----------------------------------------------------------------------
    def public_attrs(self) -> dict[str, object]:
        attrs = getattr(self.instance, "__dict__", None)
        if not isinstance(attrs, dict):
            return {}
        return {k: v for k, v in list(attrs.items()) if isinstance(k, str) and not k.startswith("_")}

    def delta_json(self, full: bool = False) -> str:
        """Re-encode the state; return a JSON object ``{"set": {...}, "del": [...]}``
        holding only what changed since the last call (everything when ``full``)."""
        current = self.public_attrs()
        changed: list[str] = []
        new_cache: dict[str, tuple[str, str]] = {}
        for name, value in current.items():
            old = self.cache.get(name)
            if not full and old is not None and old[0] == "K" and type(value) is dict:
                part = keyed_delta(value, old[1])  # type: ignore[arg-type]
                if part is not None:
                    new_cache[name] = old
                    if part:
                        changed.append(f"{_dumps(name)}:{part}")
                    continue
            enc = encode_value(value, old if old is not None and old[0] != "K" else None)
            if enc[0] == "j" and type(value) is dict and len(enc[1]) >= KEYED_MIN_BYTES:
                new_cache[name] = ("K", json.loads(enc[1]))  # type: ignore[assignment]
            else:
                new_cache[name] = enc
            if full or enc is not old:
                if enc[0] == "j":
                    changed.append(f'{_dumps(name)}:["j",{enc[1]}]')
                else:
                    changed.append(f"{_dumps(name)}:{_dumps([enc[0], enc[1]])}")
        removed = [] if full else [k for k in self.cache if k not in new_cache]
        self.cache = new_cache
        return '{"set":{' + ",".join(changed) + '},"del":' + _dumps(removed) + "}"

    def state_json(self) -> str:
        parts = []
        for name, value in self.public_attrs().items():
            enc = self.cache.get(name)
            if enc is not None and enc[0] == "j":
                parts.append(f"{_dumps(name)}:{enc[1]}")
            else:
                parts.append(f"{_dumps(name)}:{_dumps(view(value))}")
        return "{" + ",".join(parts) + "}"

    def apply_snapshot(self, snapshot: dict) -> None:
        """Set every restorable attribute from ``snapshot`` and drop public attributes it
        does not name (``"u"`` entries keep the value ``init`` produced)."""
        import base64
        import pickle

        attrs = self.public_attrs()
        for name in attrs:
            if name not in snapshot:
                delattr(self.instance, name)
        for name, entry in snapshot.items():
            kind, data = entry[0], entry[1]
            if kind == "j":
                setattr(self.instance, name, data)
            elif kind == "p":
                setattr(self.instance, name, pickle.loads(base64.b64decode(data)))

    # -- operations ------------------------------------------------------------------
    def op_init(self, msg: dict) -> None:
        workdir = msg["workdir"]
        os.chdir(workdir)
        os.environ["HOME"] = workdir
        os.environ["TMPDIR"] = workdir
        module = types.ModuleType(MODULE_NAME)
        module.__file__ = "<environment>"
        sys.modules[MODULE_NAME] = module
        code = compile(msg["source"], "<environment>", "exec")
        exec(code, module.__dict__)  # noqa: S102 - this is the sandbox
        name = msg["class_name"]
        if name not in module.__dict__:
            raise LookupError(f"class {name!r} is not defined by the environment code")
        cls = module.__dict__[name]
        if not issubclass(type(cls), type):  # its real type: a forged __class__ does not count
            raise TypeError(f"{name!r} is not a class (the environment code binds it to a "
                            f"{type(cls).__name__})")
        self.cls = cls
        if msg.get("describe_only"):
            self.describe_only = True
            return
        config = msg.get("init_config") or {}
        if _takes_positional(cls):
            self.instance = cls(config)
        else:
            self.instance = cls()
            for key, value in config.items():
                setattr(self.instance, key, value)
        if msg.get("snapshot"):
            self.apply_snapshot(msg["snapshot"])

    def op_describe(self) -> tuple[str, str, list[str]]:
        """Tool schemas of the class (``describe_only``) or of the instance's type:
        ``("ok", JSON text of the tool list, notes)``, or ``("rejected", observation, [])``
        when the class exceeds a cap of ``schemas.py``."""
        schemas = _schemas()
        target = self.cls if self.describe_only else type(self.instance)
        try:
            tools, notes = schemas.describe_class(target)  # type: ignore[arg-type]
        except schemas.SchemaLimitError as exc:
            return "rejected", _error_observation(exc), []
        return "ok", _dumps(tools), notes

    def op_call(self, msg: dict) -> tuple[str, str, str | None]:
        if self.describe_only:
            return "rejected", "Error: this session only describes the environment; it has no instance", None
        name = msg["name"]
        arguments = msg["arguments"]
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            return "rejected", f"Error: {name!r} is not a public tool name", None
        if not isinstance(arguments, dict):
            return "rejected", "Error: arguments must be a JSON object", None
        tool = getattr(type(self.instance), name, None)
        if tool is None or isinstance(tool, (property, type)):  # before getattr: never run a getter
            return "rejected", f"Error: {name!r} is not a tool of this environment", None
        bound = getattr(self.instance, name, None)
        if bound is None or not callable(bound):
            return "rejected", f"Error: {name!r} is not a tool of this environment", None
        result = bound(**arguments)
        return "ok", str(result), None


def _schemas() -> types.ModuleType:
    """The schema module, imported on first use (sessions that only call never pay for
    ``inspect``/``typing``): a sibling file in the sandbox, a package module on the host."""
    if __package__:
        from . import schemas
    else:  # run as a script: its directory is sys.path[0]
        import schemas  # type: ignore[no-redef]
    return schemas


def _oneshot() -> types.ModuleType:
    """The one-shot job module (scripts, check functions), imported on first use like
    :func:`_schemas`."""
    if __package__:
        from . import oneshot
    else:
        import oneshot  # type: ignore[no-redef]
    return oneshot


def _confine() -> types.ModuleType:
    """The seccomp module (``confine.py``), a sibling file like :func:`_schemas`."""
    if __package__:
        from . import confine
    else:
        import confine  # type: ignore[no-redef]
    return confine


def _takes_positional(cls: type) -> bool:
    init = cls.__dict__.get("__init__")
    for klass in cls.__mro__:
        if "__init__" in klass.__dict__:
            init = klass.__dict__["__init__"]
            break
    code = getattr(init, "__code__", None)
    if code is None:
        return False
    return code.co_argcount >= 2 or bool(code.co_flags & 0x04)  # CO_VARARGS


def _bounded_traceback(exc: BaseException) -> str:
    import traceback

    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8)
    text = "".join(line for line in lines if "sandbox_images/runner" not in line and "/opt/sandpit/" not in line)
    if len(text) > TRACEBACK_LIMIT_BYTES:  # keep where it started and where it failed
        head = TRACEBACK_LIMIT_BYTES // 4
        tail = TRACEBACK_LIMIT_BYTES - head
        text = text[:head] + f"\n...[{len(text) - TRACEBACK_LIMIT_BYTES} characters cut]...\n" + text[-tail:]
    return text


def _reap_children() -> None:
    """Collect exited children the environment forked and never waited for, so that
    zombies do not hold pids of the sandbox's pids cgroup until the session ends."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except OSError:
            return
        if pid == 0:
            return


def _error_observation(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable exception>"
    return f"Error: {type(exc).__name__}: {message}" if message else f"Error: {type(exc).__name__}"


def _cap(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"\n...[truncated {len(text) - limit} characters]", True


def harden(limits: dict) -> None:
    """Per-session limits, set before any untrusted code exists. Hard limits equal soft
    ones so the environment cannot raise them again.

    Memory: ``session_memory_bytes`` as RLIMIT_DATA, or as RLIMIT_AS when
    ``memory_rlimit`` is ``"as"`` (gVisor ignores RLIMIT_DATA and checks RLIMIT_AS at
    every mmap/brk). Over it an allocation fails with MemoryError (status ``oom``).
    Then the seccomp filter of ``confine.py`` (no SysV IPC, POSIX message queues or
    keyrings, which would outlive the session's processes; no changing another
    process's limits or priority); if it cannot be installed the process exits (status
    70) rather than run code unconfined."""
    memory = int(limits.get("session_memory_bytes", 0))
    if memory > 0:
        kind = resource.RLIMIT_AS if limits.get("memory_rlimit") == "as" else resource.RLIMIT_DATA
        resource.setrlimit(kind, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nofile = int(limits.get("session_nofile", 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    try:  # non-dumpable: other sessions (same uid) cannot ptrace us or read /proc/<pid>/*
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = 1, SIGKILL: die with the runner
    except Exception:  # pragma: no cover - ctypes missing: limits still hold
        pass
    if limits.get("confine", True):
        try:
            _confine().install_filter()
        except Exception as exc:  # noqa: BLE001 - never run untrusted code unconfined
            sys.stderr.write(f"sandpit-session: cannot confine the process: {exc}\n")
            os._exit(70)


def serve(session: Session) -> None:
    max_obs = int(session.limits.get("observation_cap_bytes", 1 << 20))
    while True:
        try:
            msg = session.recv()
        except (EOFError, OSError):
            return
        request_id = msg.get("id", "")
        op = msg.get("op")
        if op in ("exec", "checks") and session.cls is None:  # a fresh spare's one-shot job
            _oneshot().run_job(msg, session.fd)  # never returns
        _reap_children()
        try:
            if op == "init":
                try:
                    session.op_init(msg)
                except MemoryError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - reported, not fatal
                    session.reply(request_id, {
                        "status": "error", "observation": _error_observation(exc),
                        "traceback": _bounded_traceback(exc)})
                    return
                session.reply(request_id, {"status": "ok"}, {"delta": session.delta_json(full=True)})
            elif op == "call":
                started = time.perf_counter()
                traceback_text = None
                try:
                    status, observation, traceback_text = session.op_call(msg)
                except MemoryError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - EnvScaler: errors are observations
                    status, observation = "error", _error_observation(exc)
                    traceback_text = _bounded_traceback(exc)
                duration_ms = (time.perf_counter() - started) * 1000.0
                observation, truncated = _cap(observation, max_obs)
                _flush_std()
                fields = {"status": status, "observation": observation, "duration_ms": duration_ms}
                if truncated:
                    fields["observation_truncated"] = True
                if traceback_text:
                    fields["traceback"] = traceback_text
                session.reply(request_id, fields, {"delta": session.delta_json()})
            elif op == "describe":
                _describe(session, request_id)
            elif op == "state":
                session.reply(request_id, {"status": "ok"}, {"state": session.state_json()})
            elif op == "restore":
                session.apply_snapshot(msg["snapshot"])
                session.cache = {}
                session.reply(request_id, {"status": "ok"}, {"delta": session.delta_json(full=True)})
            else:
                session.reply(request_id, {"status": "rejected", "observation": f"unknown op {op!r}"})
        except MemoryError:
            _flush_std()
            try:
                session.reply(request_id, {"status": "oom", "observation": "Error: MemoryError: session memory limit reached"})
            finally:
                os._exit(0)


def _describe(session: Session, request_id: str) -> None:
    """Answer ``describe``: ``{status: ok, tools, notes}``; a cap exceeded is ``rejected``;
    anything the class raises (even SystemExit) is ``error`` with a bounded traceback;
    MemoryError propagates (``oom``)."""
    try:
        status, text, notes = session.op_describe()
    except MemoryError:
        raise
    except BaseException as exc:  # noqa: BLE001 - hostile classes: reported, not fatal
        status, text, notes = "error", _error_observation(exc)[:TRACEBACK_LIMIT_BYTES], []
        traceback_text: str | None = _bounded_traceback(exc)
    else:
        traceback_text = None
    _flush_std()
    if status == "ok":
        session.reply(request_id, {"status": "ok", "notes": notes}, {"tools": text})
    else:
        fields = {"status": status, "observation": text}
        if traceback_text:
            fields["traceback"] = traceback_text
        session.reply(request_id, fields)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def main() -> None:
    limits = json.loads(os.environ.pop("SANDPIT_SESSION_LIMITS", "{}"))
    harden(limits)
    sys.argv = ["environment"]
    if os.path.isdir(IMAGE_PACKAGES) and IMAGE_PACKAGES not in sys.path:
        sys.path.append(IMAGE_PACKAGES)
    serve(Session(CTRL_FD, limits))
    os._exit(0)


if __name__ == "__main__":
    main()
