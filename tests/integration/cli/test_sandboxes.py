"""``sandpit sandboxes`` on the real Docker Engine, with a server's warm sandboxes running:
``--json`` lists every labeled container with its full id, and the table prints the ids
whole in a narrow terminal. (Read-only: nothing is reaped.)"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from cli_runs import run
from typer.testing import CliRunner

pytestmark = pytest.mark.docker


def test_sandboxes_json_and_table_give_full_ids(server: Any) -> None:
    with server.client() as api:  # one step, so the server has at least one sandbox of its own
        environment = api.post("/v1/environments", json={
            "source_code": "class C:\n    def __init__(self, init_config):\n        self.n = 0\n", "class_name": "C"})
        assert environment.status_code == 201, environment.text
        env = api.post("/v1/envs", json={"environment_id": environment.json()["id"]})
        assert env.status_code == 201, env.text
    deadline = time.monotonic() + 30
    while True:
        rows = json.loads(run(CliRunner(), "sandboxes", "--json").stdout)
        if any(r["tenant"] == "default" for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert any(r["tenant"] == "default" for r in rows), rows
    assert all(re.fullmatch(r"[0-9a-f]{64}", r["container"]) for r in rows)
    assert set(rows[0]) == {"container", "sandbox", "tenant", "owner", "status"}
    table = run(CliRunner(env={"COLUMNS": "40"}), "sandboxes").stdout
    first_cells = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    assert first_cells and all(re.fullmatch(r"[0-9a-f]{64}", cell) for cell in first_cells), table
