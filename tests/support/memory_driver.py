"""An in-memory :class:`~sandpit.executor.pool.driver.SandboxDriver` for unit tests of the
pool: a sandbox is an object whose "runner" answers the runner protocol's requests from
Python callables, so placement, sessions, recycling and one-shot jobs run through the real
``SandboxPool`` with no container and no process.

It never executes the source it is given: an environment is a dict of *tools*, callables
``tool(state, **arguments)`` over a plain state dict whose values are JSON (encoded
``["j", value]``, as the real runner encodes JSON-native attributes). What it answers has
the shapes the real runner's replies have for those requests (``open``, ``call``,
``restore``, ``describe``, ``snapshot``, ``close``, ``recycle``, ``exec``, ``checks``).

Handles can be made to misbehave: :meth:`MemorySandbox.kill` (the next request raises
``SandboxLost``), ``dirty`` (a recycle is refused as unclean), ``memory_bytes`` (what
admission reads).
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

from sandpit.executor.errors import SandboxLost, SandboxStartError
from sandpit.executor.profiles import ResourceProfile

Tool = Callable[..., object]


class MemorySandbox:
    """One in-memory sandbox of one tenant (a :class:`SandboxHandle`)."""

    def __init__(self, sandbox_id: str, tenant: str, tools: dict[str, Tool], memory_limit: int = 0) -> None:
        self.id = sandbox_id
        self.tenant = tenant
        self.tools = tools
        self.started_ms = 1.0
        self.memory_limit = memory_limit
        self.memory_bytes: int | None = None
        self.retiring = False
        self.dirty = False
        self.destroyed = False
        self.lost = False
        self.dying = False
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.sessions: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        """Configs sent by hash (``config_b64``), kept until the test sandbox is gone."""
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return not self.destroyed and not self.lost

    def kill(self) -> None:
        """The sandbox dies under its next request: that request raises SandboxLost
        (``crashed``), and the sandbox is not alive afterwards."""
        self.dying = True

    def check_churn(self) -> bool:
        return self.retiring

    def memory(self) -> int | None:
        return self.memory_bytes

    def destroy(self) -> None:
        self.destroyed = True

    def recycle(self) -> bool:
        if not self.alive or self.retiring:
            return False
        reply = self.request("recycle")
        return reply.get("status") == "ok" and reply.get("clean") is True

    def submit(self, op: str, timeout_s: float | None = None, **fields: object) -> KnownReply:
        return KnownReply(self.request(op, timeout_s, **fields))

    def request(self, op: str, timeout_s: float | None = None, **fields: object) -> dict[str, Any]:
        if self.dying:
            self.lost = True
        if not self.alive:
            raise SandboxLost(f"sandbox {self.id} is gone", self.id)
        with self._lock:
            self.requests.append((op, dict(fields)))
            answer = getattr(self, f"_op_{op}", None)
            if answer is None:
                return {"status": "fault", "message": f"unknown op {op!r}"}
            reply: dict[str, Any] = answer(**fields)
            return reply

    # -- the runner double's answers ----------------------------------------------------
    def _op_open(self, session: str, source: str, class_name: str, snapshot_b64: str | None = None,
                 init_config: dict[str, Any] | None = None, describe_only: bool = False,
                 config_hash: str | None = None, config_b64: str | None = None, **_: object) -> dict[str, Any]:
        if session in self.sessions:
            return {"status": "fault", "message": f"session {session!r} exists"}
        if config_hash is not None:  # a config by hash, its bytes sent once per sandbox (as the runner keeps them)
            if config_b64 is not None:
                self.configs[config_hash] = json.loads(base64.b64decode(config_b64))
            if config_hash not in self.configs:
                return {"status": "fault", "message": "unknown config", "missing_config": True}
            init_config = self.configs[config_hash]
        state = {"count": 0, **copy.deepcopy(init_config or {})}
        if snapshot_b64 is not None:  # the host holds the state it sent: the reply does not echo it
            state.update({key: entry[1] for key, entry in json.loads(base64.b64decode(snapshot_b64)).items()})
            self.sessions[session] = state
            return {"status": "ok"}
        self.sessions[session] = state
        return {"status": "ok", "snapshot": _encode(state)}

    def _op_call(self, session: str, name: str, arguments: dict[str, Any], **_: object) -> dict[str, Any]:
        state = self.sessions[session]
        tool = self.tools.get(name)
        if tool is None:
            return {"status": "error", "observation": f"Error: AttributeError: no tool {name!r}", "duration_ms": 0.0}
        before = copy.deepcopy(state)
        try:
            observation, status = str(tool(state, **arguments)), "ok"
        except Exception as exc:  # noqa: BLE001 - a tool that raises is a result, as in a sandbox
            observation, status = f"Error: {type(exc).__name__}: {exc}", "error"
        changed = {k: ["j", v] for k, v in state.items() if k not in before or before[k] != v}
        deleted = [k for k in before if k not in state]
        return {"status": status, "observation": observation, "duration_ms": 0.0,
                "delta": {"set": changed, "del": deleted}}

    def _op_restore(self, session: str, snapshot_b64: str, **_: object) -> dict[str, Any]:
        snapshot = json.loads(base64.b64decode(snapshot_b64))
        self.sessions[session] = {key: entry[1] for key, entry in snapshot.items()}
        return {"status": "ok"}

    def _op_snapshot(self, session: str, **_: object) -> dict[str, Any]:
        return {"status": "ok", "snapshot": _encode(self.sessions[session])}

    def _op_describe(self, session: str, **_: object) -> dict[str, Any]:
        tools = [{"type": "function", "function": {"name": name, "description": "",
                                                   "parameters": {"type": "object", "properties": {}, "required": []}}}
                 for name in self.tools]
        return {"status": "ok", "tools": tools, "notes": []}

    def _op_close(self, session: str, **_: object) -> dict[str, Any]:
        self.sessions.pop(session, None)
        return {"status": "ok"}

    def _op_recycle(self, **_: object) -> dict[str, Any]:
        clean = not self.dirty and not self.sessions
        self.configs.clear()
        return {"status": "ok", "clean": clean, "problems": [] if clean else ["left over"]}

    def _op_exec(self, code: str, **_: object) -> dict[str, Any]:
        return {"status": "ok", "exit_code": 0, "stdout": f"ran {len(code)} bytes\n", "stderr": "",
                "stdout_truncated": False, "stderr_truncated": False, "error": None}


class MemoryDriver:
    """Starts :class:`MemorySandbox` es (a :class:`SandboxDriver`).

    Args:
        tools: every sandbox's environment (tool name -> callable over the state dict).
        fail_starts: how many of the next starts fail with SandboxStartError.
        memory_limit: each sandbox's memory limit, bytes (0: unknown).
    """

    maintenance_s = 5.0

    def __init__(self, tools: dict[str, Tool] | None = None, fail_starts: int = 0, memory_limit: int = 0) -> None:
        self.tools: dict[str, Tool] = tools if tools is not None else {"bump": bump}
        self.fail_starts = fail_starts
        self.memory_limit = memory_limit
        self.pool_id = ""
        self.opened = self.closed = False
        self.started: list[MemorySandbox] = []
        self.maintained = 0
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def open(self, pool_id: str) -> None:
        self.pool_id, self.opened = pool_id, True

    def start(self, tenant: str, profile: ResourceProfile, uid: int) -> MemorySandbox:
        with self._lock:
            if self.fail_starts:
                self.fail_starts -= 1
                raise SandboxStartError("scripted start failure", f"mem-{next(self._ids)}")
            sandbox = MemorySandbox(f"mem-{next(self._ids)}", tenant, self.tools, self.memory_limit)
            self.started.append(sandbox)
            return sandbox

    def ping(self) -> None:
        return None

    def memory_total(self) -> int:
        return 0

    def maintain(self) -> Callable[[], None] | None:
        self.maintained += 1
        return None

    def stats(self) -> dict[str, int]:
        return {"started": len(self.started)}

    def close(self) -> None:
        self.closed = True
        for sandbox in self.started:
            sandbox.destroy()


def bump(state: dict[str, Any], by: int = 1) -> int:
    """Add ``by`` to the counter; the new count."""
    state["count"] += by
    return int(state["count"])


def _encode(state: dict[str, Any]) -> dict[str, list[Any]]:
    return {key: ["j", copy.deepcopy(value)] for key, value in state.items()}


class KnownReply:
    """A runner reply known when the request is sent (a :class:`~sandpit.executor.pool.placement.Reply`
    of in-memory sandboxes, which answer at once)."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply

    def answered(self, wait_s: float, spin_s: float = 0.0) -> bool:
        return True

    def __call__(self) -> dict[str, Any]:
        return self.reply
