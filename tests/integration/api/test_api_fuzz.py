"""Schemathesis against a real server (issue 12: "no 5xx under fuzzing").

Every operation of the served OpenAPI document gets generated requests, valid and
invalid (schemathesis' coverage phase: boundaries and every way to break each
constraint; its fuzzing phase: random positive and negative cases), sent with a
throwaway tenant's key (the operator key for ``/v1/admin``). Every response must be below
500 and conform to the document: a documented status, content type, headers and body.

Half of the generated path ids (by a hash of the value) are replaced by real ones, so
the operations get past the 404 to the code behind it: an env, environment, scenario
and evaluation of the fuzzing tenant, and another throwaway tenant for the admin routes.
DELETEs never get them, so the resources stay for the whole run.

Run through schemathesis' engine (what ``schemathesis run`` uses; its pytest plugin's
``from_fixture`` does not work with pytest 9.2), bounded by ``FUZZ_EXAMPLES`` fuzzing
cases per operation and mode and by a time budget (``max-time``).
``SANDPIT_FUZZ_SEED`` picks another seed (the default is fixed, so CI is reproducible);
``SANDPIT_FUZZ_EXAMPLES`` and ``SANDPIT_FUZZ_BUDGET_S`` scale the run.
"""

from __future__ import annotations

import ast
import json
import os
import re
import threading
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events
from schemathesis.engine import from_schema as engine_for
from schemathesis.hooks import GLOBAL_HOOK_DISPATCHER

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FUZZ_EXAMPLES = int(os.environ.get("SANDPIT_FUZZ_EXAMPLES", "40"))
FUZZ_BUDGET_S = int(os.environ.get("SANDPIT_FUZZ_BUDGET_S", "85"))
FUZZ_SEED = int(os.environ.get("SANDPIT_FUZZ_SEED", "12"))
MIN_CASES = 1000
"""Fewer cases sent than this (a too-small budget on a loaded machine) fails the test:
a fuzz run that sent nothing proves nothing."""

MODEL_URL = "http://127.0.0.1:9/v1"
"""The only rollout ``base_url`` the server accepts (a closed loopback port): generated
rollouts never make the server call out to a generated address."""

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "allow_header_conformance",
          "negative_data_rejection", "missing_required_header", "unsupported_method", "ignored_auth")
"""Every check but those that expect schema-valid data to succeed (ids are random, so most
valid requests are a 404 by design) and the stateful ones."""
NAIVE_OR_ZONED = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?$"


@pytest.fixture(scope="module")
def fuzz_server(make_module_server):
    """A server of its own: generated requests create tenants, envs and keys."""
    return make_module_server(SANDPIT_MODEL_URL_ALLOW=json.dumps([MODEL_URL]), SANDPIT_CALL_QUEUE_TIMEOUT_S="30")


@pytest.fixture(scope="module")
def fuzz_world(fuzz_server, counter_source: str) -> dict[str, Any]:
    """The fuzzing tenant's key and real ids to put in paths."""
    def tenant(tenant_id: str, **fields: Any) -> dict[str, Any]:
        response = httpx.post(f"{fuzz_server.url}/v1/admin/tenants", headers=fuzz_server.operator_headers,
                              json={"id": tenant_id, **fields}, timeout=30)
        assert response.status_code == 201, response.text
        return response.json()["api_key"]

    fuzz = tenant("fuzz", quotas={"max_live_envs": 40, "max_running_calls": 2})
    key = fuzz["key"]
    target = tenant("fuzz-admin-target")
    with fuzz_server.client(key) as client:
        environment = client.post("/v1/environments", json={"name": "counter", "source_code": counter_source,
                                                             "class_name": "Counter"})
        assert environment.status_code == 201, environment.text
        environment_id = environment.json()["id"]
        check = "def check_func(final_state):\n    return final_state['count'] == 2\n"
        scenario = client.post("/v1/scenarios", json={
            "environment_id": environment_id, "task": "bump once", "init_config": {"count": 1},
            "checklist_with_func": [{"check_item": "bumped", "check_func": check}]})
        assert scenario.status_code == 201, scenario.text
        scenario_id = scenario.json()["id"]
        env = client.post("/v1/envs", json={"scenario_id": scenario_id})
        assert env.status_code == 201, env.text
        env_id = env.json()["id"]
        assert client.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": 1}}).status_code == 200
        evaluation = client.post("/v1/evaluations", json={"mode": "replay", "episodes": [
            {"scenario_id": scenario_id, "tool_calls": [{"name": "bump", "arguments": {}}]}]})
        assert evaluation.status_code == 201, evaluation.text
    return {"key": key, "key_id": fuzz["id"], "target_key_id": target["id"],
            "ids": {"env_id": env_id, "environment_id": environment_id, "scenario_id": scenario_id,
                    "evaluation_id": evaluation.json()["id"], "tenant_id": target["tenant"]}}


