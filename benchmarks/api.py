"""API benchmark: starts its own ``sandpit serve`` (loopback, temporary SQLite file) and
measures, over real HTTP:

* step latency p50/p99 with 1 client and with 32 concurrent clients, and steps/s, each
  with three load generators: httpx (what the Python client runs on), a keep-alive
  ``http.client`` one ("raw": far less CPU per request in this process, which shares the
  2 cores with the server) and a socket one (``SocketClient``: request bytes built once
  per path, the reply read by its length; about what a client in a compiled language
  spends, so its latency is nearly all the server's and the network's); the 32-client runs as the default tenant quotas allow
  (``max_running_calls`` = half the cores) and with ``max_running_calls=32``; and 1
  client through Sandpit's Python client itself (``SdkClient``: a new
  ``Idempotency-Key`` per step, the retry policy, the reply parsed);
* beside each run, the per-step CPU budget: the server process (split by the server's
  own phase timers, ``sandpit_step_phase_*_seconds_total`` on ``/metrics``: parse,
  auth/quotas, sandbox call, persistence/commit, response serialization, the rest of
  the step; "http+loop" is the server's CPU outside the request thread's phases: HTTP
  parsing, the event loop, the channel threads), this server's sandbox containers
  (cgroup CPU), and the load generator; plus the server-measured sandbox round trip
  (``duration_ms`` of the replies), each step's latency less that round trip
  (``latency_less_sandbox_ms``: HTTP, the API's own work and the commit, the part of a
  step the API decides) and, as the anchor, the executor's own call round trip
  measured in this process before the server starts (``benchmarks/sandbox.py``'s
  ``call_rtt_ms``);
* env create latency (warm pool);
* snapshot bytes stored per step on a ~2 MB ``Dict[id, record]`` state where each step
  changes one record, and that step's latency;
* restore latency and fork latency (a 30-step env into 16 copies);
* optionally (``--density N``) N live envs of one environment with 200 stepping at once
  (idle ones evicted to snapshots), errors and the server's resident memory;
* optionally (``--access-log``) only the cost of the access log: three servers side by
  side (``--log-level info`` with the access log on, the same with
  ``SANDPIT_ACCESS_LOG=false``, and ``serve``'s default level, warning), one client
  stepping each in turn, in alternating blocks of the same run: step p50/p99 and the
  server's CPU per step of each.

Prints a table and saves JSON to ``benchmarks/results/api.json`` (``--access-log``:
``benchmarks/results/api_access_log.json``).
Usage: ``python benchmarks/api.py [--steps 2000] [--density 1000] [--only-steps] [--access-log]``.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import platform
import re
import resource
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sandpit.api.db.engine import upgrade
from sandpit.api.settings import new_operator_key
from sandpit.client import Client
from sandpit.client.envs import EnvHandle
from sandpit.executor.docker import docker_pool
from sandpit.executor.settings import ExecutorSettings

sys.path.insert(0, str(Path(__file__).parent))
from hoststat import cpu_speed  # noqa: E402 - benchmarks/ is not a package
from loadgen import parse_head, server_total_ms  # noqa: E402

SOURCE = '''
class Bench:
    """Small state plus a record store."""

    def __init__(self, init_config):
        self.count = init_config.get("count", 0)
        self.records = init_config.get("records", {})

    def bump(self, by: int = 1) -> int:
        """Add `by` to the counter."""
        self.count += by
        return self.count

    def touch(self, key: str, value: str) -> str:
        """Change one record's value."""
        self.records[key] = dict(self.records[key], value=value)
        return key
