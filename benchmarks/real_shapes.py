"""Real-shaped environments benchmark (issue 29, first target): starts its own ``sandpit
serve`` with DEFAULT executor settings (no ``SANDPIT_EXECUTOR_*`` variable; loopback,
temporary SQLite file, ``benchmarks/api.py``'s :class:`Server`) and sends every shape below
through the same HTTP paths: register, create (first, then repeated with the same 1-3 MB
``init_config``, each env deleted after its create, as a trainer resetting an env each
episode does), one writing step, one evaluate of 2 checks.

The shapes (our own code, written in the shapes real suites use):

* ``anchor_retail``: ``benchmarks/taubench_shaped.py``'s ``RetailTools`` (the synthetic
  environment ``benchmarks/cold.py`` measures), everything under ``self.data``;
* ``keeps_config``: tau-bench ``Env.data`` style: the constructor keeps the config's nested
  tables (``self.data = init_config["data"]``, no copy) and tools mutate them in place,
  deeply; imports ``json``, ``copy``, ``typing``;
* ``normalises``: the constructor deep-copies and normalises the nested tables into
  attributes of its own (``self.users``, ``self.orders`` keyed by id, sorted items,
  totals computed);
* ``module_table``: module-level tables and constants (a tax table, a status list) that
  tools read;
* ``reads_clock``: stores ``datetime.now()`` in its state: not deterministic, the fast
  path must be refused;
* ``counts_instances``: its constructor counts instances in a module-level dict: refused
  (construction changes module-level state).

Per shape: ``create_first_ms`` (the first create of the config), ``create_same_config_ms``
(p50/p99/mean of repeated creates with the same config, milliseconds, after the first two;
the first of them may be constructed while the config's template is being built:
``constructed_before_first_template`` counts those, ``template_creates`` the creates that
took the fast path, ``create_from_template_ms`` their p50/p99/mean),
``step_ms`` and ``evaluate_ms`` (p50/p99/mean), ``reset_same_config_ms`` (p50/p99/mean of
``POST /v1/envs/{id}/reset`` of one env, the config kept: a trainer's episode loop) with
``reset_template_count`` (how many took the fast path), ``construction`` (the ``construction``
field of the last create's response: ``path`` ``template``/``constructed`` and ``reason``),
``deterministic`` (whether the shape is expected to take the fast path) and ``target_met``
(p50 <= ``target_ms`` for a deterministic shape; None otherwise). The JSON also holds
``machine`` (cores, platform, load average at start and end), ``config_bytes`` per shape,
``settings`` (``"defaults"``) and ``refusals`` (``sandpit_env_construction_total`` samples
from ``/metrics`` at the end, by path and reason class).

Prints a table and saves JSON to ``benchmarks/results/real_shapes.json``.
Usage: ``python benchmarks/real_shapes.py [--runs 20] [--size-mb 1.5] [--only keeps_config,...]``
(about 2 minutes at the defaults on a quiet 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from cold import scaled_config, timed  # noqa: E402 - the cold-path benchmark's config and timer
from taubench_shaped import RETAIL_SOURCE, json_size  # noqa: E402

from api import Server, machine, pcts, save  # noqa: E402 - benchmarks/ is not a package

TARGET_MS = 50.0

KEEPS_CONFIG = '''
import copy
import json
from typing import Any, Dict, List


class KeepsConfig:
    """tau-bench Env.data style: the config's tables kept as they are and changed in place."""

    def __init__(self, init_config: Dict[str, Any]):
        self.data = init_config["data"]
        self.actions: List[str] = []

    def get_order(self, order_id: str) -> str:
        """Return an order as JSON."""
        return json.dumps(self.data["orders"].get(order_id), sort_keys=True)

    def add_note(self, order_id: str, note: str) -> str:
        """Append a note deep inside an order (its last payment record)."""
        order = self.data["orders"][order_id]
        order["payment_history"][-1].setdefault("notes", []).append(note)
        self.actions.append("add_note")
        return "ok"

    def set_address(self, user_id: str, city: str) -> str:
        """Change a user's city in place."""
        self.data["users"][user_id]["address"]["city"] = city
        self.actions.append("set_address")
        return copy.deepcopy(self.data["users"][user_id])["address"]["city"]
'''

NORMALISES = '''
import copy
from typing import Any, Dict


class Normalises:
    """Deep-copies and normalises the config's nested tables into its own attributes."""

    def __init__(self, init_config: Dict[str, Any]):
        tables = copy.deepcopy(init_config.get("data", {}))
        self.users = {uid: dict(user, name=user["name"]["first_name"] + " " + user["name"]["last_name"])
                      for uid, user in sorted(tables.get("users", {}).items())}
        self.orders = {}
        for oid, order in sorted(tables.get("orders", {}).items()):
            items = sorted(order["items"], key=lambda item: item["item_id"])
            self.orders[oid] = dict(order, items=items, total=round(sum(i["price"] for i in items), 2))
        self.products = tables.get("products", {})

    def cancel(self, order_id: str) -> str:
        """Cancel an order."""
        self.orders[order_id]["status"] = "cancelled"
        return str(self.orders[order_id]["total"])
