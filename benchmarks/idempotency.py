"""Idempotent-step overhead: starts its own ``sandpit serve`` (loopback, temporary SQLite
file) and steps one env over real HTTP (keep-alive ``http.client``, one client), in
alternating blocks of the same run:

* ``plain``: steps without ``Idempotency-Key``;
* ``keyed``: each step with a new key (the key is read, then claimed with the step's
  response in the step's own transaction);
* ``replay``: the same keyed step sent again (the stored response; no sandbox call).

Prints p50/p99 per kind and the added p50 of ``keyed`` over ``plain``, and saves JSON to
``benchmarks/results/idempotency.json``.
Usage: ``python benchmarks/idempotency.py [--steps 1000] [--block 50]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from api import SOURCE, Server, pcts  # noqa: E402 - benchmarks/ is not a package

KINDS = ("plain", "keyed", "replay")


def post(conn: http.client.HTTPConnection, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps of each kind")
    parser.add_argument("--block", type=int, default=50, help="steps of one kind in a row")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp))
        try:
            with server.client() as client:
                environment = client.post("/v1/environments", json={"source_code": SOURCE, "class_name": "Bench"})
                created = client.post("/v1/envs", json={"environment_id": environment.json()["id"],
                                                        "episode": {"max_steps": None}})
                if created.status_code != 201:
                    raise SystemExit(created.text)
                env_id = created.json()["id"]
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            base = {**server.headers, "Content-Type": "application/json"}
            path = f"/v1/envs/{env_id}/step"
            body = json.dumps({"name": "bump", "arguments": {"by": 1}}).encode()
            samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
            replay_key = str(uuid.uuid4())
            status, first = post(conn, path, {**base, "Idempotency-Key": replay_key}, body)
            for _ in range(20):  # warm-up
                post(conn, path, base, body)
            done = 0
            while done < args.steps:
                for kind in KINDS:
                    for _ in range(min(args.block, args.steps - done)):
                        headers = base if kind == "plain" else {
                            **base, "Idempotency-Key": replay_key if kind == "replay" else str(uuid.uuid4())}
                        started = time.perf_counter()
                        status, reply = post(conn, path, headers, body)
                        samples[kind].append((time.perf_counter() - started) * 1000)
                        if status != 200 or (kind == "replay" and reply != first):
                            raise SystemExit(f"{kind}: {status} {reply[:200]!r}")
                done += min(args.block, args.steps - done)
            conn.close()
        finally:
            server.stop()
    results = {kind: pcts(values) for kind, values in samples.items()}
    results["keyed_added_p50_ms"] = round(results["keyed"]["p50"] - results["plain"]["p50"], 3)
    for kind in KINDS:
        print(f"{kind:7s} p50 {results[kind]['p50']:7.3f} ms  p99 {results[kind]['p99']:7.3f} ms  "
              f"(n={results[kind]['n']})")
    print(f"keyed - plain at p50: {results['keyed_added_p50_ms']:+.3f} ms")
    out = Path(__file__).parent / "results" / "idempotency.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