'''


def pcts(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"n": len(ordered), "p50": round(statistics.median(ordered), 3),
            "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
            "mean": round(statistics.fmean(ordered), 3)}


def machine() -> dict:
    """What a result file says of the machine: cores, platform, the load average when the
    run starts (:func:`save` adds the one at its end) and one core's speed at Python then
    (``hoststat.cpu_speed``: ``python_mips``, ``cpu_model``)."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_at_start": os.getloadavg(),
            **cpu_speed()}


def save(results: dict, output: Path) -> None:
    """Stamp ``results["machine"]`` with the load average at the end, print the results
    as JSON and write them to ``output`` (its directory made if needed)."""
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    print(f"saved {output}")


READY_TIMEOUT_S = 120.0
"""How long :class:`Server` waits for ``/readyz`` (seconds)."""
LOG_TAIL_LINES = 20
"""Lines of the server's log a start-up failure quotes (its directory is often temporary)."""


class Server:
    """``sandpit serve`` on a free loopback port with a random operator key; tenant
    ``default`` (``api_key``/``headers``) gets generous quotas so that one benchmark
    client is not throttled by the per-tenant defaults. Raises SystemExit, quoting the end
    of the server's log, when the server exits before it is ready or is not ready within
    READY_TIMEOUT_S (it is then killed)."""

    def __init__(self, data_dir: Path, *args: str, **env: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        upgrade(f"sqlite:///{data_dir / 'sandpit.db'}")
        self.operator_key = new_operator_key()
        self.env = {**os.environ, "SANDPIT_DATA_DIR": str(data_dir), "SANDPIT_OPERATOR_KEY": self.operator_key, **env}
        with (data_dir / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from sandpit.cli import app; app()", "serve", "--port", str(self.port),
                 *args], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    self.api_key = self.new_tenant("default", {"max_live_envs": 1_000_000,
                                                               "max_concurrent_calls": 1024})
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        code = self.process.poll()
        if code is None:  # not ready in time: stopped, so no server outlives the benchmark
            self.process.kill()
            self.process.wait(timeout=30)
        why = f"exited with status {code}" if code is not None else f"not ready within {READY_TIMEOUT_S:.0f} s"
        tail = (data_dir / "server.log").read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        raise SystemExit(f"sandpit serve {why}; the end of its log ({data_dir / 'server.log'}):\n" + "\n".join(tail))

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def new_tenant(self, tenant_id: str, quotas: dict | None = None) -> str:
        """Create a tenant; returns its API key."""
        response = httpx.post(f"{self.url}/v1/admin/tenants", json={"id": tenant_id, "quotas": quotas}, timeout=30,
                              headers={"Authorization": f"Bearer {self.operator_key}"})
        if response.status_code != 201:
            raise SystemExit(f"creating tenant {tenant_id}: {response.text}")
        return response.json()["api_key"]["key"]

    def client(self, api_key: str | None = None, **kwargs) -> httpx.Client:
        """An httpx client authenticated as ``api_key`` (default: tenant ``default``)."""
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {api_key or self.api_key}"},
                            **{"timeout": 120, **kwargs})

    def rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)


class RawClient:
    """A keep-alive HTTP/1.1 load generator over ``http.client`` (one connection per
    thread): the same requests as httpx, at a fraction of its CPU per request."""

    def __init__(self, url: str, api_key: str) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self.local = threading.local()

    def post(self, path: str, json_body: dict) -> tuple[int, dict]:
        """``(status, reply JSON)``; the reply's ``Server-Timing`` (or None) is kept as this
        thread's :meth:`server_timing`."""
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        self.local.server_timing = None
        conn.request("POST", path, body=json.dumps(json_body).encode(), headers=self.headers)
        response = conn.getresponse()
        self.local.server_timing = response.getheader("server-timing")
        return response.status, json.loads(response.read())

    def server_timing(self) -> str | None:
        """The ``Server-Timing`` of this thread's last reply, None when it had none."""
        return getattr(self.local, "server_timing", None)


class SocketClient:
    """The leanest keep-alive HTTP/1.1 load generator: one socket per thread, the request
    line and headers encoded once per path, the reply read by its ``Content-Length``
    (the server's replies always carry one). What ``http.client`` spends per request
    (header objects, ``email``-parser responses: about 0.2 ms of CPU on this machine)
    lands in every latency it measures; a trainer's client in another language, or on
    another machine, does not pay it here. A connection the server closed while idle
    (keep-alive timeout) is opened again and the request sent on the new one."""

    def __init__(self, url: str, api_key: str) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.api_key = api_key
        self.local = threading.local()
        self._heads: dict[str, bytes] = {}

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=120)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local.sock, self.local.buf = sock, b""
        return sock

    def post(self, path: str, json_body: dict) -> tuple[int, dict]:
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                                        f"Authorization: Bearer {self.api_key}\r\n"
                                        "Content-Type: application/json\r\nContent-Length: ").encode("ascii")
        body = json.dumps(json_body).encode()
        request = head + str(len(body)).encode("ascii") + b"\r\n\r\n" + body
        sock = getattr(self.local, "sock", None) or self._connect()
        try:
            sock.sendall(request)
            return self._reply(sock)
        except (ConnectionError, EOFError):
            if self.local.buf:  # part of a reply had come: not an idle connection closed
                raise
            sock.close()
            sock = self._connect()
            sock.sendall(request)
            return self._reply(sock)

    def server_timing(self) -> str | None:
        """The ``Server-Timing`` of this thread's last reply, None when it had none."""
        return getattr(self.local, "server_timing", None)

    def _reply(self, sock: socket.socket) -> tuple[int, dict]:
        buf = self.local.buf
        while b"\r\n\r\n" not in buf:
            more = sock.recv(65536)
            if not more:
                self.local.buf = buf
                raise EOFError("server closed the connection")
            buf += more
        head, _, buf = buf.partition(b"\r\n\r\n")
        status, headers = parse_head(head)
        self.local.server_timing = headers.get("server-timing")
        length = int(headers.get("content-length", 0))
        close = headers.get("connection", "").lower() == "close"
        while len(buf) < length:
            more = sock.recv(65536)
            if not more:
                raise ConnectionError("server closed the connection mid-reply")
            buf += more
        body, self.local.buf = buf[:length], buf[length:]
        if close:
            sock.close()
            self.local.sock = None
        return status, json.loads(body)


class _TimingTransport(httpx.HTTPTransport):
    """httpx's own transport, keeping each reply's ``Server-Timing`` as its thread's."""

    def __init__(self, local: threading.local) -> None:
        super().__init__()
        self.local = local

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.local.server_timing = None
        response = super().handle_request(request)
        self.local.server_timing = response.headers.get("server-timing")
        return response


class SdkClient:
    """Sandpit's Python client itself (``sandpit.client.Client``), as a trainer steps
    through it: each step with a new ``Idempotency-Key``, the client's retry policy, the
    reply parsed into a ``StepResult``; on httpx, with the ``Server-Timing`` of each
    reply kept per thread (:meth:`server_timing`)."""

    def __init__(self, url: str, api_key: str) -> None:
        self.local = threading.local()
        self.client = Client(url, api_key, transport=_TimingTransport(self.local))
        self.handles: dict[str, EnvHandle] = {}

    def post(self, path: str, json_body: dict) -> tuple[int, dict]:
        """The step of ``path`` (``/v1/envs/{id}/step``) with ``json_body``'s tool call,
        through the env's handle: ``(200, the fields of the StepResult)``; a refusal
        raises the client's error."""
        env_id = path.split("/")[3]
        handle = self.handles.get(env_id)
        if handle is None:
            handle = self.handles[env_id] = self.client.envs.get(env_id)
        result = handle.step(json_body["name"], **json_body.get("arguments", {}))
        return 200, result.model_dump()

    def server_timing(self) -> str | None:
        """The ``Server-Timing`` of this thread's last reply, None when it had none."""
        return getattr(self.local, "server_timing", None)

    def close(self) -> None:
        self.client.close()


def step_timed(client: httpx.Client | RawClient | SocketClient | SdkClient, env_id: str, name: str,
               **arguments) -> tuple[float, float, float | None]:
    """One step: (client-measured latency, server-measured sandbox round trip, the server's
    own time from its ``Server-Timing`` total or None), ms."""
    body = {"name": name, "arguments": arguments}
    started = time.perf_counter()
    if isinstance(client, (RawClient, SocketClient, SdkClient)):
        code, reply = client.post(f"/v1/envs/{env_id}/step", body)
        timing = client.server_timing()
    else:
        response = client.post(f"/v1/envs/{env_id}/step", json=body)
        code, reply, timing = response.status_code, response.json(), response.headers.get("server-timing")
    elapsed = (time.perf_counter() - started) * 1000
    if code != 200 or reply["status"] != "ok":
        raise RuntimeError(f"{code}: {reply}")
    return elapsed, reply["duration_ms"], server_total_ms(timing)


def step(client: httpx.Client | RawClient | SocketClient | SdkClient, env_id: str, name: str, **arguments) -> float:
    return step_timed(client, env_id, name, **arguments)[0]


def anchor_call_rtt(calls: int) -> dict:
    """The executor's own call round trip (``benchmarks/sandbox.py``'s ``call_rtt_ms``):
    a trivial tool called in one session, in this process, no HTTP and no database."""
    settings = ExecutorSettings().model_copy(update={"pool_size": 1, "pool_refill_concurrency": 1})
    with docker_pool(settings) as pool:
        session = pool.open_session(tenant="bench-anchor", source=SOURCE, class_name="Bench")
        for _ in range(200):
            session.call("bump", {})
        samples = []
        for _ in range(calls):
            started = time.perf_counter()
            assert session.call("bump", {}).status == "ok"
            samples.append((time.perf_counter() - started) * 1000)
        session.close()
    return pcts(samples)


PHASE_LINE = re.compile(r'^sandpit_step_phase_(cpu|wall)_seconds_total\{phase="(\w+)"\} (\S+)$|'
                        r'^sandpit_step_phase_steps_total (\S+)$')


def phase_counters(url: str) -> dict:
    """The server's step phase counters from ``/metrics``."""
    out: dict = {"cpu": {}, "wall": {}, "steps": 0.0}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        match = PHASE_LINE.match(line)
        if match is None:
            continue
        if match.group(4) is not None:
            out["steps"] = float(match.group(4))
        else:
            out[match.group(1)][match.group(2)] = float(match.group(3))
    return out


def process_cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sandboxes_cpu_s(server_pid: int) -> float:
    """CPU seconds of the sandbox containers this server owns (label ``sandpit.owner``
    ``<host>:<pid>:...``), from their cgroups (v1 or v2); 0 when unreadable."""
    try:
        listing = subprocess.run(["docker", "ps", "--no-trunc", "--filter", "label=sandpit=1", "--format",
                                  '{{.ID}} {{.Label "sandpit.owner"}}'], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0.0
    total = 0.0
    for line in listing.splitlines():
        container, _, owner = line.partition(" ")
        if owner.split(":")[1:2] == [str(server_pid)]:
            total += container_cpu_s(container)
    return total


def container_cpu_s(container_id: str) -> float:
    """CPU seconds the container's cgroup has used (v1 ``cpuacct.usage`` or v2
    ``cpu.stat``), 0 when unreadable."""
    for path in (f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage",
                 f"/sys/fs/cgroup/cpu,cpuacct/docker/{container_id}/cpuacct.usage"):
        try:
            return int(Path(path).read_text()) / 1e9
        except OSError:
            continue
    for path in (*glob.glob(f"/sys/fs/cgroup/**/docker-{container_id}.scope/cpu.stat", recursive=True),
                 f"/sys/fs/cgroup/docker/{container_id}/cpu.stat"):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) / 1e6
        except OSError:
            continue
    return 0.0


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def step_run(server: Server, client: httpx.Client | RawClient | SocketClient | SdkClient, env_ids: list[str], per_client: int) -> dict:
    """``per_client`` steps on each of ``env_ids``, one thread per env (all at once):
    latency percentiles, steps/s, and the per-step CPU budget (module docstring)."""
    samples: list[float] = []
    rtts: list[float] = []
    beyond: list[float] = []  # client latency less the server's own time (Server-Timing)
    served: list[float] = []
    lock = threading.Lock()

    def drive(eid: str) -> None:
        local = [step_timed(client, eid, "bump") for _ in range(per_client)]
        with lock:
            samples.extend(ms for ms, _, _ in local)
            rtts.extend(rtt for _, rtt, _ in local)
            served.extend(total for _, _, total in local if total is not None)
            beyond.extend(ms - total for ms, _, total in local if total is not None)

    phases0, server0, boxes0, own0 = (phase_counters(server.url), process_cpu_s(server.process.pid),
                                      sandboxes_cpu_s(server.process.pid), own_cpu_s())
    started = time.perf_counter()
    if len(env_ids) == 1:
        drive(env_ids[0])
    else:
        with ThreadPoolExecutor(len(env_ids)) as pool:
            list(pool.map(drive, env_ids))
    wall = time.perf_counter() - started
    own1, server1, boxes1, phases1 = (own_cpu_s(), process_cpu_s(server.process.pid),
                                      sandboxes_cpu_s(server.process.pid), phase_counters(server.url))
    n = len(samples)
    timed = max(1.0, phases1["steps"] - phases0["steps"])
    cpu_phases = {k: round((v - phases0["cpu"].get(k, 0.0)) / timed * 1000, 3) for k, v in phases1["cpu"].items()}
    wall_phases = {k: round((v - phases0["wall"].get(k, 0.0)) / timed * 1000, 3) for k, v in phases1["wall"].items()}
    server_ms = (server1 - server0) / n * 1000
    return {"latency_ms": pcts(samples), "steps_per_s": round(n / wall, 1),
            "server_sandbox_rtt_ms": pcts(rtts),
            "latency_less_sandbox_ms": pcts([ms - rtt for ms, rtt in zip(samples, rtts, strict=True)]),
            # the server's own time per step (body read to reply ready), and what the client
            # measured beyond it: HTTP on both sides, the event loop before the body, the client
            "server_total_ms": pcts(served) if served else None,
            "latency_less_server_ms": pcts(beyond) if beyond else None,
            "cpu_ms_per_step": {"server": round(server_ms, 3),
                                "server_phases": cpu_phases,
                                "server_http_loop_other": round(server_ms - sum(cpu_phases.values()), 3),
                                "sandboxes": round((boxes1 - boxes0) / n * 1000, 3),
                                "load_generator": round((own1 - own0) / n * 1000, 3)},
            "wall_ms_per_step_server_phases": wall_phases}


def budget_table(results: dict) -> str:
    """The step runs as a table: latency, throughput and the CPU budget per step."""
    phases = ("parse", "auth", "sandbox", "persist", "serialize", "other")
    head = ["run", "p50 ms", "p99 ms", "steps/s", "rtt p50", "server cpu", *phases, "http+loop", "sandbox cpu",
            "client cpu"]
    rows = [head]
    for name, run in results.get("step_runs", {}).items():
        cpu = run["cpu_ms_per_step"]
        rows.append([name, run["latency_ms"]["p50"], run["latency_ms"]["p99"], run["steps_per_s"],
                     run["server_sandbox_rtt_ms"]["p50"], cpu["server"],
                     *[cpu["server_phases"].get(p, 0.0) for p in phases], cpu["server_http_loop_other"],
                     cpu["sandboxes"], cpu["load_generator"]])
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    lines = ["  ".join(str(v).rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    anchor = results.get("anchor_call_rtt_ms")
    if anchor:
        lines.append(f"anchor: executor call round trip in-process p50 {anchor['p50']} ms, p99 {anchor['p99']} ms "
                     "(CPU columns: ms per step)")
    return "\n".join(lines)


def create(client: httpx.Client, environment_id: str, **init_config) -> tuple[str, float]:
    started = time.perf_counter()
    response = client.post("/v1/envs", json={"environment_id": environment_id, "init_config": init_config})
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 201:
        raise RuntimeError(response.text)
    return response.json()["id"], elapsed


class _Done(Exception):
    """``--only-steps``: the step runs are done."""


def blob_bytes(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs").fetchone()[0]


ACCESS_LOG_SETUPS = {"access log on (info)": (("--log-level", "info"), {}),
                     "access log off (info)": (("--log-level", "info"), {"SANDPIT_ACCESS_LOG": "false"}),
                     "default level (warning)": ((), {})}
"""``--access-log``: the servers compared, as (``serve`` arguments, environment)."""


def access_log_overhead(steps: int, rounds: int) -> dict:
    """One client stepping one env on each server of :data:`ACCESS_LOG_SETUPS`, ``rounds``
    times ``steps`` steps each in turn, the order rotating by one each round (so drift of
    the machine and the place in a round hit all alike): step
    latency and the server's CPU per step, per setup, over the lean load generator and
    httpx."""
    results: dict = {"steps_per_block": steps, "rounds": rounds, "setups": {}}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        servers: dict[str, Server] = {}
        try:
            for name, (args, env) in ACCESS_LOG_SETUPS.items():
                data_dir = Path(tmp) / str(len(servers))
                data_dir.mkdir()
                servers[name] = Server(data_dir, *args, SANDPIT_EXECUTOR_POOL_SIZE="1", **env)
            targets = {}
            for name, server in servers.items():
                with server.client() as client:
                    environment_id = client.post("/v1/environments", json={"source_code": SOURCE,
                                                                           "class_name": "Bench"}).json()["id"]
                    env_id, _ = create(client, environment_id)
                    for _ in range(200):
                        step(client, env_id, "bump")
                targets[name] = env_id
            for kind in ("raw", "httpx"):
                samples: dict[str, list[float]] = {name: [] for name in servers}
                blocks: dict[str, list[float]] = {name: [] for name in servers}
                cpu: dict[str, float] = dict.fromkeys(servers, 0.0)
                names = list(servers)
                for round_ in range(rounds):
                    for name in names[round_ % len(names):] + names[:round_ % len(names)]:  # rotating order
                        server = servers[name]
                        # a fresh connection per block: the others' blocks outlast uvicorn's keep-alive
                        client = RawClient(server.url, server.api_key) if kind == "raw" else server.client()
                        for _ in range(20):
                            step(client, targets[name], "bump")
                        before = process_cpu_s(server.process.pid)
                        block = [step(client, targets[name], "bump") for _ in range(steps)]
                        cpu[name] += process_cpu_s(server.process.pid) - before
                        samples[name].extend(block)
                        blocks[name].append(statistics.median(block))
                        if isinstance(client, httpx.Client):
                            client.close()
                        else:
                            client.local.conn.close()
                for name in servers:
                    entry = results["setups"].setdefault(name, {})
                    entry[f"step_ms_{kind}"] = pcts(samples[name])
                    entry[f"block_p50_ms_{kind}"] = {"median": round(statistics.median(blocks[name]), 3),
                                                     "min": round(min(blocks[name]), 3),
                                                     "max": round(max(blocks[name]), 3)}
                    entry[f"server_cpu_ms_per_step_{kind}"] = round(cpu[name] / len(samples[name]) * 1000, 3)
            for name, server in servers.items():
                log = (server.data_dir / "server.log").read_text(errors="replace")
                results["setups"][name]["access_lines"] = sum(1 for line in log.splitlines()
                                                              if " /v1/envs/{env_id}/step " in line)
        finally:
            for server in servers.values():
                server.stop()
    return results


def access_log_table(results: dict) -> str:
    """The ``--access-log`` comparison as a table (ms)."""
    rows = [["setup", "raw p50", "raw p99", "raw block p50s", "raw cpu/step", "httpx p50", "httpx p99",
             "httpx cpu/step", "step lines"]]
    for name, run in results["setups"].items():
        spread = run["block_p50_ms_raw"]
        rows.append([name, run["step_ms_raw"]["p50"], run["step_ms_raw"]["p99"],
                     f"{spread['min']}-{spread['max']}", run["server_cpu_ms_per_step_raw"],
                     run["step_ms_httpx"]["p50"], run["step_ms_httpx"]["p99"],
                     run["server_cpu_ms_per_step_httpx"], run["access_lines"]])
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps for the 1-client latency run")
    parser.add_argument("--concurrent-steps", type=int, default=4000, help="steps for the 32-client run")
    parser.add_argument("--density", type=int, default=0, help="live envs for the density run (0: skip)")
    parser.add_argument("--anchor-calls", type=int, default=2000, help="executor round trips for the anchor (0: skip)")
    parser.add_argument("--only-steps", action="store_true", help="only the step runs (no create/state/fork/restore)")
    parser.add_argument("--access-log", action="store_true",
                        help="only the access log's cost: --steps steps per block, --rounds blocks per server")
    parser.add_argument("--rounds", type=int, default=5, help="--access-log: blocks of steps per server")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if args.steps < 1 or args.concurrent_steps < 32:
        parser.error(f"--steps {args.steps} and --concurrent-steps {args.concurrent_steps}: want at least 1 step "
                     "and at least 32 concurrent steps (one per client)")
    if args.access_log:
        output = args.output or Path(__file__).parent / "results" / "api_access_log.json"
        overhead = {"machine": machine(),
                    **access_log_overhead(args.steps, args.rounds)}
        print(json.dumps(overhead, indent=2))
        print(access_log_table(overhead))
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(overhead, indent=2))
        print(f"saved {output}")
        return
    args.output = args.output or Path(__file__).parent / "results" / "api.json"
    results: dict = {"machine": machine()}
    if args.anchor_calls:
        results["anchor_call_rtt_ms"] = anchor_call_rtt(args.anchor_calls)
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        data_dir = Path(tmp)
        server = Server(data_dir, SANDPIT_EXECUTOR_POOL_SIZE="4", SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX="8",
                        SANDPIT_EXECUTOR_MAX_SANDBOXES="48")
        try:
            with server.client(limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)) as client:
                environment_id = client.post("/v1/environments", json={"source_code": SOURCE,
                                                                       "class_name": "Bench"}).json()["id"]
                create_ms = [create(client, environment_id)[1] for _ in range(20)]
                results["env_create_ms"] = pcts(create_ms)

                raw = RawClient(server.url, server.api_key)
                lean = SocketClient(server.url, server.api_key)
                wide_key = server.new_tenant("wide", {"max_live_envs": 1_000_000, "max_concurrent_calls": 1024,
                                                      "max_running_calls": 32})
                wide_raw = RawClient(server.url, wide_key)
                env_id, _ = create(client, environment_id)
                env_ids = [create(client, environment_id)[0] for _ in range(32)]
                with server.client(wide_key, limits=httpx.Limits(max_connections=64,
                                                                 max_keepalive_connections=64)) as wide:
                    wide_environment = wide.post("/v1/environments", json={"source_code": SOURCE,
                                                                           "class_name": "Bench"}).json()["id"]
                    wide_ids = [create(wide, wide_environment)[0] for _ in range(32)]
                    for eid in [env_id, *env_ids]:
                        for _ in range(10):
                            step(client, eid, "bump")
                    for eid in wide_ids:
                        for _ in range(10):
                            step(wide, eid, "bump")
                    per_client = args.concurrent_steps // 32
                    sdk = SdkClient(server.url, server.api_key)
                    runs = {"1 client (httpx)": step_run(server, client, [env_id], args.steps),
                            "1 client (raw)": step_run(server, raw, [env_id], args.steps),
                            "1 client (socket)": step_run(server, lean, [env_id], args.steps),
                            "1 client (SDK)": step_run(server, sdk, [env_id], args.steps),
                            "32 clients (httpx)": step_run(server, client, env_ids, per_client),
                            "32 clients (raw)": step_run(server, raw, env_ids, per_client),
                            "32 clients (socket)": step_run(server, lean, env_ids, per_client),
                            "32 clients (httpx, max_running_calls=32)": step_run(server, wide, wide_ids, per_client),
                            "32 clients (raw, max_running_calls=32)": step_run(server, wide_raw, wide_ids,
                                                                                per_client)}
                    sdk.close()
                results["step_runs"] = runs
                # the headline figures as before (httpx client, default quotas)
                results["step_1_client_ms"] = runs["1 client (httpx)"]["latency_ms"]
                results["step_32_clients_ms"] = runs["32 clients (httpx)"]["latency_ms"]
                results["steps_per_s_32_clients"] = runs["32 clients (httpx)"]["steps_per_s"]
                if args.only_steps:
                    raise _Done

                records = {f"r{i:05d}": {"value": f"v{i}", "owner": f"user{i % 97}", "pad": "p" * 170}
                           for i in range(10000)}
                big_id, big_create = create(client, environment_id, records=records)
                size = len(json.dumps(records))
                before = blob_bytes(data_dir / "sandpit.db")
                big_steps = [step(client, big_id, "touch", key=f"r{(i * 37) % 10000:05d}", value=f"n{i}")
                             for i in range(50)]
                stored = (blob_bytes(data_dir / "sandpit.db") - before) / len(big_steps)
                results["large_state"] = {"state_bytes": size, "create_ms": round(big_create, 1),
                                          "stored_bytes_per_step": round(stored), "step_ms": pcts(big_steps)}

                fork_src, _ = create(client, environment_id)
                for _ in range(30):
                    step(client, fork_src, "bump")
                fork_ms, restore_ms = [], []
                for _ in range(10):
                    started = time.perf_counter()
                    response = client.post(f"/v1/envs/{fork_src}/fork", json={"step": 30, "count": 16})
                    fork_ms.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 201, response.text
                    for fork in response.json()["data"]:
                        client.delete(f"/v1/envs/{fork['id']}")
                for k in range(10):
                    target = 20 + k
                    started = time.perf_counter()
                    response = client.post(f"/v1/envs/{fork_src}/restore", json={"step": target})
                    restore_ms.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 200, response.text
                    for _ in range(30 - target):
                        step(client, fork_src, "bump")
                results["fork_30_steps_x16_ms"] = pcts(fork_ms)
                results["restore_ms"] = pcts(restore_ms)

                if args.density:
                    lock = threading.Lock()
                    dense_ids = []
                    started = time.perf_counter()
                    for i in range(args.density):
                        dense_ids.append(create(client, environment_id, count=i)[0])
                    results_d = {"envs": args.density, "create_all_s": round(time.perf_counter() - started, 1)}
                    errors = 0
                    latencies: list[float] = []

                    def dense(eid: str) -> None:
                        nonlocal errors
                        for _ in range(5):
                            try:
                                value = step(client, eid, "bump")
                            except Exception:  # noqa: BLE001 - counted
                                with lock:
                                    errors += 1
                            else:
                                with lock:
                                    latencies.append(value)

                    with ThreadPoolExecutor(200) as pool:
                        list(pool.map(dense, dense_ids))
                    results_d.update({"stepping_concurrently": 200, "errors": errors, "step_ms": pcts(latencies),
                                      "server_rss_mib": round(server.rss_mib(), 1)})
                    results["density"] = results_d
                results["server_rss_mib"] = round(server.rss_mib(), 1)
        except _Done:
            results["server_rss_mib"] = round(server.rss_mib(), 1)
        finally:
            server.stop()
    print(json.dumps(results, indent=2))
    print(budget_table(results))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
