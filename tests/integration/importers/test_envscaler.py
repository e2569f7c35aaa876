"""`sandpit import envscaler` against a real server (real SQLite, real sandboxes), with
release files of our own making in every published shape (``envscaler_release`` in
tests/support): list, object and JSON Lines files; fields as JSON values and as JSON text;
RL and SFT scenario files; ``env_id`` as a record id or an index. The released tools are
what the agent is shown; a re-import creates nothing; hostile files are refused item by
item (or, for a file that is not JSON, as a whole) with the reason; a 50 MB scenario file
is streamed (its peak memory is measured)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from envscaler_release import (
    CLINIC_CHECKS,
    CLINIC_TOOLS,
    PANTRY_TOOLS,
    PATIENTS,
    clinic_record,
    clinic_scenario,
    pantry_record,
    pantry_scenario,
    tool,
)

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

CLI = [sys.executable, "-c", "from sandpit.cli import app; app()", "import", "envscaler"]


def write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


class Importer:
    """Runs the CLI as a tenant of its own on the module's server."""

    def __init__(self, server: Any, tenant: str) -> None:
        self.server = server
        self.key = server.new_tenant(tenant)

    def run(self, envs: Path, *scenarios: Path, args: tuple[str, ...] = (), timeout: float = 600) -> \
            subprocess.CompletedProcess[str]:
        command = [*CLI, "--envs", str(envs), *[a for s in scenarios for a in ("--scenarios", str(s))],
                   "--url", self.server.url, "--api-key", self.key, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)

    def report(self, envs: Path, *scenarios: Path, args: tuple[str, ...] = ()) -> dict[str, Any]:
        done = self.run(envs, *scenarios, args=(*args, "--json"))
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def api(self) -> httpx.Client:
        return self.server.client(api_key=self.key, timeout=120)

    def rows(self) -> tuple[int, int]:
        """How many environments and scenarios the tenant has."""
        with self.api() as api:
            return (api.get("/v1/environments", params={"limit": 1}).json()["count"],
                    api.get("/v1/scenarios", params={"limit": 1}).json()["count"])


