"""Validation, reward and execution benchmark, with llm-sandbox side by side.

Starts its own ``sandpit serve`` (loopback, temporary SQLite file) and measures over HTTP:

* ``POST /v1/validate`` of an environment (policy + load + instantiate + tools + one smoke
  call): validations/s, sequential and with 4 clients;
* ``POST /v1/validate`` of a check function (one case): validations/s;
* ``POST /v1/envs/{id}/evaluate`` with 256 trivial check functions (the per-call cap): checks/s;
* ``POST /v1/execute`` of ``print(1)``: p50/p99 latency;
* the same snippet through ``llm_sandbox.SandboxSession(image=..., skip_environment_setup=True)``
  (PyPI ``llm-sandbox``, ``pip install -e '.[bench]'``) on the same machine, same base image
  (plus a ``python`` symlink and ``sleep infinity`` as it requires), one warm session:
  p50/p99 and the ratio.

Prints JSON and saves ``benchmarks/results/validate.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from sandpit.executor.docker.images import resolve_image
from sandpit.executor.settings import get_image_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api import Server  # noqa: E402 - the sibling benchmark's server launcher

ENV_SOURCE = '''
class Counter:
    """A counter."""

    def __init__(self, init_config):
        self.count = init_config.get("count", 0)

    def bump(self, by: int = 1) -> int:
        """Add `by`."""
        self.count += by
        return self.count
'''
CHECK = "def check_func(final_state):\n    return final_state['count'] == initial_state['count'] + {n}\n"


def pcts(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"n": len(ordered), "p50": round(statistics.median(ordered), 2),
            "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2)}


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def llm_sandbox_image(client: docker.DockerClient, base: str) -> str:
    """Our sandbox image plus what llm-sandbox needs (``python`` on PATH, a idle command)."""
    tag = base.replace("sandpit-sandbox", "sandpit-llmsandbox-bench")
    dockerfile = (f"FROM {base}\nUSER root\nRUN ln -sf /usr/bin/python3 /usr/local/bin/python\n"
                  "USER 10001:10001\nCMD [\"sleep\", \"infinity\"]\n")
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, network_mode="none")
    return tag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60, help="samples per latency measurement")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "validate.json")
    args = parser.parse_args()
    results: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_POOL_SIZE="4")
        try:
            with server.client() as api:
                body = {"kind": "environment", "source_code": ENV_SOURCE, "class_name": "Counter",
                        "smoke_calls": [{"name": "bump", "arguments": {"by": 1}}]}
                for _ in range(3):
                    api.post("/v1/validate", json=body)
                seq = timed(lambda: api.post("/v1/validate", json=body).raise_for_status(), args.n // 2)
                started = time.perf_counter()
                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(lambda _: api.post("/v1/validate", json=body).raise_for_status(), range(args.n)))
                concurrent = args.n / (time.perf_counter() - started)
                results["validate_environment"] = {"latency_ms": pcts(seq),
                                                   "per_s_sequential": round(1000 / statistics.fmean(seq), 1),
                                                   "per_s_4_clients": round(concurrent, 1)}

                check_body = {"kind": "check_function", "source_code": CHECK.format(n=1),
                              "cases": [{"initial_state": {"count": 1}, "final_state": {"count": 2}}]}
                checks = timed(lambda: api.post("/v1/validate", json=check_body).raise_for_status(), args.n)
                results["validate_check_function"] = {"latency_ms": pcts(checks),
                                                      "per_s": round(1000 / statistics.fmean(checks), 1)}

                environment_id = api.post("/v1/environments", json={"source_code": ENV_SOURCE,
                                                                    "class_name": "Counter"}).json()["id"]
                env_id = api.post("/v1/envs", json={"environment_id": environment_id}).json()["id"]
                api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": 1}})
                many = [{"check_item": f"c{i}", "check_func": CHECK.format(n=i % 3)} for i in range(256)]
                rates = []
                for _ in range(5):
                    started = time.perf_counter()
                    evaluation = api.post(f"/v1/envs/{env_id}/evaluate", json={"checks": many})
                    rates.append(256 / (time.perf_counter() - started))
                    assert evaluation.status_code == 200, evaluation.text
                results["evaluate_256_checks"] = {"checks_per_s_median": round(statistics.median(rates), 1),
                                                  "reward": evaluation.json()["reward"]}

                for _ in range(5):
                    api.post("/v1/execute", json={"code": "print(1)"})
                execute = timed(lambda: api.post("/v1/execute", json={"code": "print(1)"}).raise_for_status(),
                                args.n)
                results["execute_print_ms"] = pcts(execute)
        finally:
            server.stop()

    try:
        from llm_sandbox import SandboxSession
    except ImportError:
        results["llm_sandbox"] = "not installed (pip install -e '.[bench]')"
    else:
        client = docker.from_env()
        image = llm_sandbox_image(client, resolve_image(client, None, get_image_settings()))
        with SandboxSession(lang="python", image=image, skip_environment_setup=True, keep_template=True,
                            verbose=False) as session:
            for _ in range(3):
                session.run("print(1)")
            theirs = timed(lambda: session.run("print(1)"), args.n)
        results["llm_sandbox_print_ms"] = pcts(theirs)
        results["execute_speedup_vs_llm_sandbox_p50"] = round(
            results["llm_sandbox_print_ms"]["p50"] / results["execute_print_ms"]["p50"], 2)
    print(json.dumps(results, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
