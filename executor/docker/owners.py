"""Who owns a sandbox container, and whether that owner is still alive: what the reaper
(:func:`sandpit.executor.docker.engine.reap`) decides by. Filesystem and ``/proc`` only; no
Docker calls here.

Every sandbox carries three labels naming its owner (``engine.container_spec``):

* ``sandpit.owner`` = ``<hostname>:<pid>:<start time>`` of the owning process (start
  time: field 22 of ``/proc/<pid>/stat``, clock ticks since boot, so a reused pid is told
  apart). The format is the one earlier versions wrote and read, so they still judge
  containers of this one correctly.
* ``sandpit.owner-ns`` = ``<boot id>/<pid namespace inode>``: which ``/proc`` the pid
  means. Two API servers in two containers sharing one engine socket have separate pid
  namespaces (and, with ``--network host``, the same hostname): a pid is only checked in
  ``/proc`` when the namespace is the checker's own.
* ``sandpit.pool`` = the pool's id (one lease per pool).

Leases (the owner side is :class:`OwnerLease`, the reader side :class:`LeaseView`).
An owner in another pid namespace cannot be looked up in ``/proc``, so each live pool
keeps a lease: a small file ``<lease dir>/<sha256(owner, ns, pool)>.lease`` whose
modification time it refreshes every ``timeout / 4`` seconds; another pool judges it
expired when that time is more than ``timeout`` (recorded in the file) behind. Why a file:

* Docker cannot hold a heartbeat: labels and volume options are fixed at creation, the
  engine keeps no writable timestamp on an object short of restarting a container per
  renewal; swarm configs need swarm mode.
* The control database's replica heartbeats exist only under the API (the executor also
  runs alone: Ray hosts, benchmarks, the CLI) and only executor code may reach Docker.
* Every owner of a sandbox on an engine already shares that engine's host filesystem: the
  sandbox's protocol socket is a bind-mounted host path the owner listens on, so owners
  are processes on that host (in containers, with that path mounted). One kernel, one
  clock: a sweeper compares others' mtimes with the mtime of its own lease, touched the
  moment before, so not even a filesystem with a clock of its own skews the verdict.

Verdicts (:func:`judge`), in order: an owner label that does not parse is ``unowned`` (no
Sandpit process wrote it). In the checker's own pid namespace, a pid that is gone or was
reused (start time differs) is ``dead``; an exited container whose owner ran on this host
under an earlier boot is ``dead``. A lease found expired is ``dead`` (also for a process
that still exists: stopped or hung for longer than its lease); a fresh lease, or a live
process in the checker's namespace, is ``alive``. Anything else (another namespace, no
lease readable in the checker's lease directory) is ``unknown`` and never reaped by a
sweep: a missing lease file does not prove its owner dead (the directory may not be
shared), so the rules only ever reap on proof.

Safety of a live owner: its lease is written before it creates any container and renewed
before creating one when the last renewal is a renewal period old
(:meth:`OwnerLease.renew_if_due`), so a container being created is always covered by a
lease fresher than a quarter of its timeout; a same-namespace owner is alive while its
process is. Bound for a dead one: a sweep every ``reap_interval_s`` reaps it at most
``reap_interval_s + owner_lease_timeout_s`` seconds after it stopped renewing (process
gone in the sweeper's namespace: within ``reap_interval_s``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

State = Literal["alive", "dead", "unknown", "unowned"]
LeaseState = Literal["fresh", "expired", "missing"]

_PID = re.compile(r"[0-9]{1,10}")
_TICKS = re.compile(r"[0-9]{1,20}")
_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}")
_BOOT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_LEASE_FILE = re.compile(r"[0-9a-f]{40}\.lease")
LEASE_MAX_BYTES = 4096
"""A lease file longer than this is not read (it was not written by Sandpit)."""
GC_FACTOR = 10
"""A lease expired for more than this many of its timeouts, and named by no container,
is removed by a sweep."""
MAX_TIMEOUT_S = 86400.0 * 365
"""Largest lease timeout a lease file may state (seconds); above it the file is unreadable."""


def start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot), or None
    when the process does not exist in this pid namespace."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2:].split()[19].decode()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _pid_namespace(pid: int | str = "self") -> str:
    try:
        link = os.readlink(f"/proc/{pid}/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return ""
    inode = link.partition("[")[2].rstrip("]")
    return inode if _TICKS.fullmatch(inode) else ""


def owner_id(pid: int | None = None) -> str:
    """``<hostname>:<pid>:<process start time>`` of the process owning new sandboxes
    (``pid``, default this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{start_time(pid)}"


def owner_ns(pid: int | None = None) -> str:
    """``<boot id>/<pid namespace inode>`` of ``pid`` (default this process): where its pid
    means something. Empty when either cannot be read (then only leases judge it)."""
    boot, namespace = _boot_id(), _pid_namespace("self" if pid is None else pid)
    return f"{boot}/{namespace}" if boot and namespace else ""


@dataclass(frozen=True)
class Here:
    """The checker's own hostname, boot id and pid namespace (what labels are compared to)."""

    hostname: str
    boot: str
    namespace: str

    @classmethod
    def now(cls) -> Here:
        """This process's view (read from ``/proc`` and ``gethostname`` each call)."""
        return cls(socket.gethostname(), _boot_id(), _pid_namespace())


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` decided about one container's owner, and why (for the log)."""

    state: State
    reason: str


def parse_owner(owner: str) -> tuple[str, int, str] | None:
    """``(hostname, pid, start time)`` of an owner label, or None when it is not one
    Sandpit writes (ASCII digits only: ``"١٢٣".isdigit()`` is true, but it names no pid)."""
    if len(owner) > 300:
        return None
    parts = owner.split(":")
    if len(parts) != 3:
        return None
    host, pid, started = parts
    if not (_HOST.fullmatch(host) and _PID.fullmatch(pid) and _TICKS.fullmatch(started)):
        return None
    return host, int(pid), started


def parse_ns(ns: str) -> tuple[str, str] | None:
    """``(boot id, pid namespace inode)`` of an owner-namespace label, or None."""
    boot, slash, namespace = ns.partition("/")
    if not slash or not _BOOT.fullmatch(boot) or not _TICKS.fullmatch(namespace):
        return None
    return boot, namespace


def lease_name(owner: str, ns: str, pool: str) -> str:
    """File name of the lease of ``pool`` owned by ``owner`` in namespace ``ns`` (a hash:
    labels never become paths)."""
    digest = hashlib.sha256(json.dumps([owner, ns, pool]).encode("ascii")).hexdigest()
    return f"{digest[:40]}.lease"


def judge(owner: str, ns: str, pool: str, *, running: bool, leases: LeaseView | None,
          here: Here | None = None) -> Verdict:
    """Whether the owner of a container with these labels is alive (module docstring).

    Args:
        owner, ns, pool: the container's ``sandpit.owner``, ``sandpit.owner-ns`` and
            ``sandpit.pool`` labels ("" when absent).
        running: the container's state is ``running`` (an exited container of an earlier
            boot is dead).
        leases: the lease directory as of this sweep; None judges by processes only.
        here: the checker's identity (default: this process's, read now).

    Returns:
        A :class:`Verdict`: ``dead`` is proven, ``alive`` is proven or assumed while a
        lease or the process says so, ``unknown`` and ``unowned`` are never reaped by a
        periodic sweep.
    """
    parsed = parse_owner(owner)
    if parsed is None:
        return Verdict("unowned", "no owner label" if not owner else "owner label not written by Sandpit")
    host, pid, started = parsed
    where = parse_ns(ns) if ns else None
    if ns and where is None:
        return Verdict("unowned", "owner namespace label not written by Sandpit")
    here = here or Here.now()
    lease = leases.state(owner, ns, pool) if leases is not None else "missing"
    if where is None:  # written before owner namespaces were labeled: its hostname decides
        same = host == here.hostname
    else:
        same = bool(here.boot and here.namespace) and where == (here.boot, here.namespace)
        if not same and here.boot and where[0] != here.boot and host == here.hostname and not running:
            return Verdict("dead", "owner ran on this host under an earlier boot")
    if same and start_time(pid) != started:
        return Verdict("dead", "owner process is gone")
    if lease == "expired":
        return Verdict("dead", "owner lease expired")
    if lease == "fresh":
        return Verdict("alive", "owner lease is fresh")
    if same:
        return Verdict("alive", "owner process is running")
    return Verdict("unknown", "owner in another pid namespace, no lease readable here")


class OwnerLease:
    """The lease of one pool: ``<directory>/<lease_name(owner, ns, pool)>``, a JSON file
    (``owner``, ``owner_ns``, ``pool``, ``timeout_s``) whose modification time is the
    heartbeat. Thread-safe.

    Args:
        directory: the lease directory (``ExecutorSettings.resolved_lease_dir``), created
            when missing; every pool that should judge this one's sandboxes must use it.
        owner, ns, pool: this pool's labels (:func:`owner_id`, :func:`owner_ns`, its id).
        timeout_s: seconds without renewal after which others judge it expired; it is
            renewed every quarter of that (:attr:`renew_period_s`).
    """

    def __init__(self, directory: Path, owner: str, ns: str, pool: str, timeout_s: float) -> None:
        self.directory = directory
        self.path = directory / lease_name(owner, ns, pool)
        self.timeout_s = timeout_s
        self.renew_period_s = timeout_s / 4
        self._content = json.dumps({"owner": owner, "owner_ns": ns, "pool": pool, "timeout_s": timeout_s})
        self._lock = threading.Lock()
        self._renewed = float("-inf")  # time.monotonic() of the last renewal that succeeded
        self._warned = False

    def acquire(self) -> float | None:
        """Write the lease (replacing any file of that name). Returns its mtime (seconds
        since the epoch, the filesystem's clock), None when it could not be written (a
        warning is logged once; others then judge this pool by its process only)."""
        with self._lock:
            return self._write_locked()

    def renew(self) -> float | None:
        """Refresh the lease's mtime (rewriting it if it is missing). Returns the new
        mtime, None when it cannot be written."""
        with self._lock:
            try:
                os.utime(self.path)
                mtime = os.stat(self.path, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                return self._write_locked()
            except OSError as exc:
                self._warn(exc)
                return None
            self._renewed = time.monotonic()
            return mtime

    def renew_if_due(self) -> None:
        """:meth:`renew` when the last renewal is a renewal period old: called before a
        container is created, so a new container is never younger than a stale lease."""
        if time.monotonic() - self._renewed >= self.renew_period_s:
            self.renew()

    def release(self) -> None:
        """Remove the lease (the pool closed and removed its containers)."""
        with self._lock:
            self._renewed = float("-inf")
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def expire(self) -> None:
        """Mark the lease expired now (mtime 0): the pool closed but could not remove all
        of its containers, so any other pool's sweep may."""
        with self._lock:
            self._renewed = float("-inf")
            with contextlib.suppress(OSError):
                os.utime(self.path, (0, 0))

    def _write_locked(self) -> float | None:
        temporary = self.directory / f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(temporary, "w") as handle:
                handle.write(self._content)
            os.replace(temporary, self.path)
            mtime = os.stat(self.path, follow_symlinks=False).st_mtime
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            self._warn(exc)
            return None
        self._renewed = time.monotonic()
        return mtime

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("cannot write the owner lease %s (%s): pools in other pid namespaces cannot tell "
                        "whether this one is alive and will leave its sandboxes alone", self.path, exc)


@dataclass
class LeaseView:
    """The lease directory as one sweep reads it: every lease judged against ``now``
    (seconds since the epoch on the filesystem's clock: the mtime of the sweeper's own
    lease, just renewed). Files are read at most once per view."""

    directory: Path
    now: float
    seen: set[str] = field(default_factory=set)
    """Names of the leases looked up (containers name them: :meth:`collect_garbage` keeps them)."""
    _cache: dict[str, tuple[LeaseState, float, float]] = field(default_factory=dict)

    def state(self, owner: str, ns: str, pool: str) -> LeaseState:
        """``fresh``, ``expired`` (mtime more than its ``timeout_s`` behind :attr:`now`) or
        ``missing`` (no file, or one Sandpit did not write: not a regular file, too long,
        not the JSON of a lease, a timeout out of range)."""
        name = lease_name(owner, ns, pool)
        self.seen.add(name)
        return self._read(name)[0]

    def _read(self, name: str) -> tuple[LeaseState, float, float]:
        """(state, mtime, timeout_s) of lease file ``name``; mtime and timeout 0 when missing."""
        cached = self._cache.get(name)
        if cached is None:
            cached = self._cache[name] = self._load(self.directory / name)
        return cached

    def _load(self, path: Path) -> tuple[LeaseState, float, float]:
        missing: tuple[LeaseState, float, float] = ("missing", 0.0, 0.0)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return missing
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > LEASE_MAX_BYTES:
                return missing
            raw = os.read(fd, LEASE_MAX_BYTES + 1)
        except OSError:
            return missing
        finally:
            os.close(fd)
        try:
            timeout = json.loads(raw)["timeout_s"]
        except (ValueError, TypeError, KeyError, RecursionError):
            return missing
        if type(timeout) not in (int, float) or not 0 < timeout <= MAX_TIMEOUT_S:
            return missing
        age = self.now - info.st_mtime
        return ("expired" if age > timeout else "fresh"), info.st_mtime, float(timeout)

    def collect_garbage(self) -> int:
        """Remove lease files expired for more than :data:`GC_FACTOR` of their timeouts
        that no container named in this view's look-ups (:attr:`seen`), and temporary
        files of interrupted writes older than an hour. Safe against a lease renewed
        meanwhile: a missing lease never makes its owner dead. Returns how many went."""
        removed = 0
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 0
        for name in names:
            path = self.directory / name
            if _LEASE_FILE.fullmatch(name) and name not in self.seen:
                state, mtime, timeout = self._read(name)
                if state != "expired" or self.now - mtime <= GC_FACTOR * timeout:
                    continue
            elif name.startswith(".") and name.endswith(".tmp"):
                try:
                    if self.now - os.stat(path, follow_symlinks=False).st_mtime <= 3600:
                        continue
                except OSError:
                    continue
            else:
                continue
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
        return removed