def items(report: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {i["key"]: i for i in report["items"] if i["kind"] == kind}


def statuses(report: dict[str, Any], kind: str) -> dict[str, str]:
    return {key: item["status"] for key, item in items(report, kind).items()}


def shown(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in tools if t["function"]["name"] != "chat_with_user"]


# -- the published shapes ------------------------------------------------------------------------
def test_list_files_with_text_fields_rl_and_sft(server: Any, tmp_path: Path) -> None:
    importer = Importer(server, "shapes-list")
    envs = write(tmp_path / "191_env_metadata.json", [clinic_record(as_text=True), pantry_record()])
    rl = write(tmp_path / "rl.json", [
        clinic_scenario("t1"),
        clinic_scenario("t2", 0, as_text=True),  # env_id as an index into the list
        pantry_scenario("p1", "1"),  # ... as numeric text
        clinic_scenario("t3", "env_clinic", as_text=True, patients={"P1": {"name": "Zed", "age": 5}}),
    ])
    sft = tmp_path / "sft.jsonl"
    sft.write_text("\n".join(json.dumps(clinic_scenario(f"s{i}", sft=True, as_text=bool(i))) for i in range(2)) + "\n")
    report = importer.report(envs, rl, sft)
    assert report["file_errors"] == []
    assert report["counts"] == {"environment": {"imported": 2, "reused": 0, "refused": 0},
                                "scenario": {"imported": 6, "reused": 0, "refused": 0}}
    environments = items(report, "environment")
    assert "clinic_hours: undeclared" in environments["env_clinic"]["notes"][0]
    assert "helper: not_a_method" in environments["env_pantry"]["notes"][0]
    assert "SFT" in items(report, "scenario")["s0"]["notes"][0]

    with importer.api() as api:
        clinic = api.get(f"/v1/environments/{environments['env_clinic']['sandpit_id']}").json()
        assert clinic["name"] == "envscaler:env_clinic" and clinic["tools_source"] == "declared"
        assert clinic["tools"] == CLINIC_TOOLS  # the released tools, as released
        assert clinic["introduction"] == "A clinic's front desk."
        assert clinic["rules"] == ["A visit needs a known patient.", "Days are YYYY-MM-DD."]
        pantry = api.get(f"/v1/environments/{environments['env_pantry']['sandpit_id']}").json()
        assert pantry["tools"] == PANTRY_TOOLS
        scenarios = {s["external_id"]: s for s in api.get("/v1/scenarios", params={"limit": 100}).json()["data"]}
        assert set(scenarios) == {"t1", "t2", "t3", "p1", "s0", "s1"}
        assert {s["episode_profile"] for s in scenarios.values()} == {"envscaler"}
        assert scenarios["t2"]["init_config"] == scenarios["t1"]["init_config"] == {"patients": PATIENTS, "visits": []}
        assert scenarios["t2"]["checklist_with_func"] == CLINIC_CHECKS
        assert scenarios["s1"]["checklist_with_func"] == [] and len(scenarios["s1"]["checklist"]) == 2
        assert scenarios["p1"]["environment_id"] == pantry["id"]
        env = api.post("/v1/envs", json={"scenario_id": scenarios["t2"]["id"]}).json()
        assert shown(env["tools"]) == CLINIC_TOOLS
        reset = api.post(f"/v1/envs/{env['id']}/reset", json={}).json()
        assert shown(reset["tools"]) == CLINIC_TOOLS and reset["task"] == "Book P1 a visit on 2025-03-01."
        api.delete(f"/v1/envs/{env['id']}")

    rows = importer.rows()
    again = importer.report(envs, rl, sft)  # a re-import creates nothing
    assert again["counts"] == {"environment": {"imported": 0, "reused": 2, "refused": 0},
                               "scenario": {"imported": 0, "reused": 6, "refused": 0}}
    assert importer.rows() == rows == (2, 6)
    assert {k: v["sandpit_id"] for k, v in items(again, "scenario").items()} == {
        k: v["sandpit_id"] for k, v in items(report, "scenario").items()}

    changed = write(tmp_path / "rl.json", [clinic_scenario("t1", task="Book P2 a visit."), clinic_scenario("t2", 0)])
    third = importer.report(envs, changed)
    assert statuses(third, "scenario") == {"t1": "imported", "t2": "reused"}
    assert "changed since an earlier import" in items(third, "scenario")["t1"]["notes"][0]
    assert importer.rows() == (2, 7)


def test_object_files_with_json_values(server: Any, tmp_path: Path) -> None:
    importer = Importer(server, "shapes-object")
    envs = write(tmp_path / "envs.json", {"clinic_a": {k: v for k, v in clinic_record().items() if k != "env_id"},
                                          "pantry_b": pantry_record(as_text=True)})
    scenarios = write(tmp_path / "rl.json", {"task-1": {k: v for k, v in clinic_scenario("x", "clinic_a").items()
                                                        if k != "task_id"},
                                             "task-2": pantry_scenario("p2", "pantry_b"),
                                             "task-3": clinic_scenario("t3", 0)})  # no index into an object
    report = importer.report(envs, scenarios)
    assert statuses(report, "environment") == {"clinic_a": "imported", "pantry_b": "imported"}
    assert statuses(report, "scenario") == {"task-1": "imported", "p2": "imported", "t3": "refused"}
    assert "env_id 0 matches no environment record" in items(report, "scenario")["t3"]["reasons"][0]
    with importer.api() as api:
        names = sorted(e["name"] for e in api.get("/v1/environments").json()["data"])
        assert names == ["envscaler:clinic_a", "envscaler:pantry_b"]


def test_limit_policy_and_the_table(server: Any, tmp_path: Path) -> None:
    importer = Importer(server, "options")
    clock = {"env_id": "env_clock", "env_class_name": "Clock", "env_class_code":
             "class Clock:\n    def __init__(self, init_config):\n        self.t = 0\n\n"
             "    def now(self) -> float:\n        \"\"\"The time.\"\"\"\n        return __import__('time').time()\n",
             "environment_introduction": "A clock.", "constraints_rules": [],
             "tools": [tool("now", "The time.", {}, [])]}
    envs = write(tmp_path / "envs.json", [clinic_record(), clock])
    scenarios = write(tmp_path / "rl.json", [clinic_scenario(f"t{i}") for i in range(3)])
    limited = importer.report(envs, scenarios, args=("--limit", "1", "--no-check"))
    assert statuses(limited, "scenario") == {"t0": "imported"}
    assert statuses(limited, "environment") == {"env_clinic": "imported"}  # the clock is not needed yet
    strict = importer.report(envs, args=("--policy", "strict"))  # no scenario file: every environment
    assert statuses(strict, "environment") == {"env_clinic": "reused", "env_clock": "refused"}
    assert "import-call" in items(strict, "environment")["env_clock"]["reasons"][0]
    assert statuses(importer.report(envs), "environment") == {"env_clinic": "reused", "env_clock": "imported"}
    table = importer.run(envs, scenarios)
    assert table.returncode == 0, table.stderr
    assert "scenarios: 2 imported, 1 reused, 0 refused" in table.stderr
    help_text = subprocess.run([*CLI, "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"})
    assert help_text.returncode == 0
    for shape in ("JSON Lines", "JSON text", "index into the environment list", '"checklist_with_func"',
                  '"tools": [{"type": "function"', "--scenarios"):
        assert shape in help_text.stdout, shape


# -- hostile input -------------------------------------------------------------------------------
@pytest.mark.parametrize(("tenant", "data", "says"), [
    ("bad-1", "{not json", "not JSON"),
    ("bad-2", "42", "expected a JSON list of records or an object keyed by id"),
    ("bad-3", "", "empty file"),
    ("bad-4", '[{"env_id": "a", "env_class_name": "A", "env_class_code": "class A: pass"}, {"env_id": ]', "not JSON"),
])
def test_an_environment_file_that_is_not_json_imports_nothing(server: Any, tmp_path: Path, tenant: str, data: str,
                                                              says: str) -> None:
    importer = Importer(server, tenant)
    done = importer.run(write(tmp_path / "envs.json", data), args=("--json",))
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert importer.rows() == (0, 0)


def test_hostile_records_are_refused_one_by_one(server: Any, tmp_path: Path) -> None:
    importer = Importer(server, "hostile")
    bad_tools = {**clinic_record("env_text"), "tools": "[{'type': 'function'}]"}
    not_schema = {**clinic_record("env_schema"), "tools": [{"type": "function", "function": {
        "name": "get_patient", "parameters": {"type": "object", "required": "all"}}}]}
    too_many = {**clinic_record("env_many"), "tools": [tool(f"t{i}", "", {}, []) for i in range(10_000)]}
    lacking = {**clinic_record("env_lacking"), "tools": [*CLINIC_TOOLS, tool("refund", "Refund.", {}, [])]}
    deep: Any = {}
    for _ in range(300):
        deep = {"k": deep}
    envs = write(tmp_path / "envs.json", [5, "text", clinic_record(), bad_tools, not_schema, too_many, lacking,
                                          {**clinic_record("env_deep"), "x": deep}, clinic_record()])
    scenarios = write(tmp_path / "rl.json", [
        clinic_scenario("ok"),
        clinic_scenario("out-of-range", 99),
        clinic_scenario("negative", -1),
        clinic_scenario("env-refused", "env_text"),
        {**clinic_scenario("config-text"), "init_config": "{'patients': 1}"},
        {**clinic_scenario("config-list"), "init_config": [1, 2]},
        {**clinic_scenario("checks-text"), "checklist_with_func": "not json"},
        {**clinic_scenario("no-func"), "checklist_with_func": [{"check_item": "a"}]},
        {**clinic_scenario("wrong-class"), "env_class_name": "Pantry"},
        {**clinic_scenario("deep"), "init_config": {"patients": deep}},
        clinic_scenario("duplicate-env", 8),  # record 8 repeats env_clinic: refused as a duplicate
        ["not", "an", "object"],
        clinic_scenario("lacking", "env_lacking"),  # registers env_lacking with a config __init__ can take
    ])
    report = importer.report(envs, scenarios)
    environments = items(report, "environment")
    assert {k: v["status"] for k, v in environments.items()} == {
        "0": "refused", "1": "refused", "env_clinic": "refused", "env_text": "refused", "env_schema": "refused",
        "env_many": "refused", "env_lacking": "refused", "7": "refused"}, environments
    assert environments["0"]["reasons"] == ["the record is not a JSON object (a int)"]
    refused = [i for i in report["items"] if i["kind"] == "environment" and i["key"] == "env_clinic"]
    assert sorted(i["status"] for i in refused) == ["imported", "refused"]  # the second env_clinic record
    assert "tools is text that is not JSON" in environments["env_text"]["reasons"][0]
    assert "tools.0.function.parameters" in environments["env_schema"]["reasons"][0]
    assert "at most 512" in environments["env_many"]["reasons"][0]
    assert "(tools.4)" in environments["env_lacking"]["reasons"][0]
    assert "no attribute 'refund'" in environments["env_lacking"]["reasons"][0]
    assert environments["7"]["reasons"] == ["nested deeper than 256 levels"]  # its env_id was not read
    scenario = items(report, "scenario")
    assert scenario["ok"]["status"] == "imported"
    assert {k: v["status"] for k, v in scenario.items() if k != "ok"} == dict.fromkeys(
        ["out-of-range", "negative", "env-refused", "config-text", "config-list", "checks-text", "no-func",
         "wrong-class", "#9", "duplicate-env", "#11", "lacking"], "refused")
    reasons = {k: v["reasons"][0] for k, v in scenario.items() if v["reasons"]}
    assert "out of range of the 9-record environment list" in reasons["out-of-range"]
    assert "matches no environment record" in reasons["negative"]
    assert "its environment 'env_text' was refused" in reasons["env-refused"]
    assert "init_config is text that is not JSON" in reasons["config-text"]
    assert "init_config must be an object" in reasons["config-list"]
    assert "checklist_with_func is text that is not JSON" in reasons["checks-text"]
    assert "checklist_with_func.0 has no check_func" in reasons["no-func"]
    assert "not its environment's class" in reasons["wrong-class"]
    assert "nested deeper than 256 levels" in reasons["#9"]  # its task_id was not read
    assert "a duplicate env_id" in reasons["duplicate-env"]
    assert "not a JSON object" in reasons["#11"]
    assert importer.rows() == (1, 1)


def test_a_scenario_file_broken_midway_keeps_what_came_before(server: Any, tmp_path: Path) -> None:
    importer = Importer(server, "broken-midway")
    envs = write(tmp_path / "envs.json", [clinic_record()])
    good = ", ".join(json.dumps(clinic_scenario(f"t{i}")) for i in range(2))
    broken = write(tmp_path / "rl.json", f"[{good}, {{\"env_id\": ")
    later = write(tmp_path / "later.json", [clinic_scenario("t9")])
    done = importer.run(envs, broken, later, args=("--json",))
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert statuses(report, "scenario") == {"t0": "imported", "t1": "imported", "t9": "imported"}
    assert len(report["file_errors"]) == 1 and "rl.json: not JSON" in report["file_errors"][0]
    table = importer.run(envs, broken)
    assert table.returncode == 1 and "file error" in table.stderr and "rl.json: not JSON" in table.stderr


@pytest.mark.slow
def test_a_fifty_megabyte_scenario_file_is_streamed(server: Any, tmp_path: Path) -> None:
    """~2,600 scenarios of ~19 KB each (init_config as JSON text, as the published loaders
    give it): the importer reads all of it and its peak memory stays far below the file's
    size. One scenario in 25 is of the imported environment; the others name an
    environment the file does not have and are refused by the importer itself, so the
    whole file is parsed and judged while the server stores ~2 MB (storing 50 MB of
    scenarios measures the server, not the importer's streaming)."""
    importer = Importer(server, "fifty-mb")
    envs = write(tmp_path / "envs.json", [clinic_record()])
    patients = {f"P{k}": {"name": f"Patient {k}", "age": k % 90, "notes": "x" * 40,
                          "visits": [{"day": "2024-01-02", "doctor": f"D{j}"} for j in range(3)]} for k in range(60)}
    path = tmp_path / "rl_scenarios.json"
    count = 0
    with path.open("w") as out:
        out.write("[")
        while out.tell() < 50_000_000:
            record = clinic_scenario(f"t{count}", "env_clinic" if count % 25 == 0 else "env_elsewhere",
                                     as_text=True, patients=patients)
            out.write(("," if count else "") + json.dumps(record))
            count += 1
        out.write("]")
    size = path.stat().st_size
    measure = ("import resource, subprocess, sys, time\n"
               "started = time.monotonic()\n"
               "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "sys.stderr.write(done.stderr)\n"
               "print(done.returncode, time.monotonic() - started,"
               " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
               "print(done.stdout)\n")
    command = [*CLI, "--envs", str(envs), "--scenarios", str(path), "--url", server.url, "--api-key", importer.key,
               "--no-check", "--concurrency", "8", "--json"]
    done = subprocess.run([sys.executable, "-c", measure, *command], capture_output=True, text=True, timeout=1200)
    first, _, rest = done.stdout.partition("\n")
    code, seconds, peak_kib = first.split()
    assert code == "0", done.stderr
    report = json.loads(rest)
    imported = (count + 24) // 25
    assert report["counts"]["scenario"] == {"imported": imported, "reused": 0, "refused": count - imported}
    assert importer.rows() == (1, imported)
    peak_mib = int(peak_kib) / 1024
    print(f"\n50 MB import: {size / 1e6:.1f} MB, {count} scenarios, {float(seconds):.1f} s, "
          f"peak RSS {peak_mib:.0f} MiB")
    assert peak_mib < 200, peak_mib  # json.load of the file alone would hold ~100 MB of text, decoded ~330 MB
