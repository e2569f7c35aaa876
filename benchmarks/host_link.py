"""Host link benchmark: the Ray backend's replica-to-host hop, with and without TLS, beside a
Ray actor call.

Paths, each a server answering an empty request (``noop``, answered ``{"ok": []}``) in a
server process of its own (a spawned process, or with ``--ray`` a Ray actor on a one-node
local cluster, as the sandbox host actor is), and its client in this process:

  grpc_tls        ``executor/ray/link.py``: gRPC, TLS with a pinned certificate, token per call
  grpc_plain      the same gRPC link without TLS (``PlaintextLinkServer``/``PlaintextHostLink``
                  below, here only to price TLS: the project has no plaintext link)
  ray_actor_call  (``--ray`` only, round trips only) the same hop as a Ray actor call, the
                  path requests take when a link cannot be opened

Measured in rounds, the paths interleaved and their order rotating from round to round, so
machine noise hits them alike:

  rtt_ms           one request at a time on one thread: round trip p50/p99/mean (ms);
                   within a round, one request on each path in turn
  throughput       requests/s with 1 and with 16 client threads sharing one link, for
                   ``--seconds`` per transport per round, with the latency the threads saw
  cpu_ms_per_req   CPU time (ms) per request of the client process and of the server
                   process during the 1-thread throughput runs

``benchmarks/scale.py`` measures the same hop through ``RayExecutor.ask`` to a real sandbox
host actor (``link_rtt_ms``); here it is the link alone. Prints a table and saves JSON to
``benchmarks/results/host_link.json``.

Usage: ``python benchmarks/host_link.py [--requests 2000] [--rounds 5] [--seconds 2] [--ray]``.
Takes about a minute and a half. Numbers on a loaded machine are noisy: re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table
from sandpit.executor.ray import link as grpc_link

sys.path.insert(0, str(Path(__file__).parent))
from hoststat import StealSampler  # noqa: E402 - the hypervisor's share of the run

TOKEN = bytes(range(32))
MAX_FRAME = 4 << 20
WORKERS = 256  # the host actor's HOST_CONCURRENCY
TRANSPORTS = ("grpc_tls", "grpc_plain")


class PlaintextLinkServer(grpc_link.LinkServer):
    """The gRPC link server without TLS: a benchmark's reference for the cost of TLS only."""

    def _listen(self, target: str, key: bytes, certificate: bytes) -> int:
        return self._server.add_insecure_port(target)


class PlaintextHostLink(grpc_link.HostLink):
    """The gRPC link client without TLS (pairs with :class:`PlaintextLinkServer`)."""

    @staticmethod
    def _open_channel(target: str, certificate: bytes, options: list[tuple[str, Any]]) -> grpc.Channel:
        return grpc.insecure_channel(target, options)


def noop(op: str, args: list[Any]) -> dict[str, Any]:
    """The servers' dispatch: every request is answered with its own arguments."""
    return {"ok": args}


class Hosts:
    """The server side: one server per transport, in a process of its own (a spawned
    process, or a Ray actor with ``--ray``, as the host actor is)."""

    def __init__(self) -> None:
        self.servers = {
            "grpc_tls": grpc_link.LinkServer(noop, "127.0.0.1", TOKEN, MAX_FRAME, WORKERS),
            "grpc_plain": PlaintextLinkServer(noop, "127.0.0.1", TOKEN, MAX_FRAME, WORKERS),
        }

    def endpoints(self) -> dict[str, dict[str, Any]]:
        return {name: {"port": server.port, "certificate": getattr(server, "certificate", "")}
                for name, server in self.servers.items()}

    def cpu(self) -> float:
        """This process's CPU time so far (seconds)."""
        return time.process_time()

    def noop(self) -> None:
        """Nothing (``--ray``: the hop as a Ray actor call)."""

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


