"""Import EnvScaler's release through the API (``sandpit import envscaler``).

Files and their shapes: :mod:`sandpit.importers.envscaler_files` (a JSON list of records, an
object keyed by id, or JSON Lines; ``tools``/``init_config``/``checklist``/
``checklist_with_func``/``constraints_rules`` as JSON values or JSON text; RL scenario
files with ``checklist_with_func``, SFT scenario files without).

What an import does, in one pass over each file:

1. The environment file is read whole (only the fields used are kept: code, class name,
   introduction, rules, tools); nothing is registered yet.
2. Each scenario file is streamed. A scenario's ``env_id`` is looked up among the records'
   ids; an integer (or numeric text) that matches none is an index into the list form
   (EnvScaler's scenarios index the environment list); anything else refuses the scenario.
   The first scenario of an environment registers it (``POST /v1/environments``: the
   ``--policy`` static policy, tools derived in a sandbox, one instantiation with that
   scenario's ``init_config``, the released ``tools`` as declared tools checked against
   the class, ``environment_introduction`` as introduction, ``constraints_rules`` as
   rules). The scenario is then stored (``POST /v1/scenarios``) with ``episode_profile``
   ``envscaler`` (EnvScaler's episode rules are the default for its scenarios) and, with
   ``check``, validated by instantiating it and running its check functions on the
   initial state (a check that errors refuses it, and it is deleted again).
3. Environments no scenario referred to are registered last (with ``{}``), unless
   ``limit`` is given: then only the first ``limit`` scenarios (or, without scenario
   files, environments) are imported.

Re-importing is idempotent by content: an environment is reused when the tenant has one
of the same name, class, code, declared tools, introduction and rules; a scenario when
its environment has one of the same external id (``task_id``) and the same task,
``init_config``, checklist, check functions and profile. A changed item is imported anew
(the earlier one is kept and named in the item's notes). The policy is how an environment
is judged, not part of it: one registered earlier under another policy is reused. Every item ends ``imported``,
``reused`` or ``refused`` with its reasons; nothing here runs any of the code on the host.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandpit.client import Client, SandpitError, every_item
from sandpit.client.errors import SandpitConnectionError, Unauthorized
from sandpit.client.models import Environment, Page, Scenario

from .envscaler_files import (
    ENVIRONMENT_FIELDS,
    EnvironmentRecord,
    EnvScalerFileError,
    RawRecord,
    ScenarioRecord,
    environment_record,
    read_records,
    scenario_record,
)

__all__ = ["EnvScalerFileError", "ImportReport", "ItemReport", "import_files", "import_release"]

PROFILE = "envscaler"
"""The episode profile of imported scenarios."""
MAX_EXTERNAL_ID = 200
"""A scenario's external id (its ``task_id``) is cut to this many characters."""


