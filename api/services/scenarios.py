"""Scenarios (``/v1/scenarios``): EnvScaler ScenGenerator records (task, ``init_config``,
``checklist``, ``checklist_with_func``) bound to a registered environment. Their check
functions must pass the ``standard`` static policy and bind ``check_func`` (as must checks
given inline to ``evaluate``): both are decided on the host from the text alone
(:func:`ast.parse`; nothing is executed). They run only in sandboxes
(:mod:`sandpit.api.envs.rewards`)."""

from __future__ import annotations

import ast

from sqlalchemy import func, select

from ..db import models
from ..db.database import Database
from ..errors import InvalidRequest, PayloadTooLarge
from ..json_rules import json_size, text_size
from ..sandboxes import CHECK_SOURCE_MAX_BYTES
from ..schemas.scenarios import CheckSpec, ScenarioCreate, ScenarioPublic, ScenariosPublic
from ..settings import ApiSettings
from .common import new_id, owned, utcnow
from .environments import EnvironmentService
from .limits import check_config
from .policy import check_source
from .quotas import QuotaService, TenantContext
from .tenants import TenantService


def check_policy(checks: list[CheckSpec], field: str) -> None:
    """Every check function must fit a sandbox job (``CHECK_SOURCE_MAX_BYTES`` of UTF-8),
    pass the ``standard`` static policy (a source that does not parse is its
    ``syntax-error``) and bind ``check_func`` at module level (:func:`binds_check_func`;
    the sandbox's verdict on a source that does not is ``no check_func defined``, as
    ``/v1/validate`` reports it). Raises InvalidRequest naming the check
    (``<field>.<index>.check_func``)."""
    for index, check in enumerate(checks):
        where = f"{field}.{index}.check_func"
        size = len(check.check_func.encode("utf-8", "surrogatepass"))
        if size > CHECK_SOURCE_MAX_BYTES:
            raise InvalidRequest(f"{field}[{index}].check_func is {size} bytes of UTF-8, over the "
                                 f"{CHECK_SOURCE_MAX_BYTES} a check may have", field=where)
        report = check_source(check.check_func, "standard", filename="<check_func>")
        if not report.passed:
            first = next(f for f in report.findings if f.severity == "error")
            raise InvalidRequest(f"{field}[{index}].check_func: line {first.line} {first.rule}: "
                                 f"{first.message}", field=where)
        if not binds_check_func(check.check_func):
            raise InvalidRequest(f"{field}[{index}].check_func: no check_func defined (the source must define "
                                 "check_func(final_state) at module level)", field=where)


def checks_size(checks: list[CheckSpec]) -> int:
    """UTF-8 bytes of all ``check_func`` sources together (what ``max_code_bytes`` caps for
    one checklist, as it caps one environment's source)."""
    return sum(text_size(check.check_func) for check in checks)


