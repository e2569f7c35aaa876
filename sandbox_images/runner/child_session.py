"""Session child: the one process in a sandbox that executes untrusted environment code.

Stdlib only; runs inside the sandbox container as a child of PID 1, one process per
session. The process is started before any untrusted code exists (a "spare",
``child_spare.py``, which confines it and hands it to :func:`serve`), then receives an
``init`` request carrying the environment source (or a request that makes it a one-shot
job or a template instead, ``child_spare.become``). A newly spawned process is sent
``hello`` right before its first session request and answers it at once: PID 1 starts
that request's time limit at the answer, not at the process start. From then on it serves
one request at a time over fd 3 (a socketpair to PID 1, length-prefixed JSON frames, see
``protocol.py``). fd 0 is /dev/null and fds 1/2 are streams PID 1 reads and caps, so
nothing the environment prints can reach the protocol channel.

Semantics follow EnvScaler (the class and the instance: ``child_instance.py``):
- module: the code is executed as a module named ``dynamic_env`` (EnvScaler's name; also
  registered as ``sandpit_env``, the name older snapshots' pickles refer to);
- instance creation (EnvScaler ``init_env_instance``): ``cls(init_config)`` (``cls({})`` for
  an empty config); if that raises ``TypeError``, ``cls()``; then, for a non-empty config,
  ``setattr(instance, key, value)`` for every key; keys that replace an attribute the
  constructor set to a value of another type are listed in the ``init`` reply
  (``retyped``, ``child_instance.retyped_attributes``), an authoring mistake registration reports;
- tool call: ``getattr(instance, name)(**arguments)``; observation ``str(result)``; an
  exception becomes the observation ``"Error: <Type>: <message>"`` plus a bounded
  traceback and the episode goes on;
- state: ``vars(instance)`` without dunder keys (EnvScaler ``get_state_info``): ``_private``
  attributes are state too;
- tools: ``describe`` answers the OpenAI tool schemas of the class (``child_schemas.py``). An
  ``init`` with ``describe_only`` loads the module and checks the class but never
  instantiates it (registration has no ``init_config``); such a session only describes.

State encoding (one entry per attribute), used for deltas, snapshots and restore:
``["j", value]`` JSON-native value (exact types: dict with str keys, list, str, int,
float (finite), bool, None; a dict with a single ``$`` key is not JSON-native:
``wire.json_native``); ``["p", base64, rendering]`` pickle (opaque, only ever decoded inside a
sandbox) plus its JSON rendering (``child_render.py``), which is what the host shows;
``["u", rendering]`` not picklable (cannot be restored; the attribute keeps whatever
``init`` produced). Text is sent as UTF-8: a lone surrogate in an observation or a
``"j"`` value, which UTF-8 cannot carry, arrives as ``?``. In a call's delta, a large JSON
dict or list that changed is sent as ``["k", {"v": 2, "ops": [...]}]``: only its changed
paths, found strictly (``child_delta.py``), applied by PID 1 and the host
(``protocol.apply_keyed``); a snapshot is always whole ``"j"``/``"p"``/``"u"`` entries.

What this process reports is trusted only as far as its own session: the runner matches
replies by a random per-request id and kills the process on any protocol violation.
"""

from __future__ import annotations

import builtins
import os
import time
import types

