"""``sandpit demo``: drive the bundled EnvScaler-style ``OrderDesk`` environment through
real sandboxes and print every observation, the state changes and timings.

The environment source is read as text from ``sandbox_images/environments`` and executed
only inside sandboxes. Several episodes run concurrently (one session each) to show
isolation; one episode also exercises a rejected call, a tool error and snapshot/restore.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rich.console import Console
from rich.table import Table
from sandpit.executor.docker import DockerDriver
from sandpit.executor.pool import SandboxPool
from sandpit.executor.recovering import RecoveringSession
from sandpit.executor.settings import get_settings
from sandpit.output import note
from sandpit.sandbox_images import DEFINITION_DIR

INIT_CONFIG: dict[str, Any] = {
    "products": {
        "P1": {"name": "Espresso beans 1kg", "price": 18.5, "stock": 12},
        "P2": {"name": "Ceramic espresso cup", "price": 6.0, "stock": 40},
        "P3": {"name": "Milk frother", "price": 34.9, "stock": 2},
    },
    "customers": {"C1": {"name": "Ada"}, "C2": {"name": "Linus"}},
}

EPISODE: list[tuple[str, dict[str, Any]]] = [
    ("search_products", {"query": "espresso"}),
    ("add_to_cart", {"customer_id": "C1", "product_id": "P1", "quantity": 2}),
    ("add_to_cart", {"customer_id": "C1", "product_id": "P3", "quantity": 5}),
    ("checkout", {"customer_id": "C1"}),  # rule: not enough stock for P3
    ("get_product", {"product_id": "P9"}),  # tool raises -> "Error: KeyError ..."
    ("__class__", {}),  # not a tool -> rejected
    ("add_to_cart", {"customer_id": "C1", "product_id": "P2", "quantity": 1}),
]


def load_source() -> str:
    return (DEFINITION_DIR / "environments" / "order_desk.py").read_text()


def _episode(session: RecoveringSession, console: Console, verbose: bool) -> list[float]:
    latencies = []
    for name, arguments in EPISODE:
        result = session.call(name, arguments)
        latencies.append(result.duration_ms)
        if verbose:
            changed = ", ".join(sorted(result.delta.set)) or "-"
            note(console, "  ", (name, "bold"), f"({json.dumps(arguments)}) -> ", (result.status, "cyan"),
                 f" {result.observation[:110]!r}  changed: {changed}  ({result.duration_ms:.2f} ms)")
    return latencies


def run_demo(sessions: int = 2, console: Console | None = None) -> dict[str, Any]:
    """Run ``sessions`` concurrent episodes; returns a summary dict (also printed)."""
    console = console or Console()
    source = load_source()
    settings = get_settings().model_copy(update={"pool_size": min(sessions, 4)})
    driver = DockerDriver(settings)
    with SandboxPool(driver, settings) as pool:
        console.print(f"[bold]image[/bold] {driver.image}  runtime={settings.runtime}")
        t0 = time.perf_counter()
        opened = [RecoveringSession(pool, tenant="demo", source=source, class_name="OrderDesk", init_config=INIT_CONFIG)
                  for _ in range(sessions)]  # each keeps its state: snapshot() below, re-opened after a lost sandbox
        console.print(f"opened {sessions} session(s) in {(time.perf_counter() - t0) * 1000:.0f} ms")
        first = opened[0]
        console.print("[bold]episode 1[/bold] (OrderDesk)")
        latencies = _episode(first, console, verbose=True)
        snapshot = first.snapshot()
        for name, arguments in (("add_to_cart", {"customer_id": "C2", "product_id": "P2", "quantity": 3}),
                                ("checkout", {"customer_id": "C2"})):
            result = first.call(name, arguments)
            note(console, f"  {name} -> {result.status} {result.observation!r}")
        note(console, f"  orders after checkout: {json.dumps(first.state()['orders'])}")
        first.restore(snapshot)
        note(console, f"  restored snapshot; orders now: {json.dumps(first.state()['orders'])}")
        with ThreadPoolExecutor(max(1, sessions - 1)) as workers:
            for more in workers.map(lambda s: _episode(s, console, verbose=False), opened[1:]):
                latencies += more
        bench = []
        for _ in range(200):
            bench.append(first.call("search_products", {"query": "cup"}).duration_ms)
        state = first.state()
        for session in opened:
            session.close()
        stats = pool.stats()
    table = Table("metric", "value", title="demo summary")
    summary = {
        "episodes": sessions,
        "tool_calls": len(latencies) + len(bench) + 1,
        "call_p50_ms": round(statistics.median(bench), 3),
        "call_p99_ms": round(sorted(bench)[int(len(bench) * 0.99) - 1], 3),
        "final_stock": {pid: p["stock"] for pid, p in state["products"].items()},
        "failures": stats["failures"],
    }
    for key, value in summary.items():
        table.add_row(key, json.dumps(value))
    console.print(table)
    return summary
