"""One sandbox: a hardened container running the runner, and the channel to it; the
Docker backend's :class:`~sandpit.executor.pool.driver.SandboxHandle`.

Lifecycle: :meth:`Sandbox.start` (create container → runner connects to the protocol
socket → hello with the per-container token) → requests → :meth:`Sandbox.destroy`.
A sandbox belongs to exactly one tenant (label ``sandpit.tenant``) and hosts up to
``sessions_per_sandbox`` sessions of that tenant, as many as its measured memory admits
(:meth:`Sandbox.memory` is read by the pool's admission).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

import docker
from sandpit.sandbox_images.runner import protocol
from sandpit.sandbox_images.runner.limits import HELLO_MAX_BYTES

from ..errors import SandboxLost, SandboxStartError
from ..pool.channel import PendingReply, RunnerChannel
from ..profiles import ResourceProfile
from ..settings import ExecutorSettings
from . import engine

log = logging.getLogger(__name__)


class Sandbox:
    """A running sandbox container. Create with :meth:`start`; thread-safe requests."""

    def __init__(self, *, sandbox_id: str, container_id: str, tenant: str, profile: ResourceProfile,
                 uid: int, runtime: str, socket_dir: Path, channel: RunnerChannel,
                 client: docker.DockerClient, watchdog_grace_s: float, started_ms: float) -> None:
        self.id = sandbox_id
        self.container_id = container_id
        self.tenant = tenant
        self.profile = profile
        self.uid = uid
        self.runtime = runtime
        """The OCI runtime it runs under (``runc`` or ``runsc``)."""
        self.socket_dir = socket_dir
        self.channel = channel
        self.client = client
        self.watchdog_grace_s = watchdog_grace_s
        self.started_ms = started_ms
        """Milliseconds from ``docker create`` to the runner's hello."""
        self.retiring = False
        """No new session may be placed here; sessions move on at their next request
        and the sandbox is destroyed, not recycled, when empty (see :meth:`check_churn`)."""
        self.pids_limit = 0
        self.retire_pids_fraction = 1.0
        self.memory_limit = 0
        """The container's memory limit, bytes (0: unknown)."""
        self._destroy_lock = threading.Lock()
        self.destroyed = False

    @classmethod
    def start(cls, *, client: docker.DockerClient, settings: ExecutorSettings, profile: ResourceProfile,
              image: str, tenant: str, pool_id: str, uid: int) -> Sandbox:
        """Create and start a sandbox; returns once its runner has said hello.

        Raises:
            SandboxStartError: the runner did not connect within ``startup_timeout_s``
                (the container is removed; its logs are attached).
            DockerUnavailable / ImageError: the engine refused to create the container.
        """
        sandbox_id = secrets.token_hex(6)
        socket_dir = settings.run_dir / sandbox_id
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        socket_dir.mkdir(mode=0o750)
        sock_path = socket_dir / protocol.SOCKET_NAME  # the runner knows both names (protocol.py)
        token_path = socket_dir / protocol.TOKEN_NAME
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        container_id = ""
        t0 = time.perf_counter()
        try:
            listener.bind(str(sock_path))
            if os.geteuid() == 0:  # only the sandbox group may connect
                os.chown(socket_dir, 0, settings.sandbox_gid)
                os.chown(sock_path, 0, settings.sandbox_gid)
                os.chmod(sock_path, 0o660)
            else:  # development without root: the container uid must still reach it
                os.chmod(socket_dir, 0o755)
                os.chmod(sock_path, 0o666)
            listener.listen(1)
            token = secrets.token_urlsafe(32)
            _write_token(token_path, token, settings.sandbox_gid)
            poll = settings.runsc_poll_interval_s if settings.runtime == "runsc" else 1.0
            limits = profile.runner_limits(settings.sessions_per_sandbox, settings.spare_child, poll,
                                           settings.runtime, settings.session_templates,
                                           settings.session_startup_s, settings.session_forks_ahead)
            spec = engine.container_spec(
                settings=settings, profile=profile, image=image, tenant=tenant, sandbox_id=sandbox_id,
                pool_id=pool_id, uid=uid, socket_dir=str(socket_dir), limits_json=json.dumps(limits))
            spec.pop("detach")
            with engine.map_docker_errors("creating a sandbox container"):
                container = client.containers.create(**spec)
                container_id = str(container.id)
                container.start()
            if settings.cpu_burst_fraction > 0:
                engine.set_cpu_burst(container_id, engine.cpu_burst_us(settings, profile))
            conn = _accept(listener, client, container_id, sandbox_id, settings.startup_timeout_s)
            _unlink(token_path)  # read before connecting; no session process exists yet
            try:
                conn.settimeout(max(1.0, settings.startup_timeout_s))
                hello = protocol.recv_frame(conn, HELLO_MAX_BYTES)
                if hello.get("op") != "hello" or not hmac.compare_digest(str(hello.get("token", "")), token):
                    raise SandboxStartError("runner hello had a wrong token", sandbox_id)
            except (OSError, EOFError, protocol.ProtocolViolation) as exc:
                conn.close()
                raise SandboxStartError(f"runner handshake failed: {exc}", sandbox_id) from exc
            started_ms = (time.perf_counter() - t0) * 1000.0
            channel = RunnerChannel(conn, sandbox_id, settings.max_frame_bytes)
        except BaseException:
            if container_id:
                engine.remove_container(client, container_id)
            _remove_socket_dir(socket_dir)
            raise
        finally:
            listener.close()
            _unlink(sock_path)
            _unlink(token_path)
        sandbox = cls(sandbox_id=sandbox_id, container_id=container_id, tenant=tenant, profile=profile,
                      uid=uid, runtime=settings.runtime, socket_dir=socket_dir, channel=channel, client=client,
                      watchdog_grace_s=settings.watchdog_grace_s, started_ms=started_ms)
        sandbox.memory_limit = int(spec["mem_limit"])
        if settings.runtime == "runsc":
            sandbox.pids_limit = int(spec["pids_limit"])
            sandbox.retire_pids_fraction = settings.runsc_retire_pids_fraction
        return sandbox

    @property
    def alive(self) -> bool:
        return not self.destroyed and self.channel.alive

    def request(self, op: str, timeout_s: float | None = None, **fields: object) -> dict[str, Any]:
        """One runner request. Default timeout: two call timeouts (a re-create plus the
        call itself) plus the watchdog grace.

        Raises:
            SandboxLost: the runner died or exceeded the timeout; ``status`` tells which
                (an OOM-killed container reports ``oom``). The sandbox is destroyed.
        """
        return self.submit(op, timeout_s, **fields)()

    def submit(self, op: str, timeout_s: float | None = None, **fields: object) -> SandboxReply:
        """:meth:`request` in two halves: the request is sent now, the returned
        :class:`SandboxReply` waits for the reply when called (the timeout counts from
        now) and raises what :meth:`request` raises; a caller sends to several sandboxes
        before it waits for any."""
        if timeout_s is None:
            timeout_s = 2 * self.profile.call_timeout_s + self.watchdog_grace_s
        try:
            return SandboxReply(self, self.channel.submit(op, timeout_s, **fields))
        except SandboxLost as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: SandboxLost) -> SandboxLost:
        """The loss ``exc`` with its status as the container tells it (``oom`` when the
        engine OOM-killed it); the sandbox is destroyed."""
        status = exc.status
        if status != "timeout":
            _, oom_killed = engine.container_outcome(self.client, self.container_id)
            status = "oom" if oom_killed else "crashed"
        self.destroy()
        return SandboxLost(str(exc), self.id, status=status)

    def memory(self) -> int | None:
        """The bytes its memory cgroup is charged now (``engine.host_memory``: one read of a
        host cgroup file); None when the host cannot read it (a remote engine)."""
        return engine.host_memory(self.container_id)

    def check_churn(self) -> bool:
        """Under runsc, retire this sandbox when gVisor's host pids (which it does not
        give back after sandboxed processes exit) fill more than
        ``runsc_retire_pids_fraction`` of its pids cgroup; a no-op under runc. Returns
        :attr:`retiring`. Costs one read of a host cgroup file."""
        if self.pids_limit and not self.retiring:
            used = engine.host_pids(self.container_id)
            if used is not None and used > self.pids_limit * self.retire_pids_fraction:
                log.info("sandbox %s retires: %d of %d host pids in use", self.id, used, self.pids_limit)
                self.retiring = True
        return self.retiring

    def recycle(self) -> bool:
        """Ask the runner to make this sandbox, whose last session or job has ended, as
        it was at start (runner ``recycle``: every process but the runner killed,
        /tmp, /dev/shm and /work emptied and proven empty, no IPC object or bound socket
        left). Returns True when it may serve the tenant again; False when the runner
        found something it could not empty or prove empty (logged), or did not answer
        within ``watchdog_grace_s + 10`` seconds. Never raises for a lost sandbox."""
        if self.check_churn():
            return False
        try:
            reply = self.request("recycle", timeout_s=self.watchdog_grace_s + 10.0)
        except SandboxLost:
            return False
        if reply.get("status") == "ok" and reply.get("clean") is True:
            return True
        log.warning("sandbox %s cannot be reused: %s", self.id, str(reply.get("problems"))[:1000])
        return False

    def destroy(self) -> None:
        """Force-remove the container and its socket directory; idempotent."""
        with self._destroy_lock:
            if self.destroyed:
                return
            self.destroyed = True
        self.channel.close()
        engine.remove_container(self.client, self.container_id)
        _remove_socket_dir(self.socket_dir)