def binds_check_func(source: str) -> bool:
    """True when ``source`` (parsed with :func:`ast.parse`, never run) binds the name
    ``check_func`` in its module scope: ``def``/``async def``/``class``, an assignment
    target (plain, annotated with a value, augmented, walrus, ``for``, ``with ... as``,
    ``except ... as``), an import alias, or a ``global check_func`` in a function, at any
    depth of ``if``/``try``/loops, not inside function, class or comprehension bodies.
    False when it binds no such name or does not parse (the policy reports that)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    name = "check_func"
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
            if any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(node)):
                return True
            todo.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return True
            continue
        if isinstance(node, ast.AnnAssign) and node.value is None:
            todo.append(node.annotation)  # an annotation alone binds nothing
            continue
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.ExceptHandler) and node.name == name:
            return True
        if isinstance(node, ast.MatchAs | ast.MatchStar) and node.name == name:
            return True
        todo.extend(ast.iter_child_nodes(node))
    return False


class ScenarioService:
    """Create, read, list and delete scenarios."""

    def __init__(self, settings: ApiSettings, db: Database, environments: EnvironmentService, quotas: QuotaService,
                 tenants: TenantService) -> None:
        self.settings = settings
        self.db = db
        self.environments = environments
        self.quotas = quotas
        self.tenants = tenants

    # -- the HTTP contract -------------------------------------------------------------------
    def create(self, caller: TenantContext, body: ScenarioCreate) -> ScenarioPublic:
        """``POST /v1/scenarios``: the tenant's size quotas, then :meth:`create_scenario`; audited."""
        self.quotas.check_size(caller, "max_init_config_bytes", json_size(body.init_config), "init_config")
        for index, check in enumerate(body.checklist_with_func):
            self.quotas.check_size(caller, "max_code_bytes", text_size(check.check_func),
                                   f"checklist_with_func.{index}.check_func")
        self.quotas.check_size(caller, "max_code_bytes", checks_size(body.checklist_with_func), "checklist_with_func")
        row = self.create_scenario(caller.tenant, body)
        self.tenants.audit(caller.tenant, caller.actor, "scenario.create", row.id,
                           {"environment_id": row.environment_id})
        return ScenarioPublic.model_validate(row, from_attributes=True)

    def read(self, caller: TenantContext, scenario_id: str) -> ScenarioPublic:
        """One scenario. Raises NotFound (also for another tenant's)."""
        return ScenarioPublic.model_validate(self.get_scenario(caller.tenant, scenario_id), from_attributes=True)

    def page(self, caller: TenantContext, limit: int, offset: int, environment_id: str | None) -> ScenariosPublic:
        """A page of the tenant's scenarios (optionally of one environment), newest first."""
        rows, total = self.list_scenarios(caller.tenant, limit, offset, environment_id)
        return ScenariosPublic(data=[ScenarioPublic.model_validate(r, from_attributes=True) for r in rows],
                               count=total)

    def delete(self, caller: TenantContext, scenario_id: str) -> None:
        """Delete a scenario; audited. Raises NotFound."""
        self.delete_scenario(caller.tenant, scenario_id)
        self.tenants.audit(caller.tenant, caller.actor, "scenario.delete", scenario_id)

    # -- scenarios -------------------------------------------------------------------------------
    def create_scenario(self, tenant: str, body: ScenarioCreate) -> models.Scenario:
        """Store a scenario of a registered environment. Raises NotFound (environment),
        PayloadTooLarge (init_config, a check or all checks together over their caps),
        InvalidRequest (a check_func that fails the policy or defines no check_func)."""
        self.environments.get_environment(tenant, body.environment_id)
        check_config(self.settings, body.init_config)
        size = checks_size(body.checklist_with_func)
        if size > self.settings.max_code_bytes:
            raise PayloadTooLarge(f"checklist_with_func has {size} bytes of check_func sources, over "
                                  f"max_code_bytes={self.settings.max_code_bytes}", field="checklist_with_func")
        check_policy(body.checklist_with_func, "checklist_with_func")
        row = models.Scenario(id=new_id("scn"), tenant=tenant, environment_id=body.environment_id, task=body.task,
                              init_config=body.init_config, checklist=list(body.checklist),
                              checklist_with_func=[c.model_dump() for c in body.checklist_with_func],
                              external_id=body.external_id, episode_profile=body.episode_profile,
                              check_objects=body.check_objects, created_at=utcnow())
        with self.db.write() as db:
            db.add(row)
        return row

    def get_scenario(self, tenant: str, scenario_id: str) -> models.Scenario:
        """The scenario or NotFound (also for another tenant's)."""
        with self.db.read() as db:
            return owned(db, models.Scenario, scenario_id, tenant, "scenario")

    def list_scenarios(self, tenant: str, limit: int, offset: int,
                       environment_id: str | None = None) -> tuple[list[models.Scenario], int]:
        """A page of scenarios (optionally of one environment), newest first, and the total."""
        where = [models.Scenario.tenant == tenant]
        if environment_id is not None:
            where.append(models.Scenario.environment_id == environment_id)
        with self.db.read() as db:
            total = db.scalar(select(func.count()).select_from(models.Scenario).where(*where)) or 0
            rows = db.scalars(select(models.Scenario).where(*where)
                              .order_by(models.Scenario.created_at.desc(), models.Scenario.id)
                              .limit(limit).offset(offset)).all()
        return list(rows), total

    def delete_scenario(self, tenant: str, scenario_id: str) -> None:
        """Delete a scenario; envs created from it keep running (their link is cleared)."""
        with self.db.write() as db:
            row = owned(db, models.Scenario, scenario_id, tenant, "scenario")
            db.query(models.Env).filter(models.Env.scenario_id == scenario_id).update(
                {models.Env.scenario_id: None}, synchronize_session=False)
            db.delete(row)
