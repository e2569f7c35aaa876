"""Web viewer benchmark: starts its own ``sandpit serve`` (loopback, temporary SQLite
file), builds an episode of 1,000 steps whose state is ~3 MB (one step fills 3,000
records of ~1 KB, then each step bumps a counter), signs in to ``/ui`` as a browser
does (form token, session cookie) and times, over real HTTP with one keep-alive client:

* ``episode_page``: the episode's timeline, first page (50 of its 1,000 steps);
* ``episode_last_page``: its last page (``offset=950``);
* ``state_view``: the 3 MB state at the last step (rendered within the page budget);
* ``diff_late``: a late step's diff (two 3 MB states loaded and compared; one change);
* ``diff_fill``: the diff of the step that filled the state (3,000 added records);
* ``episodes_list``: the episode listing.

Each request's time is measured in this process from sending to the last byte on
loopback, so it bounds the server time from above (HTTP parsing included). Prints p50/p99
per page and the HTML size, and saves JSON to ``benchmarks/results/viewer.json``.
Usage: ``python benchmarks/viewer.py [--samples 50]``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from api import Server, pcts  # noqa: E402 - benchmarks/ is not a package

SOURCE = '''
class Big:
    """A counter beside a record store that one tool fills."""

    def __init__(self, init_config):
        self.count = 0
        self.records = {}

    def fill(self, n: int, size: int) -> int:
        """Create `n` records of about `size` characters each."""
        for i in range(n):
            self.records[f"r{i:05d}"] = {"text": "x" * size, "n": i, "tags": ["a", "b"]}
        return len(self.records)

    def bump(self) -> int:
        """Add one to the counter."""
        self.count += 1
        return self.count
'''
STEPS = 1000
RECORDS, RECORD_CHARS = 3000, 1000


def sign_in(client: httpx.Client, key: str) -> None:
    """The browser's sign-in: the form (its token cookie and field), then the POST."""
    form = client.get("/ui/signin")
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
    if token is None:
        raise SystemExit(f"no form token on the sign-in page: {form.status_code}")
    done = client.post("/ui/signin", data={"csrf": token.group(1), "next": "/ui/episodes", "key": key})
    if done.status_code != 303:
        raise SystemExit(f"sign-in failed: {done.status_code} {done.text[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=50, help="requests per page")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp))
        try:
            with server.client() as api:
                environment = api.post("/v1/environments", json={"source_code": SOURCE, "class_name": "Big"})
                created = api.post("/v1/envs", json={"environment_id": environment.json()["id"],
                                                     "episode": {"max_steps": None}})
                if created.status_code != 201:
                    raise SystemExit(created.text)
                env_id = created.json()["id"]
                api.post(f"/v1/envs/{env_id}/step", json={"name": "fill",
                                                          "arguments": {"n": RECORDS, "size": RECORD_CHARS}})
                for _ in range(STEPS - 1):
                    api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {}})
                state_bytes = len(api.get(f"/v1/envs/{env_id}/state").content)
            base = f"/ui/envs/{env_id}/episodes/1"
            pages = {"episode_page": base, "episode_last_page": f"{base}?offset={STEPS - 50}",
                     "state_view": f"{base}/steps/{STEPS}/state", "diff_late": f"{base}/steps/{STEPS - 1}/diff",
                     "diff_fill": f"{base}/steps/1/diff", "episodes_list": "/ui/episodes"}
            results: dict[str, object] = {"steps": STEPS, "state_bytes": state_bytes}
            with httpx.Client(base_url=server.url, timeout=120, follow_redirects=False) as browser:
                sign_in(browser, server.api_key)
                for name, path in pages.items():
                    samples, size = [], 0
                    for index in range(args.samples + 3):
                        started = time.perf_counter()
                        response = browser.get(path)
                        elapsed = (time.perf_counter() - started) * 1000
                        if response.status_code != 200:
                            raise SystemExit(f"{path}: {response.status_code} {response.text[:300]}")
                        size = len(response.content)
                        if index >= 3:  # the first requests warm the state caches
                            samples.append(elapsed)
                    results[name] = {**pcts(samples), "html_bytes": size}
                    print(f"{name:18s} p50 {results[name]['p50']:8.2f} ms  p99 {results[name]['p99']:8.2f} ms  "
                          f"html {size / 1024:8.1f} KiB")
            print(f"state: {state_bytes / 1e6:.2f} MB over {STEPS} steps")
        finally:
            server.stop()
    out = Path(__file__).parent / "results" / "viewer.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
