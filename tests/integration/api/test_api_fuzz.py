"""Schemathesis against a real server (issue 12: "no 5xx under fuzzing").

Every operation of the served OpenAPI document gets generated requests, valid and
invalid (schemathesis' coverage phase: boundaries and every way to break each
constraint; its fuzzing phase: random positive and negative cases), sent with a
throwaway tenant's key (the operator key for ``/v1/admin``). Every response must be below
500 and conform to the document: a documented status, content type, headers and body.

The document must be exactly as strict as the server (issue 24): invalid data must be
refused (``negative_data_rejection``), and valid data accepted (``positive_data_acceptance``),
that is answered 2xx or with a refusal by design: 404 (an unknown id), 409 (the
resource's state), 429 (a quota), 503 (capacity). A 422 for data the document allows is a
gap in the document, unless its reason is the data's meaning, which no schema can state
(code that does not parse, an ``init_config`` the class does not accept): those are
listed in :data:`SEMANTIC_422`, each with its reason, and every other one fails the test.

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
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events
from schemathesis.engine import from_schema as engine_for
from schemathesis.engine.recorder import ScenarioRecorder
from schemathesis.hooks import GLOBAL_HOOK_DISPATCHER
from schemathesis.openapi.checks import RejectedPositiveData

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FUZZ_EXAMPLES = int(os.environ.get("SANDPIT_FUZZ_EXAMPLES", "40"))
FUZZ_BUDGET_S = int(os.environ.get("SANDPIT_FUZZ_BUDGET_S", "40"))
FUZZ_SEED = int(os.environ.get("SANDPIT_FUZZ_SEED", "12"))
MIN_CASES = 400
"""Fewer cases sent than this (a too-small budget on a loaded machine) fails the test:
a fuzz run that sent nothing proves nothing."""

MODEL_URL = "http://127.0.0.1:9/v1"
"""The only rollout ``base_url`` the server accepts (a closed loopback port): generated
rollouts never make the server call out to a generated address."""

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "allow_header_conformance",
          "negative_data_rejection", "positive_data_acceptance", "missing_required_header", "unsupported_method",
          "ignored_auth")
"""Every check but the stateful ones."""
POSITIVE_STATUSES = ["2xx", "404", "409", "429", "503"]
"""What schema-valid data may get: success, or a refusal by design (module docstring).
A 422 is judged by :func:`semantic_refusal` instead."""
NAIVE_OR_ZONED = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?$"


@dataclass(frozen=True)
class Refusal:
    """A 422 for schema-valid data whose reason is the data's meaning. ``operations``,
    ``field`` and ``message`` are regular expressions matched (``fullmatch``, ``fullmatch``,
    ``search``) against the operation's label and the error body's ``field``
    (``""`` for none) and ``message``."""

    operations: str
    field: str
    message: str
    reason: str


CODE_ROUTES = r"POST /v1/(environments|envs|validate|scenarios|envs/\{env_id\}/evaluate)"
CHECK_FIELDS = r"(checklist_with_func|checks)\.\d+\.check_func"
SEMANTIC_422 = (
    Refusal(CODE_ROUTES, rf"source_code|{CHECK_FIELDS}", r"static policy '\w+' rejected the code|check_func: line \d+ ",
            "code must parse and pass the static policy (Python's grammar, the policy's rules)"),
    Refusal(CODE_ROUTES, CHECK_FIELDS, r"no check_func defined",
            "a check's source must define check_func(final_state) at module level"),
    Refusal(r"POST /v1/(environments|envs)", r"source_code", r"environment code failed in the sandbox",
            "the environment's module must run and define the class named class_name"),
    Refusal(r"POST /v1/(environments|envs)|POST /v1/envs/\{env_id\}/reset", r"(sample_)?init_config",
            r"instantiating \w+ (with sample_init_config .*)?failed",
            "init_config must construct the class (EnvScaler: cls(init_config), or cls() and setattr per key)"),
    Refusal(r"POST /v1/environments", r"tools(\.\d+(\.function\.parameters)?)?",
            r"is not a tool of the class|are no public methods of|not a JSON Schema",
            "declared tools must be methods of the class, their parameters a valid JSON Schema (the draft "
            "2020-12 meta-schema)"),
    Refusal(r"POST /v1/environments", r"tools", r"is declared twice",
            "a tool name is declared once (JSON Schema's uniqueItems compares whole items, not one field of them)"),
    Refusal(r"POST /v1/envs:step", r"steps\.\d+\.env_id", r"is in the batch twice",
            "a batch steps each env once (JSON Schema's uniqueItems compares whole items, not one field of them)"),
    Refusal(r"POST /v1/(environments|scenarios|execute|execute/batch)",
            rf"{CHECK_FIELDS}|tools\.\d+\.function\.parameters|files",
            r"bytes of UTF-8, over|component over \d+ bytes|over \d+ bytes",
            "a size in UTF-8 bytes (a schema's maxLength counts characters)"),
    Refusal(r"POST /v1/execute(/batch)?", r"files", r"lies under .*, which is a file",
            "a file cannot be a directory too (a and a/b)"),
    Refusal(r"POST /v1/envs|POST /v1/envs/\{env_id\}/reset", r"episode\.(on_tool_error|termination_action)",
            r"the envscaler profile ends the episode",
            "options may not contradict the envscaler episode profile of the scenario (stored with it; the "
            "document states the rule for options that name the profile)"),
    Refusal(r"POST /v1/envs|POST /v1/envs/\{env_id\}/reset|POST /v1/evaluations", r"(episode\.user\.)?base_url",
            r"base_url is required|not one of the operator's allowed model endpoints",
            "the model endpoint is the tenant's default (set by the operator) or one the operator allows"),
)
"""The kinds of 422 the services give schema-valid data for its meaning, with the reason
no schema can state it. A kind the fuzzer has not reached in a run is no failure; any 422
of schema-valid data outside this list is one."""


def semantic_refusal(label: str, body: bytes) -> Refusal | None:
    """The entry of :data:`SEMANTIC_422` that explains a 422 with error ``body``, or None."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    field, message = error.get("field") or "", error.get("message") or ""
    for refusal in SEMANTIC_422:
        if (re.fullmatch(refusal.operations, label) and re.fullmatch(refusal.field, field)
                and re.search(refusal.message, message)):
            return refusal
    return None


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


