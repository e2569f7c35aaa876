"""Every process PID 1 spawns starts here: confined first, then it becomes what its first
request makes it.

Stdlib only. PID 1 spawns a process ahead of need (a *spare*, ``pid1_children.py``), with
this module as its entry point (``pid1_children.SESSION_BOOT``): before any untrusted
code exists, :func:`main` takes the directory holding the runner's package off
``sys.path``, applies the per-process limits of ``SANDPIT_SESSION_LIMITS`` and the seccomp
filter (:func:`harden`), and serves the session protocol (``child_session.serve``). While
the process holds no environment class, the requests that turn it into something else
are handed over (:func:`become`), never to come back:

    exec / checks      -> a one-shot job (``child_oneshot.run_job``)
    template           -> an environment's or the jobs template (``child_template.run_template``)
    config_template    -> a config template, in a process forked from an environment's
                          template (``child_template.run_config_template``)

Anything else (``hello``, ``init``) is served as a session. Processes forked from a
template inherit all of this and are handed the same :func:`become`. A spare forked ahead
from the jobs template is first sent ``rehearse`` (:func:`rehearse`), which it serves
without an answer and stays a spare.
"""

from __future__ import annotations

import gc
import os
import resource
import sys

from . import child_instance, child_session
from .child_codec import loads as _json_value
from .limits import DEFAULT_SESSION_NOFILE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The directory holding the runner's package (``/opt/sandpit`` in the image): on
``sys.path`` only while the process imports the runner (PID 1's boot line puts it there),
never while untrusted code runs. The package's own later imports go through its
``__path__``."""
IMAGE_PACKAGES = "/usr/lib/python3/dist-packages"
"""Debian-packaged libraries of the image (``base.json``'s ``include``, e.g. mpmath). The
process runs with ``-S`` (no ``site``), so this is appended to ``sys.path`` explicitly, after
the standard library. Not a boundary: environment code could append it itself."""


def main() -> None:
    """Entry point of every process PID 1 spawns: the package's parent leaves ``sys.path``,
    the limits are applied (:func:`harden`), then the session protocol is served on fd 3
    until PID 1 closes it; exits with status 0 (70 when the process cannot be confined)."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p) != PACKAGE_PARENT]
    limits = _json_value(os.environ.pop("SANDPIT_SESSION_LIMITS", "{}"))
    harden(limits)
    sys.argv = ["environment"]
    if os.path.isdir(IMAGE_PACKAGES) and IMAGE_PACKAGES not in sys.path:
        sys.path.append(IMAGE_PACKAGES)
    warm_compiler()
    child_session.serve(child_session.Session(child_session.CTRL_FD, limits), become)
    os._exit(0)


WARM_UP_SOURCE = '''
import json


class WarmUp:
    """A class of the shape environment code has."""

    limit: int = 3

    def __init__(self, init_config: dict) -> None:
        self.items = {k: list(v) for k, v in init_config.items() if v}

    @property
    def size(self) -> int:
        return len(self.items)

    def add(self, key: str, value: str = "", *, strict: bool = False) -> str:
        """Add one item."""
        if strict and key in self.items:
            raise KeyError(f"{key!r} exists")
        self.items.setdefault(key, []).append(value)
        return json.dumps({"key": key, "count": len(self.items[key])})
'''
"""Source :func:`warm_compiler` compiles (never executes): the constructs environment
classes are made of."""


def warm_compiler() -> None:
    """Compile :data:`WARM_UP_SOURCE` once, and throw the code away. The first ``compile``
    in a process costs about 1 ms more than the next ones (measured in the image: 0.9 to
    1.6 ms for a 20-line class, against 0.11 ms for the second), and a spare's first
    compile is an env create's source, on that create's path. Done here, before the
    spare is needed, it brings that compile to 0.16 ms. Nothing runs: no code of it is
    executed, and it leaves nothing in ``sys.modules``."""
    compile(WARM_UP_SOURCE, "<warm-up>", "exec")


REHEARSAL_SOURCE = '''
class Rehearsal:
    """The runner's own class: what an open does, done once before the first open."""

    def __init__(self, init_config: dict) -> None:
        self.items = {k: list(v) for k, v in init_config.get("items", {}).items()}
        self.count = 0

    def add(self, key: str, value: str = "") -> str:
        """Add one item."""
        self.items.setdefault(key, []).append(value)
        self.count += 1
        return f"{key}: {len(self.items[key])}"
'''
"""Source :func:`rehearse` executes: the runner's own, with nothing imported."""


def rehearse(limits: dict[str, Any]) -> None:
    """Do once what an open does (execute a class's source as the environment's module,
    construct it, encode its state, call a tool, encode the delta), with the runner's own
    :data:`REHEARSAL_SOURCE`, then drop all of it. A spare forked from the jobs template
    shares the template's memory until it writes to it, and an open writes a few hundred
    of those pages (reference counts, the allocator's pools), each a copy-on-write fault:
    measured in the image, the open that took a forked spare faulted 188 pages, and 40
    after a rehearsal. Rehearsed while the spare waits, they are not on an open's path.
    Nothing is left behind: the module's names leave
    ``sys.modules`` (an open registers its own), the objects are collected, and no
    descriptor, thread or output is made. Never raises."""
    scratch = child_session.Session(-1, limits)
    try:
        cls = child_instance.load_class(REHEARSAL_SOURCE, "Rehearsal")
        scratch.instance = child_instance.instantiate(cls, {"items": {"a": ["x"]}, "count": 0}, scratch.retyped)
        scratch.delta_json(full=True)
        scratch.instance.add("b", "y")  # type: ignore[attr-defined]
        scratch.delta_json()
    except Exception:  # noqa: BLE001 - only the runner's own code ran: nothing to report
        pass
    finally:
        for name in (child_instance.MODULE_NAME, *child_instance.LEGACY_MODULE_NAMES):
            sys.modules.pop(name, None)
        scratch.instance = scratch.cache = cls = None  # type: ignore[assignment]
    gc.collect()


def become(msg: dict[str, Any], session: child_session.Session) -> None:
    """Hand a process that holds no environment class over to what ``msg`` asks it to be
    (module docstring); never returns then, except for ``rehearse`` (:func:`rehearse`, in
    a process holding nothing preloaded), after which it stays a spare. Returns at once when
    ``msg`` does not fit this process (``template`` to one holding a class preloaded by a
    template, ``config_template`` to one holding none, or an instance already): the request
    is then served as a session request, and refused as an unknown op."""
    op = msg.get("op")
    if op in ("exec", "checks"):
        from . import child_oneshot

        child_oneshot.run_job(msg, session.fd)
    elif op == "template" and session.preloaded is None:
        from . import child_template

        child_template.run_template(msg, session, become)
    elif op == "config_template" and session.preloaded is not None and session.preinstance is None:
        from . import child_template

        child_template.run_config_template(msg, session, become)
    elif op == "rehearse" and session.preloaded is None and session.preinstance is None:
        rehearse(session.limits)


def harden(limits: dict[str, Any]) -> None:
    """Per-process limits, set before any untrusted code exists. Hard limits equal soft
    ones so the environment cannot raise them again.

    Memory: ``session_memory_bytes`` as RLIMIT_DATA, or as RLIMIT_AS when
    ``memory_rlimit`` is ``"as"`` (gVisor ignores RLIMIT_DATA and checks RLIMIT_AS at
    every mmap/brk). Over it an allocation fails with MemoryError (status ``oom``).
    Then the seccomp filter of ``child_confine.py`` (no SysV IPC, POSIX message queues or
    keyrings, which would outlive the session's processes; no changing another
    process's limits or priority); if it cannot be installed the process exits (status
    70) rather than run code unconfined."""
    memory = int(limits.get("session_memory_bytes", 0))
    if memory > 0:
        kind = resource.RLIMIT_AS if limits.get("memory_rlimit") == "as" else resource.RLIMIT_DATA
        resource.setrlimit(kind, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nofile = int(limits.get("session_nofile", DEFAULT_SESSION_NOFILE))
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
            from . import child_confine

            child_confine.install_filter()
        except Exception as exc:  # noqa: BLE001 - never run untrusted code unconfined
            sys.stderr.write(f"sandpit-session: cannot confine the process: {exc}\n")
            os._exit(70)
