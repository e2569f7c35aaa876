"""Import EnvScaler's released files through the API (``sandpit import envscaler``).

Formats (EnvScaler SkelBuilder / ScenGenerator outputs):

* environment metadata: a JSON object ``env_id -> {"env_class_name", "env_class_code",
  "tools", "environment_introduction", "constraints_rules", ...}``;
* scenario metadata: a JSON list of ``{"env_id", "task", "init_config", "checklist",
  "checklist_with_func": [{"check_item", "check_func"}], ...}``.

Every environment is registered with ``POST /v1/environments`` (static policy, then the
class is loaded and its tools derived in a sandbox). Every scenario of an imported
environment is stored with ``POST /v1/scenarios`` and, with ``check=True``, validated by
instantiating it (``POST /v1/envs`` with ``scenario_id``) and running its check functions
on the initial state (``evaluate``): a check that errors or returns a non-bool rejects the
scenario (and it is deleted again). Each item ends ``imported`` or ``rejected`` with reasons;
nothing here runs any of the code on the host.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sandpit.client import Client, SandpitError, every_item

MAX_FILE_BYTES = 256 * 1024 * 1024

T = TypeVar("T")


class EnvScalerFileError(ValueError):
    """A metadata file is missing, too large, not JSON, or not in EnvScaler's shape."""


@dataclass
class ItemReport:
    """Outcome of one environment or scenario."""

    kind: str
    key: str
    """EnvScaler ``env_id``, or ``<env_id>#<index>`` for a scenario."""
    status: str = "imported"
    reasons: list[str] = field(default_factory=list)
    sandpit_id: str | None = None

    def reject(self, reason: str) -> None:
        self.status = "rejected"
        self.reasons.append(reason)


