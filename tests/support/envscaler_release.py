"""A small EnvScaler-shaped release of our own making (environment records and RL/SFT
scenario records in the published shapes), for the importer's tests and the demo.

The environments are untrusted code like any other: they only ever run in sandboxes. The
declared ``tools`` are written by hand the way EnvScaler's SkelBuilder writes them
(``convert_tool_schema``): the whole docstring as the description, every parameter that
is not ``Optional`` listed as required (defaulted ones too), ``Optional[str]`` as
``["string", "null"]``. So the derived schemas differ from them in known ways:

* Clinic: every description; ``book_visit.urgent`` required (declared) vs optional;
  ``book_visit.note`` and ``list_visits.patient_id`` ``["null", "string"]`` vs ``string``;
  ``clinic_hours`` is a public method that is not declared (a warning).
* Pantry: ``restock.count`` typed ``number`` (declared) vs ``integer``; ``helper`` is a
  callable attribute set in ``__init__`` (declared, not a method).
"""

from __future__ import annotations

import json
from typing import Any

CLINIC = '''
from typing import Dict, List, Optional


class Clinic:
    """A clinic's front desk: patients and their visits."""

    def __init__(self, init_config: dict):
        self.patients: Dict[str, dict] = init_config["patients"]
        self.visits: List[dict] = init_config.get("visits", [])
        self.next_visit = 1

    def get_patient(self, patient_id: str) -> dict:
        """Look a patient up.

        Args:
            patient_id (str): the patient's id.

        Returns:
            dict: {"success": True, "data": <patient>} or {"success": False, "error": str}
        """
        if patient_id not in self.patients:
            return {"success": False, "error": "no such patient"}
        return {"success": True, "data": self.patients[patient_id]}

    def book_visit(self, patient_id: str, day: str, urgent: bool = False, note: Optional[str] = None) -> dict:
        """Book a visit for a patient.

        Args:
            patient_id (str): the patient's id.
            day (str): the day, as YYYY-MM-DD.
            urgent (bool): whether the visit is urgent.
            note (str): a note for the doctor.

        Returns:
            dict: {"success": True, "visit_id": int} or {"success": False, "error": str}

        Constraints:
            - The patient must exist.
        """
        if patient_id not in self.patients:
            return {"success": False, "error": "no such patient"}
        visit = {"id": self.next_visit, "patient_id": patient_id, "day": day, "urgent": urgent, "note": note}
        self.visits.append(visit)
        self.next_visit += 1
        return {"success": True, "visit_id": visit["id"]}

    def cancel_visit(self, visit_id: int) -> dict:
        """Cancel a visit.

        Args:
            visit_id (int): the visit's id.

        Returns:
            dict: {"success": True} (raises KeyError for an unknown visit)
        """
        for visit in self.visits:
            if visit["id"] == visit_id:
                self.visits.remove(visit)
                return {"success": True}
        raise KeyError(visit_id)

    def list_visits(self, patient_id: Optional[str] = None) -> dict:
        """List visits, of one patient or of all.

        Args:
            patient_id (str): only this patient's visits.

        Returns:
            dict: {"success": True, "data": [visit, ...]}
        """
        return {"success": True, "data": [v for v in self.visits if patient_id in (None, v["patient_id"])]}

    def clinic_hours(self) -> str:
        """Opening hours."""
        return "9-17"
'''

PANTRY = '''
class Pantry:
    """A pantry: items and their counts."""

    def __init__(self, init_config):
        self.items = dict(init_config.get("items", {}))
        self.helper = lambda: "a callable attribute"

    def restock(self, item: str, count: int) -> str:
        """Add items.

        Args:
            item (str): the item.
            count (int): how many.
        """
        self.items[item] = self.items.get(item, 0) + count
        return f"{item}: {self.items[item]}"

    def take(self, item: str) -> str:
        """Take one item.

        Args:
            item (str): the item.
        """
        if self.items.get(item, 0) < 1:
            return "none left"
        self.items[item] -= 1
        return f"{item}: {self.items[item]}"
'''


def tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI tool schema as EnvScaler's ``convert_tool_schema`` writes one."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


def _doc(source: str, method: str) -> str:
    """The docstring of ``method`` in ``source`` (read as text: nothing is executed)."""
    start = source.index(f"def {method}(")
    first = source.index('"""', start) + 3
    return source[first:source.index('"""', first)]