def serve(pipe: Connection) -> None:
    """The spawned server process: endpoints up the pipe, then CPU time on request until
    told to stop."""
    hosts = Hosts()
    pipe.send(hosts.endpoints())
    while pipe.recv() == "cpu":
        pipe.send(hosts.cpu())
    hosts.close()


def open_links(endpoints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One client per transport, to the server process's endpoints."""
    token = TOKEN.hex()
    return {
        "grpc_tls": grpc_link.HostLink("bench", "127.0.0.1", endpoints["grpc_tls"]["port"], token, MAX_FRAME,
                                       endpoints["grpc_tls"]["certificate"]),
        "grpc_plain": PlaintextHostLink("bench", "127.0.0.1", endpoints["grpc_plain"]["port"], token, MAX_FRAME, ""),
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99),
            "mean": round(statistics.fmean(values), 3)}


def rotated(names: list[str], round_index: int) -> list[str]:
    """``names`` in this round's order (each goes first in turn)."""
    k = round_index % len(names)
    return names[k:] + names[:k]


def rtt_rounds(calls: dict[str, Callable[[], object]], requests: int, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per empty request, one at a time, one request on each path in turn."""
    names = list(calls)
    out: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm up: connections, code paths, allocator
        for _ in range(200):
            calls[name]()
    per_round = max(1, requests // rounds)
    for r in range(rounds):
        order = rotated(names, r)
        for _ in range(per_round):
            for name in order:
                started = time.perf_counter()
                calls[name]()
                out[name].append((time.perf_counter() - started) * 1000)
    return out


def drive(request: Callable[[], object], threads: int, seconds: float) -> tuple[int, list[float]]:
    """``threads`` threads calling ``request`` back to back for ``seconds``: (requests done,
    each one's latency in ms)."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop = time.perf_counter() + seconds
    barrier = threading.Barrier(threads)

    def worker(k: int) -> None:
        mine = latencies[k]
        barrier.wait()
        while (started := time.perf_counter()) < stop:
            request()
            mine.append((time.perf_counter() - started) * 1000)

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    flat = [ms for mine in latencies for ms in mine]
    return len(flat), flat


def throughput_rounds(links: dict[str, Any], server_cpu: Callable[[], float], rounds: int,
                      seconds: float) -> dict[str, Any]:
    """Requests/s with 1 and 16 threads per transport, interleaved in rounds; CPU per
    request of both processes on the 1-thread runs."""
    done: dict[tuple[str, int], int] = {}
    lat: dict[tuple[str, int], list[float]] = {}
    wall: dict[tuple[str, int], float] = {}
    cpu = {name: {"client": 0.0, "server": 0.0, "requests": 0.0} for name in TRANSPORTS}
    for r in range(rounds):
        for name in rotated(list(TRANSPORTS), r):
            link = links[name]
            for threads in (1, 16):
                server_before, client_before = server_cpu(), time.process_time()
                started = time.perf_counter()
                n, latencies = drive(lambda link=link: link.request("noop", [], 5), threads, seconds)
                elapsed = time.perf_counter() - started
                server_used, client_used = server_cpu() - server_before, time.process_time() - client_before
                key = (name, threads)
                done[key] = done.get(key, 0) + n
                wall[key] = wall.get(key, 0.0) + elapsed
                lat.setdefault(key, []).extend(latencies)
                if threads == 1:
                    cpu[name]["client"] += client_used
                    cpu[name]["server"] += server_used
                    cpu[name]["requests"] += n
    out: dict[str, Any] = {}
    for name in TRANSPORTS:
        out[name] = {f"{threads}_threads": {"requests_per_s": round(done[(name, threads)] / wall[(name, threads)]),
                                            "latency_ms": summary(lat[(name, threads)])} for threads in (1, 16)}
        n = cpu[name]["requests"]
        out[name]["cpu_ms_per_req"] = {side: round(cpu[name][side] * 1000 / n, 3) for side in ("client", "server")}
    return out


def measure(endpoints: dict[str, dict[str, Any]], server_cpu: Callable[[], float], args: argparse.Namespace,
            extra: dict[str, Callable[[], object]]) -> dict[str, Any]:
    """Both measures over fresh links to ``endpoints``; ``extra`` paths join the round trips."""
    links: dict[str, Any] = {}
    try:
        links = open_links(endpoints)
        calls: dict[str, Callable[[], object]] = {
            name: (lambda link=link: link.request("noop", [], 5)) for name, link in links.items()}
        steal = StealSampler().start()
        rtt = rtt_rounds({**calls, **extra}, args.requests, args.rounds)
        rates = throughput_rounds(links, server_cpu, args.rounds, args.seconds)
        steal.stop()
    finally:
        for link in links.values():
            link.close()
    out: dict[str, Any] = {"host_steal": steal.summary(),
                           "transports": {name: {"rtt_ms": summary(rtt[name]), **rates[name]} for name in TRANSPORTS}}
    out["transports"].update({name: {"rtt_ms": summary(rtt[name])} for name in extra})
    base = out["transports"]["grpc_tls"]["rtt_ms"]["p50"]
    for values in out["transports"].values():
        values["rtt_p50_vs_grpc_tls"] = round(values["rtt_ms"]["p50"] / base, 2)
    return out


def in_process(args: argparse.Namespace) -> dict[str, Any]:
    """The servers in a spawned process of their own."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    server = context.Process(target=serve, args=(theirs,), daemon=True)
    server.start()

    def server_cpu() -> float:
        ours.send("cpu")
        used: float = ours.recv()
        return used

    try:
        return measure(ours.recv(), server_cpu, args, {})
    finally:
        ours.send("stop")
        server.join(10)


def in_ray_actor(args: argparse.Namespace) -> dict[str, Any]:
    """The servers in a Ray actor on a one-node local cluster (127.0.0.1), as the sandbox
    host actor is; a Ray actor call joins the round trips (``ray_actor_call``)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        ray.init(address=cluster.address)
        actor = ray.remote(Hosts).remote()
        endpoints = ray.get(actor.endpoints.remote(), timeout=60)
        try:
            return measure(endpoints, lambda: float(ray.get(actor.cpu.remote())), args,
                           {"ray_actor_call": lambda: ray.get(actor.noop.remote())})
        finally:
            ray.get(actor.close.remote(), timeout=30)
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="one-at-a-time requests per transport")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per transport, thread count and round")
    parser.add_argument("--ray", action="store_true", help="the servers in a Ray actor (the 'ray' extra)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "host_link.json")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "grpcio": grpc.__version__},
        "settings": {"requests": args.requests, "rounds": args.rounds, "seconds": args.seconds,
                     "server_workers": WORKERS, "max_frame": MAX_FRAME,
                     "server": "Ray actor" if args.ray else "spawned process"},
        "anchor": "ray_actor_call (--ray): the path a request takes without a link",
        **(in_ray_actor(args) if args.ray else in_process(args)),
    }
    table = Table(title=f"host link: empty request, server in a {results['settings']['server']}, loopback")
    for column in ("path", "rtt p50 ms", "rtt p99 ms", "x grpc_tls", "1 thread req/s", "16 threads req/s",
                   "16 threads p99 ms", "client CPU ms/req", "server CPU ms/req"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for name, t in results["transports"].items():
        rates = [str(t["1_threads"]["requests_per_s"]), str(t["16_threads"]["requests_per_s"]),
                 f"{t['16_threads']['latency_ms']['p99']:.2f}", f"{t['cpu_ms_per_req']['client']:.3f}",
                 f"{t['cpu_ms_per_req']['server']:.3f}"] if "1_threads" in t else [""] * 5
        table.add_row(name, f"{t['rtt_ms']['p50']:.3f}", f"{t['rtt_ms']['p99']:.3f}", f"{t['rtt_p50_vs_grpc_tls']:.2f}",
                      *rates)
    Console(width=140).print(table)
    print(f"host steal: {results['host_steal']['steal_pct']}% of CPU time")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
