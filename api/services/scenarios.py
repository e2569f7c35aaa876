"""Scenarios (``/v1/scenarios``): EnvScaler ScenGenerator records (task, ``init_config``,
``checklist``, ``checklist_with_func``) bound to a registered environment. Their check
functions must pass the ``standard`` static policy (as must checks given inline to
``evaluate``); they run only in sandboxes (:mod:`sandpit.api.evaluations.rewards`)."""

from __future__ import annotations

from sqlalchemy import func, select

from ..db import models
from ..db.database import Database
from ..errors import InvalidRequest
from ..schemas.scenarios import CheckSpec, ScenarioCreate, ScenarioPublic, ScenariosPublic
from ..settings import ApiSettings
from .common import new_id, owned, utcnow
from .environments import EnvironmentService
from .limits import check_config
from .policy import check_source
from .quotas import QuotaService, TenantContext
from .tenants import TenantService
from .tools import json_size, text_size


def check_policy(checks: list[CheckSpec], field: str) -> None:
    """Every check function must pass the ``standard`` static policy. Raises
    InvalidRequest naming the check (``<field>.<index>.check_func``)."""
    for index, check in enumerate(checks):
        report = check_source(check.check_func, "standard", filename="<check_func>")
        if not report.passed:
            first = next(f for f in report.findings if f.severity == "error")
            raise InvalidRequest(f"{field}[{index}].check_func: line {first.line} {first.rule}: "
                                 f"{first.message}", field=f"{field}.{index}.check_func")


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
        PayloadTooLarge (init_config over cap), InvalidRequest (check_func policy errors)."""
        self.environments.get_environment(tenant, body.environment_id)
        check_config(self.settings, body.init_config)
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