def _zone_optional_timestamps(spec: dict[str, Any], server_url: str, key: str) -> bool:
    """Another change (ISO 8601 timestamps with a time zone) is in flight; until it has
    landed the server sends naive timestamps, which JSON Schema's ``date-time`` refuses.
    While the server's own timestamps have no zone, ``date-time`` fields are checked
    against a pattern that makes the zone optional. True when that was needed."""
    response = httpx.get(f"{server_url}/v1/environments", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    if re.search(r"(Z|[+-]\d\d:\d\d)$", response.json()["data"][0]["created_at"]):
        return False

    def relax(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("format") == "date-time":
                del node["format"]
                node["pattern"] = NAIVE_OR_ZONED
            for value in node.values():
                relax(value)
        elif isinstance(node, list):
            for value in node:
                relax(value)

    relax(spec["components"]["schemas"])
    return True


def _schema(server, world: dict[str, Any]) -> schemathesis.BaseSchema:
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    _zone_optional_timestamps(spec, server.url, world["key"])
    config = SchemathesisConfig.from_dict({
        "seed": FUZZ_SEED,
        "max-time": FUZZ_BUDGET_S,
        "base-url": server.url,
        "workers": 2,
        "request-timeout": 120,
        "continue-on-failure": True,
        "headers": {"Authorization": f"Bearer {world['key']}"},
        "operations": [{"include-path-regex": "^/v1/admin/",
                        "headers": {"Authorization": f"Bearer {server.operator_key}"}}],
        "generation": {"max-examples": FUZZ_EXAMPLES, "database": "none", "with-security-parameters": False},
        "phases": {"examples": {"enabled": False}, "stateful": {"enabled": False}},
        "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
        "suppress-health-check": ["all"],
    })
    return schemathesis.openapi.from_dict(spec, config=config)


@pytest.fixture
def serialized_ast_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """One ``ast.parse`` at a time in this process while the fuzzer runs. Python 3.11
    keeps the AST constructor's recursion depth per interpreter, not per thread, so two
    threads parsing at once can fail with ``SystemError: AST constructor recursion depth
    mismatch`` (CPython gh-106905). Hypothesis parses lambdas' source when it describes a
    filtered strategy, and schemathesis's two workers did so at once: the fuzz run then
    reported an error of its own generator, not of the server."""
    parse = ast.parse
    lock = threading.Lock()

    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return parse(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", locked)


@pytest.fixture
def steered_ids(fuzz_world: dict[str, Any]) -> Iterator[None]:
    """A ``before_call`` hook (schemathesis has no per-schema one) that puts real ids in
    half of the paths (by a hash of the generated value) and keeps the run's own
    resources alive: schemathesis learns ids from responses, and would otherwise revoke
    the fuzzing tenant's key (learned from ``GET /v1/tenant``) or delete its env."""
    ids = fuzz_world["ids"]
    protected = {fuzz_world["key_id"]: fuzz_world["target_key_id"], "fuzz": ids["tenant_id"]}

    def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
        params = case.path_parameters
        if not params:
            return
        for name, value in list(params.items()):
            if case.method.upper() == "DELETE":
                if value in ids.values():
                    params[name] = f"deleted-{value}"
            elif value in protected:
                params[name] = protected[value]
            elif name in ids and zlib.crc32(repr(value).encode("utf-8", "surrogatepass")) % 2:
                params[name] = ids[name]

    schemathesis.hook(before_call)
    try:
        yield
    finally:
        GLOBAL_HOOK_DISPATCHER.unregister(before_call)


@pytest.mark.timeout(FUZZ_BUDGET_S + 240)  # the budget, plus start-up and requests in flight at its end
def test_no_5xx_and_every_response_is_documented(fuzz_server, fuzz_world: dict[str, Any], steered_ids: None,
                                                 serialized_ast_parse: None) -> None:
    started = time.monotonic()
    statuses: Counter[int] = Counter()
    per_operation: Counter[str] = Counter()
    failures: list[str] = []
    errors: list[str] = []
    finished = None
    for event in engine_for(_schema(fuzz_server, fuzz_world)).execute():
        if isinstance(event, events.ScenarioFinished):
            for interaction in event.recorder.interactions.values():
                per_operation[event.recorder.label] += 1
                if interaction.response is not None:
                    statuses[interaction.response.status_code] += 1
            for nodes in event.recorder.checks.values():
                for node in nodes:
                    if node.status == Status.FAILURE and node.failure_info is not None:
                        failure = node.failure_info.failure
                        failures.append(f"{event.recorder.label}: {failure.title}: {failure.message[:1500]}\n"
                                        f"{node.failure_info.code_sample}")
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.info.title}: {event.info.message[:1500]}\n"
                          f"{''.join(traceback.format_exception(event.value))[-3000:]}")
        elif isinstance(event, events.FatalError):
            raise event.exception
        elif isinstance(event, events.EngineFinished):
            finished = event
    elapsed = time.monotonic() - started
    sent = sum(per_operation.values())
    print(f"\nfuzz: {sent} cases in {elapsed:.0f} s over {len(per_operation)} operations "
          f"(stopped: {finished.stop_reason if finished else '?'}); statuses {dict(sorted(statuses.items()))}")
    assert not failures, f"{len(failures)} failure(s):\n\n" + "\n\n".join(failures[:20])
    assert not errors, f"{len(errors)} error(s):\n\n" + "\n\n".join(errors[:20])
    assert not [status for status in statuses if status >= 500]
    assert sent >= MIN_CASES, sent
    spec = httpx.get(f"{fuzz_server.url}/openapi.json", timeout=30).json()
    operations = {f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m in ops}
    assert operations <= set(per_operation), operations - set(per_operation)
    assert httpx.get(f"{fuzz_server.url}/healthz", timeout=30).status_code == 200
