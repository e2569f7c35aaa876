"""Declared tools on a real server (real sandboxes, real SQLite): registration checks them
against the class (a declared tool the class lacks, or that is a state attribute, is a 422
naming ``tools.<i>``; a public method not declared is a warning), lists their differences
from the derived schemas, and the agent is shown them wherever it is shown tools (env
create and reset, GEM's ``info["tools"]``), while argument checking keeps to the derived
schemas (what the class accepts)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from envscaler_release import CLINIC, CLINIC_TOOLS, PANTRY, PANTRY_TOOLS, PATIENTS, tool

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

SAMPLE = {"patients": PATIENTS}


def register(api: httpx.Client, tools: Any, source: str = CLINIC, class_name: str = "Clinic",
             **extra: Any) -> httpx.Response:
    return api.post("/v1/environments", json={"name": "clinic", "source_code": source, "class_name": class_name,
                                              "sample_init_config": SAMPLE, "tools": tools, **extra}, timeout=120)


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def shown(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The environment's tools among those an episode shows (the termination tool aside)."""
    return [t for t in tools if t["function"]["name"] != "chat_with_user"]


@pytest.fixture(scope="module")
def clinic(server: Any) -> dict[str, Any]:
    with server.client(timeout=120) as api:
        response = register(api, CLINIC_TOOLS, argument_checking="strict")
        assert response.status_code == 201, response.text
        return dict(response.json())


def test_registration_keeps_both_lists_and_their_differences(api: httpx.Client, clinic: dict[str, Any]) -> None:
    assert clinic["tools_source"] == "declared" and clinic["tools"] == CLINIC_TOOLS
    assert names(clinic["derived_tools"]) == ["get_patient", "book_visit", "cancel_visit", "list_visits",
                                              "clinic_hours"]
    found = {(d["tool"], d["kind"], d["parameter"]): d for d in clinic["tool_differences"]}
    assert found[("clinic_hours", "undeclared", None)]["severity"] == "warning"
    assert (found[("book_visit", "required", "urgent")]["declared"], found[("book_visit", "required", "urgent")]
            ["derived"]) == (True, False)
    assert found[("book_visit", "type", "note")]["declared"] == ["null", "string"]
    assert found[("list_visits", "type", "patient_id")]["derived"] == "string"
    assert {t for t, k, _ in found if k == "description"} == {"get_patient", "book_visit", "cancel_visit",
                                                              "list_visits"}
    assert "Returns:" in found[("get_patient", "description", None)]["declared"]
    assert api.get(f"/v1/environments/{clinic['id']}").json() == clinic
    listed = [e for e in api.get("/v1/environments", params={"limit": 500}).json()["data"] if e["id"] == clinic["id"]]
    assert listed == [clinic]
    plain = api.post("/v1/environments", json={"source_code": PANTRY, "class_name": "Pantry"}, timeout=120).json()
    assert (plain["tools_source"], plain["tool_differences"]) == ("derived", [])
    assert plain["tools"] == plain["derived_tools"] and names(plain["tools"]) == ["restock", "take"]


def test_the_agent_is_shown_the_declared_tools_at_create_and_reset(api: httpx.Client, clinic: dict[str, Any]) -> None:
    scenario = api.post("/v1/scenarios", json={"environment_id": clinic["id"], "task": "Book P1 a visit.",
                                                "init_config": SAMPLE}).json()
    for body in ({"environment_id": clinic["id"], "init_config": SAMPLE}, {"scenario_id": scenario["id"]}):
        env = api.post("/v1/envs", json=body, timeout=120)
        assert env.status_code == 201, env.text
        assert shown(env.json()["tools"]) == CLINIC_TOOLS
        reset = api.post(f"/v1/envs/{env.json()['id']}/reset", json={}, timeout=120)
        assert reset.status_code == 200, reset.text
        assert shown(reset.json()["tools"]) == CLINIC_TOOLS
        assert shown(api.get(f"/v1/envs/{env.json()['id']}").json()["tools"]) == CLINIC_TOOLS
        api.delete(f"/v1/envs/{env.json()['id']}")


def test_argument_checking_keeps_to_the_derived_schemas(api: httpx.Client, clinic: dict[str, Any]) -> None:
    env = api.post("/v1/envs", json={"environment_id": clinic["id"], "init_config": copy.deepcopy(SAMPLE)},
                   timeout=120).json()
    try:
        # declared: urgent is required; the class has a default, so strict checking lets it run
        step = api.post(f"/v1/envs/{env['id']}/step", json={"name": "book_visit", "arguments": {
            "patient_id": "P1", "day": "2025-03-01"}}, timeout=60).json()
        assert step["status"] == "ok" and "'visit_id': 1" in step["observation"]
        # the class takes an int visit_id: a string is refused by the derived schema
        step = api.post(f"/v1/envs/{env['id']}/step", json={"name": "cancel_visit", "arguments": {
            "visit_id": "1"}}, timeout=60).json()
        assert step["status"] == "rejected"
        # an undeclared public method is still a method of the class
        step = api.post(f"/v1/envs/{env['id']}/step", json={"name": "clinic_hours", "arguments": {}}, timeout=60)
        assert step.json()["observation"] == "9-17"
    finally:
        api.delete(f"/v1/envs/{env['id']}")