@dataclass
class ItemReport:
    """Outcome of one environment or scenario record."""

    kind: str
    """``environment`` or ``scenario``."""
    key: str
    """The environment's ``env_id``; a scenario's ``task_id`` (``#<index>`` without one)."""
    file: str
    index: int
    """Position of the record in its file (0-based)."""
    status: str = "imported"
    """``imported`` (created now), ``reused`` (an identical one existed) or ``refused``."""
    reasons: list[str] = field(default_factory=list)
    """Why it was refused."""
    notes: list[str] = field(default_factory=list)
    """What else is worth knowing (a changed item, no tools declared, an SFT scenario)."""
    sandpit_id: str | None = None
    file_number: int = field(default=0, repr=False)
    """Which scenario file (0-based; ordering only)."""

    def refuse(self, reason: str) -> ItemReport:
        """Mark refused with ``reason``; returns self."""
        self.status = "refused"
        self.reasons.append(reason)
        self.sandpit_id = None
        return self

    def refuse_answer(self, exc: SandpitError) -> ItemReport:
        """Mark refused with the API's answer: ``<code> (<field>): <message>``; returns self."""
        where = f" ({exc.field})" if exc.field else ""
        return self.refuse(f"{exc.code}{where}: {exc.message}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``--json``)."""
        return {"kind": self.kind, "key": self.key, "file": self.file, "index": self.index, "status": self.status,
                "sandpit_id": self.sandpit_id, "reasons": self.reasons, "notes": self.notes}


@dataclass
class ImportReport:
    """Every item's outcome (environments first, then scenarios in file order) and the
    files that could not be read to their end."""

    items: list[ItemReport] = field(default_factory=list)
    file_errors: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{"environment": {"imported": n, "reused": n, "refused": n}, "scenario": {...}}``."""
        out = {kind: {"imported": 0, "reused": 0, "refused": 0} for kind in ("environment", "scenario")}
        for item in self.items:
            out[item.kind][item.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``--json``): ``{"counts", "file_errors", "items"}``."""
        return {"counts": self.counts(), "file_errors": self.file_errors,
                "items": [item.to_dict() for item in self.items]}


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def code_sha256(code: str) -> str:
    """Hex SHA-256 of environment code as the API computes it."""
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def environment_hash(name: str | None, class_name: str, code_digest: str, tools: list[Any] | None,
                     introduction: str | None, rules: list[str] | None) -> str:
    """Content hash of a registered environment (what makes two registrations the same)."""
    return _digest({"name": name, "class_name": class_name, "code": code_digest, "tools": tools,
                    "introduction": introduction or None, "rules": rules or []})


def environment_hash_of(environment: Environment) -> str:
    """:func:`environment_hash` of an environment the API lists."""
    declared = environment.tools if environment.tools_source == "declared" else None
    return environment_hash(environment.name, environment.class_name, environment.code_sha256, declared,
                            environment.introduction, environment.rules)


def scenario_hash(task: str, init_config: Any, checklist: list[str], checks: Iterable[dict[str, Any]],
                  profile: str) -> str:
    """Content hash of a scenario (its environment and external id are the lookup key)."""
    return _digest({"task": task, "init_config": init_config, "checklist": checklist,
                    "checks": [[c.get("check_item"), c.get("check_func")] for c in checks], "profile": profile})


def scenario_hash_of(scenario: Scenario) -> str:
    """:func:`scenario_hash` of a scenario the API lists."""
    return scenario_hash(scenario.task, scenario.init_config, scenario.checklist, scenario.checklist_with_func,
                         scenario.episode_profile)


def environment_name(env_id: str) -> str:
    """The Sandpit name of an imported environment: ``envscaler:<env_id>``."""
    return f"envscaler:{env_id}"[:200]


def _fatal(exc: SandpitError) -> bool:
    """Errors that end the whole import (no server, or not allowed), not one item."""
    return isinstance(exc, SandpitConnectionError | Unauthorized)


@dataclass
class _Environment:
    record: EnvironmentRecord
    report: ItemReport
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    scenarios: dict[tuple[str, str], str] | None = None
    """``(external_id, content hash) -> scenario id`` of the registered environment."""
    external: dict[str, str] = field(default_factory=dict)
    """``external_id -> scenario id`` (any content): tells a changed scenario."""
    pending: dict[tuple[str, str], threading.Event] = field(default_factory=dict)
    """Scenarios being imported by a worker (a duplicate in the files waits for it)."""


class _Import:
    """One run of :func:`import_release` (state shared by its worker threads)."""

    def __init__(self, client: Client, *, policy: str, check: bool, profile: str,
                 on_item: Callable[[ItemReport], None] | None) -> None:
        self.client = client
        self.policy = policy
        self.profile = profile
        self.check = check
        self.on_item = on_item
        self.report = ImportReport()
        self.by_id: dict[str, _Environment] = {}
        self.order: list[str | None] = []
        """Environment ids in file order (index resolution)."""
        self.shape = "object"
        self.known: dict[tuple[str | None, str], list[str]] = {}
        """``(name, content hash) -> environment ids`` the tenant has."""
        self.by_name: dict[str | None, list[str]] = {}
        self.lock = threading.Lock()

    # -- environments --------------------------------------------------------------------------
    def read_environments(self, path: Path, on_bytes: Callable[[int], None] | None) -> None:
        """Read the environment file (every record; nothing registered). Refused records
        are reported at once. Raises EnvScalerFileError."""
        self.shape, records = read_records(path, on_bytes)
        for raw in records:
            if isinstance(raw.value, dict):  # keep only what is used (the release carries much more)
                raw = RawRecord(raw.index, raw.key, {k: v for k, v in raw.value.items() if k in ENVIRONMENT_FIELDS})
            record = environment_record(raw)
            report = ItemReport("environment", record.env_id, path.name, record.index, notes=list(record.notes))
            if record.env_id in self.by_id:
                first = self.by_id[record.env_id].record.index
                self.order.append(None)
                self._finish(report.refuse(f"env_id {record.env_id!r} is also record {first}'s; the first is used"))
                continue
            self.order.append(record.env_id)
            if record.problems:
                self._finish(report.refuse("; ".join(record.problems)))
            self.by_id[record.env_id] = _Environment(record, report, done=bool(record.problems))

    def load_existing(self) -> None:
        """What the tenant already has: environments by name and content hash."""
        for environment in every_item(self.client.environments.list):
            self.known.setdefault((environment.name, environment_hash_of(environment)), []).append(environment.id)
            self.by_name.setdefault(environment.name, []).append(environment.id)

    def environment(self, env_id: str, sample: dict[str, Any] | None) -> _Environment:
        """The environment ``env_id``, registered (or reused) on first use with
        ``sample`` as its ``sample_init_config``. Raises fatal SandpitErrors."""
        entry = self.by_id[env_id]
        with entry.lock:
            if not entry.done:
                try:
                    self._register(entry, sample)
                finally:
                    entry.done = True
                    self._finish(entry.report)
        return entry

    def _register(self, entry: _Environment, sample: dict[str, Any] | None) -> None:
        record, report = entry.record, entry.report
        name = environment_name(record.env_id)
        digest = environment_hash(name, record.class_name, code_sha256(record.code), record.tools,
                                  record.introduction, record.rules)
        known = self.known.get((name, digest))
        if known:
            report.status, report.sandpit_id = "reused", known[0]
            return
        try:
            created = self.client.environments.create(
                record.code, record.class_name, name=name, policy=self.policy, introduction=record.introduction,
                rules=record.rules, sample_init_config=sample, tools=record.tools)
        except SandpitError as exc:
            if _fatal(exc):
                raise
            report.refuse_answer(exc)
            return
        report.sandpit_id = created.id
        earlier = [i for i in self.by_name.get(name, []) if i != created.id]
        if earlier:
            report.notes.append(f"changed since an earlier import: registered anew ({', '.join(earlier[:3])} kept)")
        warnings = [d for d in created.tool_differences if d.get("severity") == "warning"]
        if warnings:
            report.notes.append("tool warnings: " + "; ".join(
                f"{d['tool']}: {d['kind']}" + (f" {d['parameter']}" if d.get("parameter") else "") for d in warnings[:8])
                + (f"; and {len(warnings) - 8} more" if len(warnings) > 8 else ""))

    def register_rest(self, limit: int | None) -> None:
        """Register the environments not registered yet (at most ``limit`` of them)."""
        count = 0
        for entry in self.by_id.values():
            if entry.done:
                continue
            if limit is not None and count >= limit:
                break
            self.environment(entry.record.env_id, None)
            count += 1

    def resolve(self, ref: Any) -> tuple[str | None, str | None]:
        """A scenario's ``env_id`` -> ``(environment id, None)`` or ``(None, reason)``."""
        if isinstance(ref, bool) or not isinstance(ref, int | str):
            return None, f"env_id must be text or an integer, got {type(ref).__name__}"
        text = str(ref).strip()
        if text in self.by_id:
            return text, None
        if self.shape != "object" and text.isdigit():
            index = int(text)
            if index < len(self.order):
                found = self.order[index]
                return (found, None) if found is not None else (None, f"env_id {ref!r}: environment record {index} "
                                                                 "was refused (a duplicate env_id)")
            return None, (f"env_id {ref!r} matches no environment record's env_id and is out of range of the "
                          f"{len(self.order)}-record environment list")
        return None, f"env_id {ref!r} matches no environment record"

    # -- scenarios -----------------------------------------------------------------------------
    def scenario(self, path: Path, number: int, raw: RawRecord) -> None:
        """Import one scenario record of the ``number``-th scenario file (a worker's
        task). Raises fatal SandpitErrors."""
        record = scenario_record(raw)
        key = record.task_id or f"#{record.index}"
        report = ItemReport("scenario", key, path.name, record.index, notes=list(record.notes), file_number=number)
        try:
            self._scenario(record, report)
        finally:
            self._finish(report)

    def _scenario(self, record: ScenarioRecord, report: ItemReport) -> None:
        if record.problems:
            report.refuse("; ".join(record.problems))
            return
        env_id, problem = self.resolve(record.env_ref)
        if env_id is None:
            report.refuse(problem or "no environment")
            return
        entry = self.environment(env_id, record.init_config)
        environment_id = entry.report.sandpit_id
        if environment_id is None:
            report.refuse(f"its environment {env_id!r} was refused: {'; '.join(entry.report.reasons)[:300]}")
            return
        if record.class_name is not None and record.class_name != entry.record.class_name:
            report.refuse(f"env_class_name {record.class_name!r} is not its environment's class "
                          f"{entry.record.class_name!r}")
            return
        external_id = (record.task_id or f"#{record.index}")[:MAX_EXTERNAL_ID]
        claim = (external_id, scenario_hash(record.task, record.init_config, record.checklist,
                                            record.checklist_with_func, self.profile))
        with entry.lock:
            if entry.scenarios is None:
                self._list_scenarios(entry, environment_id)
            assert entry.scenarios is not None
            known = entry.scenarios.get(claim)
            waiting = entry.pending.get(claim) if known is None else None
            if known is None and waiting is None:
                entry.pending[claim] = threading.Event()
        if known is not None:
            report.status, report.sandpit_id = "reused", known
            return
        if waiting is not None:  # the same scenario earlier in the files is being imported
            waiting.wait()
            with entry.lock:
                known = entry.scenarios.get(claim)
            if known is None:
                report.refuse("the same scenario earlier in the files was refused")
            else:
                report.status, report.sandpit_id = "reused", known
                report.notes.append("the same scenario appears earlier in the files")
            return
        try:
            self._create(environment_id, external_id, record, report)
        finally:
            with entry.lock:
                if report.status != "refused" and report.sandpit_id is not None:
                    entry.scenarios[claim] = report.sandpit_id
                    earlier = entry.external.get(external_id)
                    if earlier is not None:
                        report.notes.append(f"changed since an earlier import: imported anew ({earlier} kept)")
                    entry.external[external_id] = report.sandpit_id
                entry.pending.pop(claim).set()

    def _list_scenarios(self, entry: _Environment, environment_id: str) -> None:
        """The registered environment's scenarios by (external id, content hash)."""
        entry.scenarios = {}
        listing: Callable[..., Page[Scenario]] = functools.partial(self.client.scenarios.list,
                                                                   environment_id=environment_id)
        for known in every_item(listing):
            entry.scenarios.setdefault((known.external_id or "", scenario_hash_of(known)), known.id)
            entry.external.setdefault(known.external_id or "", known.id)

    def _create(self, environment_id: str, external_id: str, record: ScenarioRecord, report: ItemReport) -> None:
        body = {"environment_id": environment_id, "task": record.task, "init_config": record.init_config,
                "checklist": record.checklist, "checklist_with_func": record.checklist_with_func,
                "external_id": external_id, "episode_profile": self.profile}
        try:
            created = self.client.scenarios.create(body)
        except SandpitError as exc:
            if _fatal(exc):
                raise
            report.refuse_answer(exc)
            return
        report.sandpit_id = created.id
        if self.check and record.checklist_with_func:
            self._validate(created.id, report)

    def _validate(self, scenario_id: str, report: ItemReport) -> None:
        """Instantiate the scenario and run its checks on the initial state; a check that
        errors refuses it (the scenario is deleted again)."""
        try:
            with self.client.envs.create(scenario_id=scenario_id) as env:
                evaluation = env.evaluate()
        except SandpitError as exc:
            if _fatal(exc):
                raise
            report.refuse(f"instantiating the scenario failed: {exc.code}: {exc.message}")
        else:
            for outcome in evaluation.results:
                if outcome.error is not None:
                    report.refuse(f"check {outcome.check_item[:80]!r} on the initial state: {outcome.error}")
        if report.status == "refused":
            try:
                self.client.scenarios.delete(scenario_id)
            except SandpitError as exc:
                if _fatal(exc):
                    raise

    # -- bookkeeping ---------------------------------------------------------------------------
    def _finish(self, report: ItemReport) -> None:
        with self.lock:
            self.report.items.append(report)
        if self.on_item is not None:
            self.on_item(report)


def import_release(client: Client, environments: Path, scenarios: Iterable[Path] = (), *,
                   policy: str = "standard", check: bool = True, limit: int | None = None, concurrency: int = 4,
                   profile: str = PROFILE, on_item: Callable[[ItemReport], None] | None = None,
                   on_bytes: Callable[[int], None] | None = None) -> ImportReport:
    """Import an EnvScaler release (module docstring): the environment file, then each
    scenario file (streamed), ``concurrency`` scenarios at a time.

    Args:
        policy: the static policy environments are registered under (``strict``,
            ``standard``, ``audit``).
        check: validate each new scenario by running its checks on its initial state.
        profile: the scenarios' ``episode_profile`` (``envscaler``: EnvScaler's rules).
        limit: import only the first ``limit`` scenario records (and the environments
            they use); without scenario files, the first ``limit`` environments.
        on_item: told of each item as it is finished (any thread).
        on_bytes: told of every ``n`` bytes read from the files (a progress feed).

    Returns:
        The report; ``file_errors`` lists scenario files that could not be read to their
        end (the records before the error were imported).

    Raises:
        EnvScalerFileError: the environment file cannot be read (nothing is imported).
        SandpitError: the server is unreachable or refuses the API key (what was
            imported before stays).
    """
    run = _Import(client, policy=policy, check=check, profile=profile, on_item=on_item)
    run.read_environments(environments, on_bytes)
    run.load_existing()
    paths = list(scenarios)
    taken = 0
    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="envscaler-import") as workers:
        pending: set[Future[None]] = set()
        try:
            for number, path in enumerate(paths):
                if limit is not None and taken >= limit:
                    break
                try:
                    _, records = read_records(path, on_bytes)
                    for raw in records:
                        if limit is not None and taken >= limit:
                            break
                        taken += 1
                        pending.add(workers.submit(run.scenario, path, number, raw))
                        if len(pending) >= 2 * max(1, concurrency):
                            done, pending = wait(pending, return_when=FIRST_COMPLETED)
                            for future in done:
                                future.result()
                except EnvScalerFileError as exc:
                    run.report.file_errors.append(str(exc))
            for future in pending:
                future.result()
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    if limit is None or not paths:
        run.register_rest(limit)
    run.report.items.sort(key=lambda item: (item.kind != "environment", item.file_number, item.index))
    return run.report


def import_files(client: Client, envs_path: Path, scenarios_path: Path | None, *, check: bool = True,
                 on_item: Callable[[ItemReport], None] | None = None) -> list[ItemReport]:
    """Register Sandpit's own synthesis output (``sandpit synth``: EnvScaler-shaped
    files) with :func:`import_release`, its scenarios under the ``sandpit`` episode
    profile. Returns the items (environments first). Raises what that raises."""
    return import_release(client, envs_path, [scenarios_path] if scenarios_path is not None else [], check=check,
                          profile="sandpit", on_item=on_item).items