CLINIC_TOOLS = [
    tool("get_patient", _doc(CLINIC, "get_patient"), {"patient_id": {"type": "string"}}, ["patient_id"]),
    tool("book_visit", _doc(CLINIC, "book_visit"),
         {"patient_id": {"type": "string"}, "day": {"type": "string"}, "urgent": {"type": "boolean"},
          "note": {"type": ["string", "null"]}}, ["patient_id", "day", "urgent"]),
    tool("cancel_visit", _doc(CLINIC, "cancel_visit"), {"visit_id": {"type": "integer"}}, ["visit_id"]),
    tool("list_visits", _doc(CLINIC, "list_visits"), {"patient_id": {"type": ["string", "null"]}}, []),
]
"""Clinic's released tools (``clinic_hours`` is not among them)."""

PANTRY_TOOLS = [
    tool("restock", _doc(PANTRY, "restock"), {"item": {"type": "string"}, "count": {"type": "number"}},
         ["item", "count"]),
    tool("take", _doc(PANTRY, "take"), {"item": {"type": "string"}}, ["item"]),
    tool("helper", "A helper.", {}, []),
]

PATIENTS = {"P1": {"name": "Ada", "age": 36}, "P2": {"name": "Brook", "age": 71}}


def clinic_record(env_id: str = "env_clinic", *, as_text: bool = False, tools: list[Any] | None = None,
                  code: str = CLINIC) -> dict[str, Any]:
    """Clinic's environment record; ``as_text``: ``tools`` and ``constraints_rules`` as
    JSON text (how loaders of the published dataset hand them over)."""
    declared = CLINIC_TOOLS if tools is None else tools
    rules = ["A visit needs a known patient.", "Days are YYYY-MM-DD."]
    return {"env_id": env_id, "env_class_name": "Clinic", "env_class_code": code,
            "environment_introduction": "A clinic's front desk.",
            "constraints_rules": json.dumps(rules) if as_text else rules,
            "tools": json.dumps(declared) if as_text else declared,
            "env_func_details": {"get_patient": {"doc": "..."}}}  # a field of the release the importer drops


def pantry_record(env_id: str = "env_pantry", *, as_text: bool = False) -> dict[str, Any]:
    """Pantry's environment record."""
    return {"env_id": env_id, "env_class_name": "Pantry", "env_class_code": PANTRY,
            "environment_introduction": "A pantry.", "constraints_rules": [],
            "tools": json.dumps(PANTRY_TOOLS) if as_text else PANTRY_TOOLS}


CLINIC_CHECKS = [
    {"check_item": "P1 has a visit on 2025-03-01",
     "check_func": "def check_func(final_state):\n    return any(v['patient_id'] == 'P1' and v['day'] == '2025-03-01'"
                   " for v in final_state['visits'])\n"},
    {"check_item": "one visit more",
     "check_func": "def check_func(final_state):\n"
                   "    return len(final_state['visits']) == len(initial_state['visits']) + 1\n"},
]


def clinic_scenario(task_id: str, env_id: Any = "env_clinic", *, as_text: bool = False, sft: bool = False,
                    patients: dict[str, Any] | None = None, task: str = "Book P1 a visit on 2025-03-01.") -> dict[str, Any]:
    """A Clinic scenario record (RL; ``sft``: without ``checklist_with_func``); ``as_text``:
    ``init_config`` and ``checklist_with_func`` as JSON text."""
    init_config = {"patients": patients if patients is not None else PATIENTS, "visits": []}
    record: dict[str, Any] = {"env_id": env_id, "env_class_name": "Clinic", "task_id": task_id, "task": task,
                              "init_config": json.dumps(init_config) if as_text else init_config,
                              "checklist": [c["check_item"] for c in CLINIC_CHECKS]}
    if not sft:
        record["checklist_with_func"] = json.dumps(CLINIC_CHECKS) if as_text else CLINIC_CHECKS
    return record


def pantry_scenario(task_id: str, env_id: Any = "env_pantry") -> dict[str, Any]:
    """A Pantry scenario record (RL)."""
    return {"env_id": env_id, "env_class_name": "Pantry", "task_id": task_id, "task": "Restock 3 apples.",
            "init_config": {"items": {"apple": 1}}, "checklist": ["4 apples"],
            "checklist_with_func": [{"check_item": "4 apples", "check_func":
                                     "def check_func(final_state):\n    return final_state['items']['apple'] == 4\n"}]}