from . import child_delta
from .child_codec import dumps as _json_text
from .child_codec import loads as _json_value
from .child_instance import flush_std, instantiate, load_class
from .limits import (
    DEFAULT_OBSERVATION_CAP_BYTES,
    KEYED_MIN_BYTES,
    SESSION_TRACEBACK_CHARS,
)
from .wire import (
    ENVSCALER_INVALID_ACTION,
    ENVSCALER_TOOL_ERROR,
    cap_observation,
    error_observation,
    json_native,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any, TypeAlias

    Encoding: TypeAlias = tuple[Any, ...]
    """``("j", json_text)`` | ``("p", base64, rendering_json_text)`` | ``("u",
    rendering_json_text)`` | ``("T", child_delta.Tree)`` (a large JSON dict or list tracked
    path by path, see ``child_delta.py``)."""
    Become: TypeAlias = Callable[[dict[str, Any], "Session"], None]
    """``child_spare.become``: takes a fresh process over for a job or a template."""

# pickle, base64 and traceback are imported where used: most sessions never need them,
# and every spare process would pay for them at start (CPU of the sandbox's quota).

CTRL_FD = 3
"""The control socketpair to PID 1, on the same descriptor in every process it starts."""
HEADER_SIZE = 4


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def _dumps(value: object) -> str:
    """Compact JSON text (``child_codec.dumps``: bound before the environment's code ran,
    so a module that patches ``json`` cannot change a frame)."""
    return _json_text(value)


def _entry_json(enc: Encoding) -> str:
    """Wire form of an encoding: ``["j",<json>]``, ``["p","<b64>",<rendering>]``, ``["u",<rendering>]``."""
    if enc[0] == "j":
        return f'["j",{enc[1]}]'
    if enc[0] == "p":
        return f'["p",{_dumps(enc[1])},{enc[2]}]'
    return f'["u",{enc[1]}]'


def decode_entry(entry: list[Any]) -> tuple[object, bool]:
    """The value of one encoded attribute and whether it is restorable: ``"j"`` its
    value, ``"p"`` the unpickled object, ``"u"`` its rendering (not restorable). An
    unpickling error propagates (the caller reports it)."""
    kind = entry[0]
    if kind == "j":
        return entry[1], True
    if kind == "p":
        import base64
        import pickle

        return pickle.loads(base64.b64decode(entry[1])), True
    return entry[1] if len(entry) > 1 else None, False


def _rendering(value: object) -> str:
    """JSON text of ``value``'s rendering (``child_render.py``)."""
    rendered, _truncated = _render().render(value)
    return _dumps(rendered)


def encode_value(value: object, cached: Encoding | None) -> Encoding:
    """Encode one attribute (see the module docstring); returns ``cached`` itself when
    the encoding did not change (the caller then sends nothing for it)."""
    try:
        text = _dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = None
    if text is not None:
        if cached is not None and cached[0] == "j" and cached[1] == text:
            return cached
        if json_native(value):
            return ("j", text)
    import base64
    import pickle

    try:
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        raise
    except RecursionError:
        blob = None
    except Exception:  # unpicklable: locks, generators, modules, lambdas...
        blob = None
    if blob is None:
        rendering = _rendering(value)
        if cached is not None and cached[0] == "u" and cached[1] == rendering:
            return cached
        return ("u", rendering)
    encoded = base64.b64encode(blob).decode("ascii")
    if cached is not None and cached[0] == "p" and cached[1] == encoded:
        return cached
    return ("p", encoded, _rendering(value))


def tree_delta(value: object, tree: child_delta.Tree) -> tuple[str, child_delta.Tree] | None:
    """Path-level changes of a large JSON attribute since ``tree`` (``child_delta.py``):
    ``("", tree)`` when nothing changed, ``(entry JSON text, tree)`` with the entry
    ``["k", {"v": 2, "ops": [...]}]`` otherwise, or None when the value must be encoded
    whole (no longer JSON-native, or too many changes). Strict: ``1`` -> ``1.0`` ->
    ``True`` and a reordering of keys are changes, at any depth."""
    if type(value) is not dict and type(value) is not list:
        return None
    ops = child_delta.Ops(_dumps, json_native)
    try:
        tree = child_delta.check(tree, value, [], ops, 0)
    except child_delta.Abort:
        return None
    if not ops.texts:
        return "", tree
    return '["k",{"v":2,"ops":[' + ",".join(ops.texts) + "]}]", tree


class Session:
    """One environment instance and its encoded-state cache."""

    def __init__(self, ctrl_fd: int, limits: dict[str, Any]) -> None:
        self.fd = ctrl_fd
        self.limits = limits
        self.instance: object | None = None
        self.cls: type | None = None
        self.describe_only = False
        self.cache: dict[str, Encoding] = {}
        self.preloaded: type | None = None
        """The class already loaded by the template this process was forked from
        (``child_template.py``); ``op_init`` then skips executing the source."""
        self.preinstance: tuple[object, dict[str, Encoding], list[dict[str, str]]] | None = None
        """The instance, its encoding cache and its construction's retyped attributes kept
        by the config template this process was forked from; an ``init`` with
        ``from_template`` takes them as they are."""
        self.retyped: list[dict[str, str]] = []
        """``init_config`` keys that replaced a constructed attribute with a value of
        another type (:func:`child_instance.retyped_attributes`), reported in the ``init`` reply."""

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

    def recv(self) -> dict[str, Any]:
        length = int.from_bytes(self._read_exact(HEADER_SIZE), "big")
        message: dict[str, Any] = _json_value(self._read_exact(length).decode("utf-8"))
        return message

    def send_text(self, body: str) -> None:
        data = body.encode("utf-8", "replace")  # a lone surrogate (not UTF-8) becomes "?"
        payload = len(data).to_bytes(HEADER_SIZE, "big") + data
        view_ = memoryview(payload)
        while view_:
            written = os.write(self.fd, view_)
            view_ = view_[written:]

    def reply(self, request_id: str, fields: dict[str, Any], raw: dict[str, str] | None = None) -> None:
        """Send ``fields`` plus pre-serialized JSON members ``raw`` (name -> JSON text)."""
        body = _dumps({"id": request_id, **fields})
        if raw:
            extra = ",".join(f"{_dumps(k)}:{v}" for k, v in raw.items())
            body = body[:-1] + "," + extra + "}"
        self.send_text(body)

    # -- state -----------------------------------------------------------------------
    def state_attrs(self) -> dict[str, object]:
        """EnvScaler's state: ``vars(instance)`` without dunder keys (``_private`` kept)."""
        try:
            attrs = object.__getattribute__(self.instance, "__dict__")
        except Exception:  # noqa: BLE001 - no __dict__ (slots) or a hostile descriptor
            return {}
        if not isinstance(attrs, dict):
            return {}
        return {k: v for k, v in list(dict.items(attrs))
                if type(k) is str and not (k.startswith("__") and k.endswith("__"))}

    def delta_json(self, full: bool = False) -> str:
        """Re-encode the state; return a JSON object ``{"set": {...}, "del": [...]}``
        holding only what changed since the last call (everything when ``full``). A large
        JSON dict or list (at least KEYED_MIN_BYTES encoded) is tracked by a
        ``child_delta.Tree`` and sends its changed paths (:func:`tree_delta`)."""
        current = self.state_attrs()
        changed: list[str] = []
        new_cache: dict[str, Encoding] = {}
        for name, value in current.items():
            old = self.cache.get(name)
            if not full and old is not None and old[0] == "T":
                part = tree_delta(value, old[1])
                if part is not None:
                    new_cache[name] = ("T", part[1])
                    if part[0]:
                        changed.append(f"{_dumps(name)}:{part[0]}")
                    continue
            enc = encode_value(value, old if old is not None and old[0] != "T" else None)
            if enc[0] == "j" and type(value) in (dict, list) and len(enc[1]) >= KEYED_MIN_BYTES:
                new_cache[name] = ("T", child_delta.Tree(value, 0))
            else:
                new_cache[name] = enc
            if full or enc is not old:
                changed.append(f"{_dumps(name)}:{_entry_json(enc)}")
        removed = [] if full else [k for k in self.cache if k not in new_cache]
        self.cache = new_cache
        return '{"set":{' + ",".join(changed) + '},"del":' + _dumps(removed) + "}"

    def state_json(self) -> str:
        """The current state's rendering (what the host shows): JSON-native attributes as
        they are, others as their ``child_render.py`` rendering."""
        parts = []
        for name, value in self.state_attrs().items():
            enc = self.cache.get(name)
            if enc is not None and enc[0] == "j":
                parts.append(f"{_dumps(name)}:{enc[1]}")
            elif enc is not None and enc[0] == "T":
                parts.append(f"{_dumps(name)}:{_dumps(value)}")
            else:
                enc = encode_value(value, None)
                parts.append(f"{_dumps(name)}:{enc[1] if enc[0] == 'j' else enc[-1]}")
        return "{" + ",".join(parts) + "}"

    def apply_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Set every restorable attribute from ``snapshot`` and drop attributes it does
        not name (``"u"`` entries keep the value ``init`` produced)."""
        attrs = self.state_attrs()
        for name in attrs:
            if name not in snapshot:
                delattr(self.instance, name)
        for name, entry in snapshot.items():
            value, restorable = decode_entry(entry)
            if restorable:
                setattr(self.instance, name, value)

    # -- operations ------------------------------------------------------------------
    def op_init(self, msg: dict[str, Any]) -> bool:
        """Load the class and instantiate it (see the module docstring); True when the
        instance was taken from the config template (``from_template``: nothing ran)."""
        workdir = msg["workdir"]
        os.chdir(workdir)
        os.environ["HOME"] = workdir
        os.environ["TMPDIR"] = workdir
        if msg.get("from_template") is True:
            if self.preinstance is None or self.preloaded is None:
                raise RuntimeError("this process was not forked from a config template")
            self.cls, self.preloaded = self.preloaded, None
            (self.instance, self.cache, self.retyped), self.preinstance = self.preinstance, None
            return True
        self.preinstance = None
        seed = msg.get("seed")
        if type(seed) is int:  # EnvScaler's reset(seed=...): random.seed first, then the module and the
            import random  # instance (PID 1 never forks a seeded session from a template)

            random.seed(seed)
        if self.preloaded is not None:  # forked from a template that executed the same source
            cls, self.preloaded = self.preloaded, None
        else:
            cls = load_class(msg["source"], msg["class_name"])
        self.cls = cls
        if msg.get("describe_only"):
            self.describe_only = True
            return False
        self.instance = instantiate(cls, msg.get("init_config") or {}, self.retyped)
        if msg.get("snapshot"):
            self.apply_snapshot(msg["snapshot"])
        return False

    def op_describe(self) -> tuple[str, str, list[str]]:
        """Tool schemas of the class (``describe_only``) or of the instance's type:
        ``("ok", JSON text of the tool list, notes)``, or ``("rejected", observation, [])``
        when the class exceeds a cap of ``child_schemas.py``."""
        schemas = _schemas()
        target = self.cls if self.describe_only else type(self.instance)
        try:
            tools, notes = schemas.describe_class(target)
        except schemas.SchemaLimitError as exc:
            return "rejected", error_observation(exc), []
        return "ok", _dumps(tools), notes

    def op_call(self, msg: dict[str, Any]) -> tuple[str, str, str | None]:
        """One tool call: ``(status, observation, traceback)``. With ``rules:
        "envscaler"`` EnvScaler's ``step()`` decides what a call is: any attribute
        ``hasattr`` finds (``_private`` ones and non-callable state attributes too; calling
        the latter raises ``TypeError``), else ``rejected`` with ``Error: Invalid
        action``. Otherwise (Sandpit's rules) only public methods are tools. What the
        tool raises propagates to :func:`serve`."""
        if self.describe_only:
            return "rejected", "Error: this session only describes the environment; it has no instance", None
        name = msg["name"]
        arguments = msg["arguments"]
        if msg.get("rules") == "envscaler":
            if not isinstance(name, str) or not isinstance(arguments, dict):
                return "rejected", ENVSCALER_INVALID_ACTION, None
            if not hasattr(self.instance, name):
                return "rejected", ENVSCALER_INVALID_ACTION, None
            return "ok", f"{getattr(self.instance, name)(**arguments)}", None
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
    ``inspect``/``typing``)."""
    from . import child_schemas as schemas

    return schemas


def _render() -> types.ModuleType:
    """The rendering module, imported on first use like :func:`_schemas`."""
    from . import child_render as render

    return render


def bounded_traceback(exc: BaseException) -> str:
    """The last 8 frames of ``exc``'s traceback without the runner's own frames, at most
    SESSION_TRACEBACK_CHARS characters (head and tail kept)."""
    import traceback

    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8)
    text = "".join(line for line in lines if "sandbox_images/runner" not in line and "/opt/sandpit/" not in line)
    if len(text) > SESSION_TRACEBACK_CHARS:  # keep where it started and where it failed
        head = SESSION_TRACEBACK_CHARS // 4
        tail = SESSION_TRACEBACK_CHARS - head
        text = text[:head] + f"\n...[{len(text) - SESSION_TRACEBACK_CHARS} characters cut]...\n" + text[-tail:]
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


RUNNER_PATHS = ("sandbox_images/runner", "/opt/sandpit/")


def envscaler_traceback(exc: BaseException) -> str:
    """``traceback.format_exc()`` of ``exc`` as EnvScaler's ``step()`` records it after
    ``Error: <Exception>\n``, with the runner's frames left out (EnvScaler's own
    ``step`` frame, which names its install path, has no counterpart here): the header,
    the environment's frames named ``<string>`` (EnvScaler ``exec``s the code without a
    file name, so no source line is shown), frames of the standard library as Python
    prints them, then the exception, with its chained causes."""
    import traceback

    def strip(part: traceback.TracebackException) -> None:
        frames = []
        for frame in part.stack:
            if any(path in frame.filename for path in RUNNER_PATHS):
                continue
            if frame.filename == "<environment>":
                frame = traceback.FrameSummary("<string>", frame.lineno, frame.name, lookup_line=False, line="")
            frames.append(frame)
        part.stack = traceback.StackSummary.from_list(frames)
        for chained in (part.__cause__, part.__context__):
            if chained is not None:
                strip(chained)

    try:
        summary = traceback.TracebackException(type(exc), exc, exc.__traceback__, lookup_lines=False)
        strip(summary)
        lines = list(summary.format(chain=True))
        if not summary.stack:  # EnvScaler's header is always there: its own frame precedes the tool's
            only = list(summary.format_exception_only())
            lines[len(lines) - len(only):len(lines) - len(only)] = ["Traceback (most recent call last):\n"]
        return "".join(lines)
    except Exception:  # noqa: BLE001 - a hostile exception's __str__
        return f"Traceback (most recent call last):\n{type(exc).__name__}: <unprintable>\n"


HANDOVER_OPS = frozenset({"exec", "checks", "template", "config_template"})
"""Requests that make a process holding no environment class something else than a
session (``child_spare.become``)."""


def serve(session: Session, become: Become | None = None) -> None:
    """Serve the session protocol on ``session``'s control descriptor, one request at a
    time, until PID 1 closes it (or a read fails). While the process holds no class, a
    request of HANDOVER_OPS is first offered to ``become``, which does not return when it
    takes the process over. A MemoryError is answered ``oom`` and the process exits."""
    max_obs = int(session.limits.get("observation_cap_bytes", DEFAULT_OBSERVATION_CAP_BYTES))
    while True:
        try:
            msg = session.recv()
        except (EOFError, OSError):
            return
        request_id = msg.get("id", "")
        op = msg.get("op")
        if op == "rehearse":  # a spare forked ahead rehearses an open (child_spare.become): never answered
            if become is not None and session.cls is None:
                become(msg, session)
            continue
        if become is not None and session.cls is None and op in HANDOVER_OPS:
            become(msg, session)  # what the process becomes never comes back here
        _reap_children()
        try:
            if op == "init":
                try:
                    kept = session.op_init(msg)
                except MemoryError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - reported, not fatal
                    session.reply(request_id, {
                        "status": "error", "observation": error_observation(exc),
                        "traceback": bounded_traceback(exc)})
                    return
                done: dict[str, Any] = {"status": "ok", "retyped": session.retyped} if session.retyped \
                    else {"status": "ok"}
                if kept:  # the template's state is this instance's: PID 1 has its encoding
                    session.reply(request_id, {**done, "from_template": True}, {"delta": '{"set":{},"del":[]}'})
                else:
                    session.reply(request_id, done, {"delta": session.delta_json(full=True)})
            elif op == "call":
                started = time.perf_counter()
                traceback_text = None
                try:
                    status, observation, traceback_text = session.op_call(msg)
                except MemoryError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - EnvScaler: errors are observations
                    status = "error"
                    if msg.get("rules") == "envscaler":
                        observation = ENVSCALER_TOOL_ERROR + envscaler_traceback(exc)
                    else:
                        observation = error_observation(exc)
                    traceback_text = bounded_traceback(exc)
                duration_ms = (time.perf_counter() - started) * 1000.0
                observation, truncated = cap_observation(observation, max_obs)
                flush_std()
                fields = {"status": status, "observation": observation, "duration_ms": duration_ms}
                if truncated:
                    fields["observation_truncated"] = True
                if traceback_text:
                    fields["traceback"] = traceback_text
                session.reply(request_id, fields, {"delta": session.delta_json()})
            elif op == "hello":  # PID 1 times the next request from this answer on
                session.reply(request_id, {"status": "ok"})
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
            flush_std()
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
        status, text, notes = "error", error_observation(exc)[:SESSION_TRACEBACK_CHARS], []
        traceback_text: str | None = bounded_traceback(exc)
    else:
        traceback_text = None
    flush_std()
    if status == "ok":
        session.reply(request_id, {"status": "ok", "notes": notes}, {"tools": text})
    else:
        fields = {"status": status, "observation": text}
        if traceback_text:
            fields["traceback"] = traceback_text
        session.reply(request_id, fields)