'''

MODULE_TABLE = '''
from typing import Any, Dict

TAX_RATES = {"CA": 0.0725, "NY": 0.04, "TX": 0.0625, "WA": 0.065}
STATUSES = ("pending", "processed", "delivered", "cancelled")


class ModuleTable:
    """Tools read module-level tables; the state is the config's tables."""

    def __init__(self, init_config: Dict[str, Any]):
        self.data = init_config["data"]
        self.rate = TAX_RATES["CA"]

    def order_tax(self, order_id: str, state: str = "CA") -> str:
        """Tax of an order in a state."""
        order = self.data["orders"][order_id]
        return str(round(sum(i["price"] for i in order["items"]) * TAX_RATES.get(state, 0.0), 2))

    def advance(self, order_id: str) -> str:
        """Move an order to its next status."""
        order = self.data["orders"][order_id]
        order["status"] = STATUSES[min(STATUSES.index(order["status"]) + 1, len(STATUSES) - 1)] \\
            if order["status"] in STATUSES else "pending"
        return order["status"]
'''

READS_CLOCK = '''
from datetime import datetime
from typing import Any, Dict


class ReadsClock:
    """Stores the time of its construction: two constructions differ."""

    def __init__(self, init_config: Dict[str, Any]):
        self.data = init_config["data"]
        self.opened_at = datetime.now().isoformat()

    def touch(self, user_id: str) -> str:
        """Mark a user as seen."""
        self.data["users"][user_id]["seen"] = True
        return "ok"
'''

COUNTS_INSTANCES = '''
from typing import Any, Dict

_CREATED = {"count": 0}


class CountsInstances:
    """Counts its instances in a module-level dict: construction changes module state."""

    def __init__(self, init_config: Dict[str, Any]):
        _CREATED["count"] += 1
        self.data = init_config["data"]
        self.serial = _CREATED["count"]

    def touch(self, user_id: str) -> str:
        """Mark a user as seen."""
        self.data["users"][user_id]["seen"] = True
        return "ok"