def _load(path: Path, want: type[T]) -> T:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise EnvScalerFileError(f"{path}: {exc.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise EnvScalerFileError(f"{path}: {size} bytes, over the {MAX_FILE_BYTES} byte limit")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EnvScalerFileError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, want):
        raise EnvScalerFileError(f"{path}: expected a JSON {want.__name__}, got {type(data).__name__}")
    return data  # a dict or list of JSON values: what the annotation says


def load_environments(path: Path) -> dict[str, dict[str, Any]]:
    """Environment metadata (``env_id -> record``). Raises :class:`EnvScalerFileError`."""
    return _load(path, dict)


def load_scenarios(path: Path) -> list[dict[str, Any]]:
    """Scenario metadata (a list). Raises :class:`EnvScalerFileError`."""
    return _load(path, list)


def _text(record: dict[str, Any], key: str) -> str | None:
    value = record.get(key)
    return value if isinstance(value, str) and value else None


def _existing(client: Client) -> tuple[dict[tuple[str | None, str], str], dict[tuple[str, str | None], str]]:
    """What the tenant already has: ``(name, code_sha256) -> environment id`` and
    ``(environment_id, external_id) -> scenario id`` (so a re-import reuses them)."""
    environments: dict[tuple[str | None, str], str] = {}
    scenarios: dict[tuple[str, str | None], str] = {}
    for environment in every_item(client.environments.list):
        environments.setdefault((environment.name, environment.code_sha256), environment.id)
    for scenario in every_item(client.scenarios.list):
        scenarios.setdefault((scenario.environment_id, scenario.external_id), scenario.id)
    return environments, scenarios


def import_environment(client: Client, env_id: str, record: Any,
                       existing: dict[tuple[str | None, str], str] | None = None,
                       sample_init_config: dict[str, Any] | None = None) -> ItemReport:
    """Register one EnvScaler environment (reusing an identical one in ``existing``: same
    name and code); ``sample_init_config`` (e.g. its first scenario's) is what registration
    instantiates the class with. Never raises for a bad item."""
    report = ItemReport("environment", env_id)
    if not isinstance(record, dict):
        report.reject("record is not a JSON object")
        return report
    code, class_name = _text(record, "env_class_code"), _text(record, "env_class_name")
    if code is None or class_name is None:
        report.reject("env_class_code and env_class_name must be non-empty strings")
        return report
    introduction = _text(record, "environment_introduction")
    raw_rules = record.get("constraints_rules")
    rules = ([raw_rules] if isinstance(raw_rules, str) else [str(r) for r in raw_rules]
             if isinstance(raw_rules, list) else [])
    rules = [r[:4000] for r in rules if r.strip()][:256]
    description = introduction
    if rules:
        description = (description or "") + "\n\nRules:\n" + "\n".join(rules)
    digest = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
    known = (existing or {}).get((f"envscaler:{env_id}"[:200], digest))
    if known is not None:
        report.sandpit_id = known
        report.reasons.append("note: already registered (same name and code); reused")
        return report
    try:
        created = client.environments.create(code, class_name, name=f"envscaler:{env_id}"[:200],
                                             description=description[:20000] if description else None,
                                             introduction=introduction[:100_000] if introduction else None,
                                             rules=rules or None, sample_init_config=sample_init_config)
    except SandpitError as exc:
        report.reject(f"{exc.code}: {exc.message}")
        return report
    report.sandpit_id = created.id
    declared = record.get("tools")
    if isinstance(declared, list):  # EnvScaler's own tool list vs what the sandbox derived
        names = {t.get("function", t).get("name") for t in declared if isinstance(t, dict)}
        derived = {t["function"]["name"] for t in created.tools}
        missing = sorted(n for n in names if isinstance(n, str) and n not in derived)
        if missing:
            report.reasons.append(f"note: declared tools not found as public methods: {', '.join(missing[:10])}")
    return report


def import_scenario(client: Client, key: str, record: Any, environment_ids: dict[str, str],
                    check: bool, existing: dict[tuple[str, str | None], str] | None = None) -> ItemReport:
    """Store (and with ``check`` validate) one scenario, reusing one of the same
    environment and ``external_id`` in ``existing``; never raises for a bad item."""
    report = ItemReport("scenario", key)
    if not isinstance(record, dict):
        report.reject("record is not a JSON object")
        return report
    env_id = record.get("env_id")
    if not isinstance(env_id, str) or env_id not in environment_ids:
        report.reject(f"env_id {env_id!r} is not an imported environment")
        return report
    external_id = str(record.get("task_id") or key)[:200]
    body = {"environment_id": environment_ids[env_id], "task": record.get("task") or "",
            "init_config": record.get("init_config") or {}, "checklist": record.get("checklist") or [],
            "checklist_with_func": [{"check_item": c.get("check_item", ""), "check_func": c.get("check_func", "")}
                                    for c in record.get("checklist_with_func") or [] if isinstance(c, dict)],
            "external_id": external_id}
    known = (existing or {}).get((environment_ids[env_id], external_id))
    if known is not None:
        report.sandpit_id = known
        report.reasons.append("note: already imported (same environment and task id); reused")
        return report
    try:
        scenario = client.scenarios.create(body)
    except SandpitError as exc:
        report.reject(f"{exc.code}: {exc.message}")
        return report
    report.sandpit_id = scenario.id
    if check and body["checklist_with_func"]:
        try:
            with client.envs.create(scenario_id=scenario.id) as env:
                evaluation = env.evaluate()
        except SandpitError as exc:
            report.reject(f"instantiating the scenario failed: {exc.code}: {exc.message}")
        else:
            for outcome in evaluation.results:
                if outcome.error is not None:
                    report.reject(f"check {outcome.check_item[:80]!r} on the initial state: {outcome.error}")
        if report.status == "rejected":
            try:
                client.scenarios.delete(scenario.id)
            except SandpitError:
                pass
            report.sandpit_id = None
    return report


def import_files(client: Client, envs_path: Path, scenarios_path: Path | None, *, check: bool = True,
                 on_item: Callable[[ItemReport], None] | None = None) -> list[ItemReport]:
    """Import both files; returns one report per item (environments first). Idempotent:
    a rerun reuses what an earlier import of the same items registered."""
    environments = load_environments(envs_path)
    scenarios = load_scenarios(scenarios_path) if scenarios_path is not None else []
    known_environments, known_scenarios = _existing(client)
    reports: list[ItemReport] = []
    ids: dict[str, str] = {}
    samples: dict[str, dict[str, Any]] = {}
    for record in scenarios:  # each environment is instantiated at registration with its first scenario's config
        if isinstance(record, dict) and isinstance(record.get("init_config"), dict):
            samples.setdefault(str(record.get("env_id")), record["init_config"])
    for env_id, record in environments.items():
        report = import_environment(client, str(env_id), record, known_environments, samples.get(str(env_id)))
        if report.sandpit_id:
            ids[str(env_id)] = report.sandpit_id
        reports.append(report)
        if on_item:
            on_item(report)
    for index, record in enumerate(scenarios):
        key = f"{record.get('env_id') if isinstance(record, dict) else '?'}#{index}"
        report = import_scenario(client, key, record, ids, check, known_scenarios)
        reports.append(report)
        if on_item:
            on_item(report)
    return reports