@dataclass
class Outcome:
    """What a fuzz run got: statuses, cases per operation, failed checks, errors of the
    generator; how many cases were schema-valid (positive) and how many of those got 422."""

    statuses: Counter[int] = field(default_factory=Counter)
    per_operation: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    positive: int = 0
    positive_422: int = 0

    def scenario(self, recorder: ScenarioRecorder) -> None:
        """Count one finished scenario's requests and keep its failed checks (a 422 of
        schema-valid data with its body, which names the field; the listed semantic ones
        were dropped by :func:`semantic_422s`' hook)."""
        label = recorder.label
        for case_id, interaction in recorder.interactions.items():
            self.per_operation[label] += 1
            if interaction.response is None:
                continue
            self.statuses[interaction.response.status_code] += 1
            case = recorder.cases.get(case_id)
            if case is not None and case.value.meta is not None and case.value.meta.generation.mode.is_positive:
                self.positive += 1
                self.positive_422 += interaction.response.status_code == 422
        for case_id, nodes in recorder.checks.items():
            interaction = recorder.interactions.get(case_id)
            response = interaction.response if interaction is not None else None
            for node in nodes:
                if node.status != Status.FAILURE or node.failure_info is None:
                    continue
                body = ""
                if node.name == "positive_data_acceptance" and response is not None and response.status_code == 422:
                    body = f"\n422 body: {response.content[:800]!r}"
                failure = node.failure_info.failure
                self.failures.append(f"{label}: {failure.title}: {failure.message[:1500]}{body}\n"
                                     f"{node.failure_info.code_sample}")


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
        "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS},
                   "positive_data_acceptance": {"enabled": True, "expected-statuses": POSITIVE_STATUSES}},
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