def _accept(listener: socket.socket, client: docker.DockerClient, container_id: str,
            sandbox_id: str, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    listener.settimeout(0.05)
    checks = 0
    while True:
        try:
            conn, _ = listener.accept()
            return conn
        except TimeoutError:
            pass
        checks += 1
        if checks % 10 == 0:  # every ~0.5 s: fail fast if the container already exited
            status, _ = engine.container_outcome(client, container_id)
            if status in ("exited", "dead", "missing"):
                raise SandboxStartError(f"sandbox container {status} before its runner connected; logs:\n"
                                        f"{_logs(client, container_id)}", sandbox_id)
        if time.monotonic() > deadline:
            raise SandboxStartError(f"runner did not connect within {timeout_s:g} s; logs:\n"
                                    f"{_logs(client, container_id)}", sandbox_id)


def _logs(client: docker.DockerClient, container_id: str) -> str:
    try:
        return client.api.logs(container_id, tail=40).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - diagnostics only
        return "<logs unavailable>"


def _write_token(path: Path, token: str, gid: int) -> None:
    """The runner's one-time token as a file only the sandbox group can read (the
    socket directory is the container's only host mount); unlinked once it connected."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        os.write(fd, token.encode())
        if os.geteuid() == 0:
            os.fchown(fd, 0, gid)
        else:  # development without root: the container uid must still read it
            os.fchmod(fd, 0o644)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _remove_socket_dir(path: Path) -> None:
    for child in (path / protocol.SOCKET_NAME, path / protocol.TOKEN_NAME):
        _unlink(child)
    try:
        path.rmdir()
    except OSError:
        pass


class SandboxReply:
    """A request sent to a :class:`Sandbox` (:meth:`Sandbox.submit`): the channel's
    :class:`~sandpit.executor.pool.channel.PendingReply`, a loss reported as the
    container tells it (the sandbox is destroyed when called)."""

    __slots__ = ("_sandbox", "_pending")

    def __init__(self, sandbox: Sandbox, pending: PendingReply) -> None:
        self._sandbox = sandbox
        self._pending = pending

    def answered(self, wait_s: float, spin_s: float = 0.0) -> bool:
        """:meth:`PendingReply.answered`: whether the reply came within ``wait_s``
        seconds, polling without sleeping for the first ``spin_s`` of them (False when
        the sandbox was lost meanwhile; calling then raises)."""
        return self._pending.answered(wait_s, spin_s)

    def __call__(self) -> dict[str, Any]:
        """The reply. Raises SandboxLost as :meth:`Sandbox.request` does (the sandbox destroyed)."""
        try:
            return self._pending()
        except SandboxLost as exc:
            raise self._sandbox._lost(exc) from exc