'''

SHAPES: dict[str, dict[str, Any]] = {
    "anchor_retail": {"source": RETAIL_SOURCE, "class_name": "RetailTools", "deterministic": True,
                      "step": ("modify_user_address", {"user_id": "user_0001", "address": {"city": "Reno"}})},
    "keeps_config": {"source": KEEPS_CONFIG, "class_name": "KeepsConfig", "deterministic": True,
                     "step": ("add_note", {"order_id": "#W0000001", "note": "called"})},
    "normalises": {"source": NORMALISES, "class_name": "Normalises", "deterministic": True,
                   "step": ("cancel", {"order_id": "#W0000001"})},
    "module_table": {"source": MODULE_TABLE, "class_name": "ModuleTable", "deterministic": True,
                     "step": ("advance", {"order_id": "#W0000001"})},
    "reads_clock": {"source": READS_CLOCK, "class_name": "ReadsClock", "deterministic": False,
                    "step": ("touch", {"user_id": "user_0001"})},
    "counts_instances": {"source": COUNTS_INSTANCES, "class_name": "CountsInstances", "deterministic": False,
                         "step": ("touch", {"user_id": "user_0001"})},
}
SAMPLE_CONFIG = {"data": {"users": {}, "orders": {}, "products": {}}}
"""What registration constructs the class with to derive its tools (no records)."""
CHECKS = [{"check_item": "has data", "check_func": "def check_func(final_state):\n    return bool(final_state)\n"},
          {"check_item": "kept keys", "check_func": "def check_func(final_state):\n"
                                                     "    return set(initial_state) == set(final_state)\n"}]


def bench_shape(client: httpx.Client, name: str, config: dict[str, Any], runs: int) -> dict[str, Any]:
    """Every figure of one shape (see the module docstring)."""
    shape = SHAPES[name]
    response = client.post("/v1/environments", json={"source_code": shape["source"], "class_name": shape["class_name"],
                                                     "sample_init_config": SAMPLE_CONFIG})
    if response.status_code != 201:
        raise RuntimeError(response.text)
    environment_id = response.json()["id"]
    body = json.dumps({"environment_id": environment_id, "init_config": config}).encode()

    def create() -> tuple[float, dict[str, Any]]:
        elapsed, reply = timed(lambda: client.post("/v1/envs", content=body,
                                                   headers={"Content-Type": "application/json"}), 201)
        return elapsed, reply.json()

    out: dict[str, Any] = {"deterministic": shape["deterministic"], "config_bytes": json_size(config)}
    first, env = create()
    out["create_first_ms"] = round(first, 1)
    second, other = create()  # the second create of a config may build its config template
    out["create_second_ms"] = round(second, 1)
    client.delete(f"/v1/envs/{other['id']}")
    same, paths = [], []
    for _ in range(runs):
        elapsed, other = create()
        same.append(elapsed)
        paths.append((other.get("construction") or {}).get("path"))
        client.delete(f"/v1/envs/{other['id']}")
    out["create_same_config_ms"] = pcts(same)
    out["construction"] = other.get("construction")
    out["template_creates"] = paths.count("template")
    out["constructed_before_first_template"] = paths.index("template") if "template" in paths else len(paths)
    if "template" in paths:
        out["create_from_template_ms"] = pcts([ms for ms, path in zip(same, paths, strict=True) if path == "template"])
    tool, arguments = shape["step"]
    steps, evaluations = [], []
    for _ in range(max(3, runs // 4)):
        elapsed, reply = timed(lambda: client.post(f"/v1/envs/{env['id']}/step",
                                                   json={"name": tool, "arguments": arguments}), 200)
        if reply.json()["status"] != "ok":
            raise RuntimeError(reply.text[:500])
        steps.append(elapsed)
        elapsed, reply = timed(lambda: client.post(f"/v1/envs/{env['id']}/evaluate", json={"checks": CHECKS}), 200)
        evaluations.append(elapsed)
    out["step_ms"] = pcts(steps)
    out["evaluate_ms"] = pcts(evaluations)
    resets, reset_paths = [], []
    for _ in range(max(3, runs // 2)):
        elapsed, reply = timed(lambda: client.post(f"/v1/envs/{env['id']}/reset", json={}), 200)
        resets.append(elapsed)
        reset_paths.append((reply.json().get("construction") or {}).get("path"))
    out["reset_same_config_ms"] = pcts(resets)
    out["reset_template_count"] = reset_paths.count("template")
    client.delete(f"/v1/envs/{env['id']}")
    out["target_met"] = out["create_same_config_ms"]["p50"] <= TARGET_MS if shape["deterministic"] else None
    return out


def construction_metrics(text: str) -> dict[str, float]:
    """``sandpit_env_construction_total`` samples of a ``/metrics`` page by their labels."""
    found = {}
    for line in text.splitlines():
        if line.startswith("sandpit_env_construction_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.removeprefix("sandpit_env_construction_total")] = float(value)
    return found


def table(results: dict[str, Any]) -> str:
    lines = [f"{'shape':18s} {'MB':>4s} {'first':>7s} {'same p50':>9s} {'p99':>7s} {'reset':>6s} {'step':>6s} "
             f"{'eval':>6s}  "
             f"{'verdict':12s} reason"]
    for name, r in results["shapes"].items():
        c = r.get("construction") or {}
        met = {True: "  ok", False: "  MISSED", None: ""}[r["target_met"]]
        lines.append(f"{name:18s} {r['config_bytes'] / 1e6:4.1f} {r['create_first_ms']:7.0f} "
                     f"{r['create_same_config_ms']['p50']:9.1f} {r['create_same_config_ms']['p99']:7.1f} "
                     f"{r['reset_same_config_ms']['p50']:6.1f} {r['step_ms']['p50']:6.1f} {r['evaluate_ms']['p50']:6.1f}  {str(c.get('path')):12s} "
                     f"{c.get('reason') or ''}{met} (constructed before the fast path: "
                     f"{r['constructed_before_first_template']})")
    lines.append(f"target: repeated same-config create p50 <= {TARGET_MS:g} ms for every deterministic shape "
                 f"(milliseconds; default settings)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24, help="repeated creates per shape")
    parser.add_argument("--size-mb", type=float, default=1.5, help="init_config size (MB)")
    parser.add_argument("--only", default=",".join(SHAPES), help="comma-separated shapes (default: all)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "real_shapes.json")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    if not names or any(n not in SHAPES for n in names):
        parser.error(f"--only takes shapes of {', '.join(SHAPES)}")
    config = scaled_config("retail", args.size_mb)
    results: dict[str, Any] = {"machine": machine(), "settings": "defaults", "target_ms": TARGET_MS, "shapes": {}}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        server = Server(Path(tmp))
        try:
            with server.client() as client:
                for name in names:
                    results["shapes"][name] = bench_shape(client, name, config, args.runs)
                    print(f"{name}: {results['shapes'][name]['create_same_config_ms']}", flush=True)
                results["refusals"] = construction_metrics(client.get("/metrics").text)
        finally:
            server.stop()
    print(table(results))
    save(results, args.output)


if __name__ == "__main__":
    main()
