"""Reading EnvScaler's released files without a server: the three file shapes, fields as
JSON values or JSON text, records that are not objects, nesting beyond the cap, malformed
files, and the hashes that make a re-import reuse what it imported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from envscaler_release import CLINIC_TOOLS, clinic_record, clinic_scenario
from sandpit.importers.envscaler import environment_hash, scenario_hash
from sandpit.importers.envscaler_files import (
    MAX_DEPTH,
    EnvScalerFileError,
    RawRecord,
    environment_record,
    read_records,
    scenario_record,
    wrapped_tool,
)


def records(path: Path) -> tuple[str, list[RawRecord]]:
    shape, found = read_records(path)
    return shape, list(found)


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def test_the_three_shapes(tmp_path: Path) -> None:
    items = [{"env_id": "a", "x": [1, 2.5, None, True, {"y": "z"}]}, 7, "text", [1, [2]]]
    shape, found = records(write(tmp_path, "list.json", json.dumps(items, indent=2)))
    assert shape == "list" and [(r.index, r.key, r.value) for r in found] == [(i, None, v) for i, v in enumerate(items)]
    shape, found = records(write(tmp_path, "dict.json", json.dumps({"k1": items[0], "k2": 5, "k3": []})))
    assert shape == "object" and [(r.key, r.value) for r in found] == [("k1", items[0]), ("k2", 5), ("k3", [])]
    shape, found = records(write(tmp_path, "lines.jsonl", "\n".join(json.dumps(i) for i in items) + "\n"))
    assert shape == "lines" and [r.value for r in found] == items
    shape, found = records(write(tmp_path, "bom.json", b"\xef\xbb\xbf \n[{\"a\": 1}]"))
    assert shape == "list" and [r.value for r in found] == [{"a": 1}]
    assert records(write(tmp_path, "empty.json", "[]")) == ("list", [])


def test_progress_is_fed_every_byte(tmp_path: Path) -> None:
    path = write(tmp_path, "big.json", json.dumps([{"i": i, "pad": "x" * 100} for i in range(3000)]))
    seen: list[int] = []
    _, found = read_records(path, seen.append)
    assert len(list(found)) == 3000 and sum(seen) == path.stat().st_size and len(seen) > 2


@pytest.mark.parametrize(("data", "says"), [
    (b"", "empty file"),
    (b"   \n", "empty file"),
    (b"5", "starts with '5'"),
    (b'"a list"', "starts with '\"'"),
    (b"[1, 2", "not JSON"),
    (b"[1] [2]", "not JSON"),
    (b'[{"a": NaN}]', "not JSON"),
    (b'{"a": 1,}', "not JSON"),
    (b'["\xff\xfe"]', "not JSON"),
])
def test_malformed_files_are_file_errors(tmp_path: Path, data: bytes, says: str) -> None:
    path = write(tmp_path, "bad.json", data)
    with pytest.raises(EnvScalerFileError, match=says):
        records(path)
    with pytest.raises(EnvScalerFileError, match="No such file"):
        records(tmp_path / "missing.json")


def test_records_before_a_malformed_part_are_handed_out(tmp_path: Path) -> None:
    path = write(tmp_path, "half.json", b'[{"a": 1}, {"a": 2}, {"a": ]')
    _, found = read_records(path)
    assert next(found).value == {"a": 1} and next(found).value == {"a": 2}
    with pytest.raises(EnvScalerFileError, match="not JSON"):
        next(found)


def test_nesting_beyond_the_cap_refuses_that_record_only(tmp_path: Path) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # ijson.items would need ~25 GB for its prefixes
    path = write(tmp_path, "deep.json", b'[{"a": 1}, ' + deep + b', {"env_id": "b"}]')
    _, found = records(path)
    assert [(r.value, r.problem) for r in found] == [
        ({"a": 1}, None), (None, f"nested deeper than {MAX_DEPTH} levels"), ({"env_id": "b"}, None)]
    nested: Any = 1
    for _ in range(MAX_DEPTH):  # MAX_DEPTH levels: the most a record may have
        nested = {"k": nested}
    path = write(tmp_path, "edge.json", json.dumps({"ok": nested, "deep": {"k": nested}, "after": 2}))
    _, found = records(path)
    assert [(r.key, r.problem) for r in found] == [
        ("ok", None), ("deep", f"nested deeper than {MAX_DEPTH} levels"), ("after", None)]
    assert found[0].value == nested


# -- records -------------------------------------------------------------------------------------
def raw(value: Any, index: int = 0, key: str | None = None) -> RawRecord:
    return RawRecord(index, key, value)


def test_environment_fields_as_json_values_or_json_text() -> None:
    values, text = environment_record(raw(clinic_record())), environment_record(raw(clinic_record(as_text=True)))
    assert values.problems == text.problems == []
    assert values.tools == text.tools == CLINIC_TOOLS
    assert values.rules == text.rules == ["A visit needs a known patient.", "Days are YYYY-MM-DD."]
    assert (values.env_id, values.class_name, values.introduction) == ("env_clinic", "Clinic",
                                                                       "A clinic's front desk.")
    keyed = environment_record(raw(clinic_record(), key="the_key"))
    assert keyed.env_id == "the_key"  # the object form's key names the record
    anonymous = environment_record(raw({k: v for k, v in clinic_record().items() if k != "env_id"}, index=4))
    assert anonymous.env_id == "4" and "index 4" in anonymous.notes[0]
    untooled = environment_record(raw({k: v for k, v in clinic_record().items() if k != "tools"}))
    assert untooled.tools is None and "derived" in untooled.notes[0]


@pytest.mark.parametrize(("change", "says"), [
    ({"tools": "[{'name': 'not json'}]"}, "tools is text that is not JSON"),
    ({"tools": '{"name": "a"}'}, "tools must be a list of tool schemas, got dict"),
    ({"tools": 5}, "tools must be a list"),
    ({"constraints_rules": "Be nice."}, "constraints_rules is text that is not JSON"),
    ({"constraints_rules": [1, 2]}, "constraints_rules must be a list of strings"),
    ({"env_class_code": ""}, "env_class_code must be non-empty text"),
    ({"env_class_code": None}, "env_class_code must be non-empty text"),
    ({"env_class_name": ["Clinic"]}, "env_class_name must be non-empty text"),
    ({"environment_introduction": 3}, "environment_introduction must be text"),
])
def test_environment_problems_are_reasons_not_exceptions(change: dict[str, Any], says: str) -> None:
    record = environment_record(raw({**clinic_record(), **change}))
    assert any(says in problem for problem in record.problems), record.problems
    assert environment_record(raw([1, 2])).problems == ["the record is not a JSON object (a list)"]
    assert environment_record(RawRecord(0, None, None, "nested deeper than 256 levels")).problems == [
        "nested deeper than 256 levels"]


def test_tool_forms_are_wrapped_as_the_api_stores_them() -> None:
    function = {"name": "a", "description": "A.", "parameters": {"type": "object"}}
    assert wrapped_tool(function) == {"type": "function", "function": function}
    assert wrapped_tool({"type": "function", **function}) == {"type": "function", "function": function}
    assert wrapped_tool({"function": function}) == {"type": "function", "function": function}
    for other in ("junk", {"type": "other", "function": function}, {"description": "no name"}):
        assert wrapped_tool(other) == other  # left for the API to refuse


def test_scenario_fields_as_json_values_or_json_text() -> None:
    values, text = scenario_record(raw(clinic_scenario("t1"))), scenario_record(raw(clinic_scenario("t1", as_text=True)))
    assert values.problems == text.problems == [] and values.kind == text.kind == "rl"
    assert values.init_config == text.init_config and values.init_config["patients"]["P1"]["name"] == "Ada"
    assert values.checklist_with_func == text.checklist_with_func and len(values.checklist_with_func) == 2
    assert (values.task_id, values.env_ref, values.class_name) == ("t1", "env_clinic", "Clinic")
    sft = scenario_record(raw(clinic_scenario("s1", sft=True)))
    assert sft.kind == "sft" and sft.checklist_with_func == [] and "SFT" in sft.notes[0]
    assert len(sft.checklist) == 2
    untitled = scenario_record(raw({k: v for k, v in clinic_scenario("x").items() if k != "task_id"}, key="k9"))
    assert untitled.task_id == "k9"
    no_checklist = scenario_record(raw({k: v for k, v in clinic_scenario("x").items() if k != "checklist"}))
    assert no_checklist.checklist == [c["check_item"] for c in no_checklist.checklist_with_func]
    numeric = scenario_record(raw({**clinic_scenario("x"), "task_id": 17, "env_id": 0}))
    assert (numeric.task_id, numeric.env_ref) == ("17", 0)
    null_config = scenario_record(raw({**clinic_scenario("x"), "init_config": None}))
    assert null_config.problems == [] and null_config.init_config == {}


@pytest.mark.parametrize(("change", "says"), [
    ({"init_config": "{not json"}, "init_config is text that is not JSON"),
    ({"init_config": "[1, 2]"}, "init_config must be an object, got list"),
    ({"checklist_with_func": "nope"}, "checklist_with_func is text that is not JSON"),
    ({"checklist_with_func": [5]}, "checklist_with_func.0 is not an object"),
    ({"checklist_with_func": [{"check_item": "a"}]}, "checklist_with_func.0 has no check_func"),
    ({"checklist_with_func": [{"check_item": "a", "check_func": "  "}]}, "checklist_with_func.0 has no check_func"),
    ({"checklist": [1]}, "checklist must be a list of strings"),
    ({"task": 5}, "task must be text"),
    ({"env_class_name": 5}, "env_class_name must be text"),
    ({"env_id": None}, "no env_id"),
])
def test_scenario_problems_are_reasons_not_exceptions(change: dict[str, Any], says: str) -> None:
    record = scenario_record(raw({**clinic_scenario("t1"), **change}))
    assert any(says in problem for problem in record.problems), record.problems
    without = {k: v for k, v in clinic_scenario("t1").items() if k not in ("task", "init_config")}
    assert scenario_record(raw(without)).problems == ["no task", "no init_config (EnvScaler instantiates the class "
                                                                  "with it)"]
    assert scenario_record(raw("text")).problems == ["the record is not a JSON object (a str)"]


def test_hashes_follow_content_not_form() -> None:
    base = environment_hash("envscaler:a", "A", "00", [{"type": "function", "function": {"name": "x", "b": 1,
                                                                                        "a": 2}}], "Intro", [])
    assert base == environment_hash("envscaler:a", "A", "00", [{"function": {"a": 2, "b": 1, "name": "x"},
                                                               "type": "function"}], "Intro", None)
    assert base != environment_hash("envscaler:a", "A", "00", None, "Intro", [])
    assert base != environment_hash("envscaler:a", "A", "01", [{"type": "function", "function": {"name": "x"}}],
                                    "Intro", [])
    checks = [{"check_item": "a", "check_func": "def check_func(s):\n    return True\n"}]
    one = scenario_hash("task", {"a": 1}, ["a"], checks, "envscaler")
    assert one == scenario_hash("task", {"a": 1}, ["a"], [{**checks[0], "extra": 1}], "envscaler")
    assert one != scenario_hash("task", {"a": 2}, ["a"], checks, "envscaler")
    assert one != scenario_hash("task", {"a": 1}, ["a"], checks, "sandpit")