def test_gem_info_tools_are_the_declared_ones(server: Any, clinic: dict[str, Any]) -> None:
    gem = pytest.importorskip("gem", reason="gem-llm is installed with the dev extra (Python <= 3.12)")
    from sandpit.client import gem_env

    with server.client() as api:
        scenario = api.post("/v1/scenarios", json={"environment_id": clinic["id"], "task": "Book P1 a visit.",
                                                    "init_config": SAMPLE}).json()
    env = gem.make(gem_env.NON_CONV_ID, base_url=server.url, api_key=server.api_key, scenario_ids=[scenario["id"]],
                   mode="train")
    try:
        observation, info = env.reset(seed=3)
        assert observation == {"type": "user", "content": "Book P1 a visit."}
        assert shown(info["tools"]) == CLINIC_TOOLS
    finally:
        env.close()


def test_a_declared_tool_the_class_lacks_is_refused(api: httpx.Client) -> None:
    missing = [*CLINIC_TOOLS, tool("refund", "Refund a visit.", {}, [])]
    response = register(api, missing)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "tools.4" and "no attribute 'refund'" in error["message"]
    attribute = [CLINIC_TOOLS[0], tool("patients", "The patients.", {}, [])]  # a state attribute, not callable
    response = register(api, attribute)
    assert response.status_code == 422 and response.json()["error"]["field"] == "tools.1"
    assert "not callable" in response.json()["error"]["message"]


def test_a_callable_attribute_that_is_no_method_is_a_warning(api: httpx.Client) -> None:
    response = api.post("/v1/environments", json={"source_code": PANTRY, "class_name": "Pantry",
                                                  "tools": PANTRY_TOOLS}, timeout=120)
    assert response.status_code == 201, response.text
    body = response.json()
    kinds = {(d["tool"], d["kind"], d["parameter"]) for d in body["tool_differences"]}
    assert {("helper", "not_a_method", None), ("restock", "type", "count")} <= kinds
    assert names(body["tools"]) == ["restock", "take", "helper"] and names(body["derived_tools"]) == ["restock", "take"]


def test_bare_tools_are_stored_wrapped_and_an_empty_list_shows_none(api: httpx.Client) -> None:
    bare = [t["function"] for t in PANTRY_TOOLS[:2]]
    body = api.post("/v1/environments", json={"source_code": PANTRY, "class_name": "Pantry", "tools": bare},
                    timeout=120).json()
    assert body["tools"] == PANTRY_TOOLS[:2]
    empty = api.post("/v1/environments", json={"source_code": PANTRY, "class_name": "Pantry", "tools": []},
                     timeout=120).json()
    assert empty["tools"] == [] and empty["tools_source"] == "declared"
    assert {d["kind"] for d in empty["tool_differences"]} == {"undeclared"}


@pytest.mark.parametrize(("tools", "field"), [
    ('[{"type": "function", "function": {"name": "get_patient"}}]', "tools"),  # JSON text: the API takes values
    ([{"name": "get_patient", "parameters": "not a schema"}], "tools.0.function.parameters"),
    ([{"name": "get_patient", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}],
     "tools.0.function.parameters"),
    ([{"name": "get_patient", "parameters": {"type": "string"}}], "tools.0.function.parameters"),
    ([{"name": "__init__"}], "tools.0.function.name"),
    ([{"name": "get_patient"}, {"name": "get_patient"}], "tools"),
    ([{"name": f"tool_{i}"} for i in range(10_000)], "tools"),
    ([{"name": "get_patient", "description": "x" * 20_000}], "tools.0.function.description"),
    ([None], "tools.0"),
])
def test_hostile_declared_tools_are_422_naming_the_field(api: httpx.Client, tools: Any, field: str) -> None:
    response = register(api, tools)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field, response.json()


def test_a_probe_of_hostile_code_is_a_clear_refusal(api: httpx.Client) -> None:
    source = CLINIC.replace("    def clinic_hours(self) -> str:", "    def __getattr__(self, name):\n"
                            "        raise SystemExit(3)\n\n    def clinic_hours(self) -> str:")
    response = register(api, [*CLINIC_TOOLS, tool("anything", "?", {}, [])], source=source)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "tools.4"