@pytest.fixture
def semantic_422s() -> Iterator[Counter[str]]:
    """A ``filter_failure`` hook that drops the ``positive_data_acceptance`` failures
    :data:`SEMANTIC_422` explains, counted by operation and reason. Dropped in the check,
    not after the run: a failure there makes Hypothesis shrink the example, one request
    (often a sandbox run) per attempt, and the run would spend its time budget on that."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
        if isinstance(failure, RejectedPositiveData) and response.status_code == 422:
            refusal = semantic_refusal(case.operation.label, response.content)
            if refusal is not None:
                with lock:
                    counts[f"{case.operation.label}: {refusal.reason}"] += 1
                return False
        return True

    schemathesis.hook(filter_failure)
    try:
        yield counts
    finally:
        GLOBAL_HOOK_DISPATCHER.unregister(filter_failure)


@pytest.mark.timeout(FUZZ_BUDGET_S + 240)  # the budget, plus start-up and requests in flight at its end
def test_no_5xx_and_every_response_is_documented(fuzz_server, fuzz_world: dict[str, Any], steered_ids: None,
                                                 semantic_422s: Counter[str], serialized_ast_parse: None) -> None:
    started = time.monotonic()
    run = Outcome()
    finished = None
    for event in engine_for(_schema(fuzz_server, fuzz_world)).execute():
        if isinstance(event, events.ScenarioFinished):
            run.scenario(event.recorder)
        elif isinstance(event, events.NonFatalError):
            run.errors.append(f"{event.label}: {event.info.title}: {event.info.message[:1500]}\n"
                              f"{''.join(traceback.format_exception(event.value))[-3000:]}")
        elif isinstance(event, events.FatalError):
            raise event.exception
        elif isinstance(event, events.EngineFinished):
            finished = event
    elapsed = time.monotonic() - started
    sent = sum(run.per_operation.values())
    print(f"\nfuzz (seed {FUZZ_SEED}): {sent} cases in {elapsed:.0f} s over {len(run.per_operation)} operations "
          f"(stopped: {finished.stop_reason if finished else '?'}); statuses {dict(sorted(run.statuses.items()))}; "
          f"positive cases {run.positive}, answered 422 {run.positive_422}")
    print("semantic 422s of schema-valid data:\n" + "\n".join(
        f"  {n} x {why}" for why, n in sorted(semantic_422s.items())))
    assert not run.failures, f"{len(run.failures)} failure(s):\n\n" + "\n\n".join(run.failures[:20])
    assert not run.errors, f"{len(run.errors)} error(s):\n\n" + "\n\n".join(run.errors[:20])
    assert not [status for status in run.statuses if status >= 500]
    assert sent >= MIN_CASES, sent
    spec = httpx.get(f"{fuzz_server.url}/openapi.json", timeout=30).json()
    operations = {f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m in ops}
    assert operations <= set(run.per_operation), operations - set(run.per_operation)
    assert httpx.get(f"{fuzz_server.url}/healthz", timeout=30).status_code == 200


def _error(message: str, field: str | None) -> bytes:
    return json.dumps({"error": {"code": "invalid_request", "message": message, "field": field}}).encode()


@pytest.mark.parametrize("label, message, field", [
    ("GET /v1/evaluations/{evaluation_id}/results", "include may name ['transcript'], got ['x']", "include"),
    ("POST /v1/admin/tenants", "tenant id must match [a-z0-9][a-z0-9_-]{0,63}", "id"),
    ("POST /v1/admin/tenants", "quotas.x: Extra inputs are not permitted", "quotas.x"),
    ("POST /v1/envs/{env_id}/fork", "step: Input should be a valid integer", "step"),
    ("POST /v1/envs/{env_id}/step", "Value error, give exactly one of name (+ arguments), function or text", None),
    ("POST /v1/validate", "kind=check_function needs at least one case {initial_state, final_state}", "cases"),
    ("POST /v1/execute", "file path '' must have 1 to 1024 characters", "files"),
    ("POST /v1/execute", "file path 'a\\x01' contains a control character or a backslash", "files"),
    ("POST /v1/evaluations", "base_url: Value error, base_url must be an http:// or https:// URL with a host",
     "base_url"),
    ("POST /v1/envs/{env_id}/fork", "count 65 is over the maximum 64", "count"),
    ("POST /v1/validate", "source_code contains a NUL byte", "source_code"),
])
def test_the_document_s_old_gaps_are_no_semantic_refusals(label: str, message: str, field: str | None) -> None:
    """The 422s that issue 24 found for requests the document allowed (fixed in the
    document since) would fail the fuzz test again, not pass as semantic."""
    assert semantic_refusal(label, _error(message, field)) is None


@pytest.mark.parametrize("label, message, field", [
    ("POST /v1/environments", "static policy 'standard' rejected the code: 1 error(s): line 1:0 syntax-error: ...",
     "source_code"),
    ("POST /v1/scenarios", "checklist_with_func[0].check_func: line 1 syntax-error: SyntaxError: invalid syntax",
     "checklist_with_func.0.check_func"),
    ("POST /v1/envs", "environment code failed in the sandbox (error): Error: LookupError: class 'A' is not "
     "defined by the environment code", "source_code"),
    ("POST /v1/envs", "instantiating Counter failed (error): Error: TypeError: ...", "init_config"),
])
def test_semantic_refusals_are_recognised(label: str, message: str, field: str) -> None:
    assert semantic_refusal(label, _error(message, field)) is not None
