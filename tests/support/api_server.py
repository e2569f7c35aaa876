"""A real ``sandpit serve`` process (uvicorn, real SQLite file, real Docker Engine) on a
loopback port, for the tests of the API and of its clients (the fixtures that start them
are in ``tests/integration/conftest.py``).

Servers run as subprocesses so tests can ``kill -9`` and restart them. Every sandbox they
create is labeled with their pid as owner; the integration conftest's leak check fails the
run if any container of a dead owner is left (a graceful stop removes them; after
``kill -9`` the next server's start-up reaper does).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sandpit.api.db.engine import upgrade
from sandpit.api.settings import new_operator_key

COUNTER_SOURCE = '''
from typing import Dict, List, Optional


class Counter:
    """A counter with a record store: tools change one value or one record."""

    def __init__(self, init_config: dict):
        self.count: int = init_config.get("count", 0)
        self.records: Dict[str, dict] = init_config.get("records", {})
        self.log: List[str] = []

    def bump(self, by: int = 1) -> int:
        """Add to the counter.

        Args:
            by (int): how much to add.
        """
        self.count += by
        self.log.append(f"bump {by}")
        return self.count

    def set_record(self, key: str, value: str, size: Optional[int] = None) -> str:
        """Create or replace one record.

        Args:
            key (str): record id.
            value (str): new value.
            size (int): optional padding length.
        """
        self.records[key] = {"value": value, "pad": "x" * (size or 0)}
        return f"stored {key}"

    def get_record(self, key: str) -> dict:
        """Return one record.

        Args:
            key (str): record id.
        """
        return self.records[key]

    def fail(self, message: str) -> str:
        """Raise an error with `message`."""
        raise ValueError(message)

    def spin(self) -> None:
        """Never returns."""
        while True:
            pass

    def weird(self) -> str:
        """Return text with a lone surrogate."""
        return "bad \\ud800 text"

    def _secret(self) -> str:
        return "private"

    @property
    def total(self) -> int:
        return self.count
'''


def create_envs(api: httpx.Client, environment_id: str, count: int, **body: object) -> list[str]:
    """``count`` envs of ``environment_id`` made one by one through ``POST /v1/envs``
    (``body``: the request's other fields); their ids. Asserts each answer is 201."""
    ids = []
    for _ in range(count):
        response = api.post("/v1/envs", json={"environment_id": environment_id, **body})
        assert response.status_code == 201, response.text
        ids.append(str(response.json()["id"]))
    return ids


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One default TLS context for every httpx client of this module: httpx loads the CA
    bundle into a new context for each client otherwise, about 30 ms of CPU, and the
    module-level ``httpx.get`` builds a client per call (a start-up poll every 0.1 s made
    that about a second of CPU per server start). The servers here speak plain HTTP."""
    return ssl.create_default_context()


def plain_client() -> httpx.Client:
    """An httpx client with no base URL and no default headers, on the shared TLS context
    (:func:`_tls_context`): for many requests whose headers differ, where the module-level
    ``httpx.request`` would build a client per request."""
    return httpx.Client(verify=_tls_context())


class ApiServer:
    """A ``sandpit serve`` subprocess on 127.0.0.1 with its own data directory.

    Started with a random operator key; on first start it creates tenant ``default``
    whose API key is ``api_key`` (``headers`` carries it). ``new_tenant()`` makes more."""

    def __init__(self, data_dir: Path, **env: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.operator_key = env.pop("SANDPIT_OPERATOR_KEY", None) or new_operator_key()
        self.env = {**os.environ, "SANDPIT_DATA_DIR": str(data_dir), "SANDPIT_EXECUTOR_POOL_SIZE": "1",
                    "SANDPIT_JANITOR_INTERVAL_S": "0.5", "SANDPIT_OPERATOR_KEY": self.operator_key, **env}
        self.api_key: str = ""
        self.process: subprocess.Popen | None = None
        self.log_path = data_dir / "server.log"

    @property
    def headers(self) -> dict[str, str]:
        """``Authorization`` of tenant ``default``."""
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def operator_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator_key}"}

    def client(self, api_key: str | None = None, timeout: float = 60) -> httpx.Client:
        """An httpx client to this server with ``api_key`` (default: tenant ``default``'s);
        on the shared TLS context (:func:`_tls_context`)."""
        return httpx.Client(base_url=self.url, timeout=timeout, verify=_tls_context(),
                            headers={"Authorization": f"Bearer {api_key or self.api_key}"})

    def new_tenant(self, tenant_id: str, quotas: dict | None = None, **fields: object) -> str:
        """Create a tenant through the admin API; returns its API key."""
        with plain_client() as http:
            response = http.post(f"{self.url}/v1/admin/tenants", headers=self.operator_headers, timeout=30,
                                 json={"id": tenant_id, "quotas": quotas, **fields})
        assert response.status_code == 201, response.text
        return response.json()["api_key"]["key"]

    @property
    def db_path(self) -> Path:
        return self.data_dir / "sandpit.db"

    def start(self, timeout_s: float = 60.0) -> ApiServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(f"sqlite:///{self.db_path}")
        with self.log_path.open("ab") as log:  # the child keeps its own copy of the fd
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from sandpit.cli import app; app()", "serve", "--port", str(self.port)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        with plain_client() as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise AssertionError(f"server exited with {self.process.returncode}: {self.log_tail()}")
                try:
                    ready = http.get(f"{self.url}/healthz", timeout=1).status_code == 200
                except httpx.TransportError:
                    ready = False
                if ready:
                    if not self.api_key:
                        self.api_key = self.new_tenant("default")
                    return self
                time.sleep(0.1)
        raise AssertionError(f"server did not answer within {timeout_s} s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Graceful stop (SIGTERM -> lifespan shutdown closes every sandbox)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """``kill -9``: no shutdown at all."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None
