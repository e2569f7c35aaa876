"""Environments: registered environment code (``/v1/environments``) and the inline
environments ``POST /v1/envs`` makes from ``source_code``.

Registration runs the static policy on the host (errors reject, warnings are kept in the
report), derives the tools by introspecting the class in a sandbox and (unless inline)
instantiates the class once there with ``sample_init_config``, so an ``__init__`` that
fails is refused at registration; a config key whose value replaces an attribute the
constructor set to a value of another type (the sandbox compares them) is an
``init-config-replaces-attribute`` warning in the policy report. Declared tools
(``EnvironmentCreate.tools``) are then checked against the class: every declared name must
be a public method or, asked of a sandbox (:data:`~.declared_tools.PROBE`), a callable
attribute of the instance; their differences from the derived schemas are stored
(:mod:`.declared_tools`). Environments are immutable once registered: the tools of
their derived schemas are compiled once per process where steps check arguments
(:class:`sandpit.api.envs.actions.ToolSets`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import bindparam, func, select

from ..db import models
from ..db.database import Database, object_of
from ..db.models import table
from ..errors import Conflict, InvalidRequest
from ..json_rules import json_size, text_size
from ..sandboxes import CodeFailed, Sandboxes
from ..schemas.environments import EnvironmentCreate, EnvironmentPublic, EnvironmentsPublic
from ..settings import ApiSettings
from .common import clean_text, new_id, owned, owned_row, utcnow
from .declared_tools import PROBE, agent_tools, read_probe, tool_differences
from .limits import check_code, check_config
from .policy import check_source, policy_summary, retyped_findings
from .quotas import QuotaService, TenantContext
from .tenants import TenantService

ENVIRONMENT_BY_ID = select(table(models.Environment)).where(table(models.Environment).c.id == bindparam("id"))
"""The ``environments`` row ``:id`` (built once: every env create reads it)."""


class EnvironmentService:
    """Register, read, list and delete environments (see the module docstring)."""

    def __init__(self, settings: ApiSettings, db: Database, sandboxes: Sandboxes, quotas: QuotaService,
                 tenants: TenantService) -> None:
        self.settings = settings
        self.db = db
        self.sandboxes = sandboxes
        self.quotas = quotas
        self.tenants = tenants

    # -- the HTTP contract -----------------------------------------------------------------
    def register(self, caller: TenantContext, body: EnvironmentCreate) -> EnvironmentPublic:
        """``POST /v1/environments``: the tenant's size quotas, then :meth:`create_environment`
        in one of its concurrent calls; audited. Raises what that raises, QuotaExceeded."""
        self.quotas.check_size(caller, "max_code_bytes", text_size(body.source_code), "source_code")
        if body.sample_init_config is not None:
            self.quotas.check_size(caller, "max_init_config_bytes", json_size(body.sample_init_config),
                                   "sample_init_config")
        with self.quotas.call(caller):
            row = self.create_environment(caller.tenant, name=body.name, source_code=body.source_code,
                                          class_name=body.class_name, description=body.description,
                                          policy=body.policy, introduction=body.introduction, rules=body.rules,
                                          argument_checking=body.argument_checking,
                                          sample_init_config=body.sample_init_config,
                                          declared_tools=body.declared_tools())
        self.tenants.audit(caller.tenant, caller.actor, "environment.create", row.id,
                           {"class_name": row.class_name, "code_sha256": row.code_sha256})
        return environment_public(row)

    def read(self, caller: TenantContext, environment_id: str) -> EnvironmentPublic:
        """One environment. Raises NotFound (also for another tenant's id)."""
        return environment_public(self.get_environment(caller.tenant, environment_id))

    def page(self, caller: TenantContext, limit: int, offset: int) -> EnvironmentsPublic:
        """A page of the tenant's registered environments, newest first."""
        rows, total = self.list_environments(caller.tenant, limit, offset)
        return EnvironmentsPublic(data=[environment_public(r) for r in rows], count=total)

    def delete(self, caller: TenantContext, environment_id: str) -> None:
        """Delete an environment; audited. Raises NotFound, Conflict (in use)."""
        self.delete_environment(caller.tenant, environment_id)
        self.tenants.audit(caller.tenant, caller.actor, "environment.delete", environment_id)

    # -- environments ------------------------------------------------------------------------
    def create_environment(self, tenant: str, *, name: str | None, source_code: str, class_name: str,
                           description: str | None, inline: bool = False, policy: str = "standard",
                           introduction: str | None = None, rules: list[str] | None = None,
                           argument_checking: str = "off",
                           sample_init_config: dict[str, Any] | None = None,
                           declared_tools: list[dict[str, Any]] | None = None) -> models.Environment:
        """Register code: the static ``policy`` must pass (errors reject, warnings are
        kept in the report), its tools are derived by introspecting the class in a
        sandbox, and (unless ``inline``) the class is instantiated once there with
        ``sample_init_config`` (``{}``). ``declared_tools`` (validated OpenAI schemas,
        see ``EnvironmentCreate.tools``) are checked against the class
        (:meth:`_check_declared`) and their differences from the derived ones stored.
        Raises PayloadTooLarge (code or config over cap), InvalidRequest (policy errors;
        the code fails to load, has no such class, or its ``__init__`` fails: the message
        carries the sandbox's observation; a declared tool the class lacks, naming
        ``tools.<i>``), NoCapacity (503 + Retry-After)."""
        check_code(self.settings, source_code)
        report = check_source(source_code, policy)
        if not report.passed:
            raise InvalidRequest(f"static policy {policy!r} rejected the code: {policy_summary(report)}",
                                 field="source_code")
        tools = self._derive_tools(tenant, source_code, class_name)
        if not inline:
            config = sample_init_config or {}
            check_config(self.settings, config, "sample_init_config")
            retyped = self._try_instantiate(tenant, source_code, class_name, config)
            report = report.extended("init-config-replaces-attribute", retyped_findings(source_code, class_name,
                                                                                        retyped))
        differences = None
        if declared_tools is not None:
            not_methods = self._check_declared(tenant, source_code, class_name, sample_init_config or {},
                                               declared_tools, tools)
            differences = tool_differences(declared_tools, tools, not_methods)
        row = models.Environment(
            id=new_id("envr"), tenant=tenant, name=name, class_name=class_name, source_code=source_code,
            code_sha256=code_digest(source_code), tools=tools, description=description, inline=inline,
            policy=policy, policy_report=report.to_dict(), introduction=introduction, rules=rules,
            argument_checking=argument_checking, declared_tools=declared_tools, tool_differences=differences,
            created_at=utcnow())
        with self.db.write() as db:
            db.add(row)
        return row

    def _check_declared(self, tenant: str, source_code: str, class_name: str, init_config: dict[str, Any],
                        declared: list[dict[str, Any]], derived: list[dict[str, Any]]) -> frozenset[str]:
        """Every declared tool must be a public method (a derived tool) or a callable
        attribute of the instance; the latter are asked of a sandbox (one script, only
        when there are such names). Returns the declared names that are callable but not
        public methods. Raises InvalidRequest naming ``tools.<i>`` of the first declared
        tool that is missing or not callable."""
        methods = {t["function"]["name"] for t in derived}
        others = [(i, t["function"]["name"]) for i, t in enumerate(declared) if t["function"]["name"] not in methods]
        if not others:
            return frozenset()
        names = [name for _, name in others]
        try:
            result = self.sandboxes.execute(
                tenant=tenant, code=PROBE, stdin=json.dumps({"class_name": class_name, "config": init_config,
                                                            "names": names}),
                files={"environment.py": source_code}, timeout_s=None, profile=self.sandboxes.profile())
        except ValueError as exc:  # the code does not fit the script's work space
            raise InvalidRequest(f"tools: the declared tools {', '.join(names[:10])} are no public methods of "
                                 f"{class_name}, and the class could not be asked for them: {exc}",
                                 field="tools") from None
        verdicts = read_probe(result.stdout, names)
        for index, name in others:
            verdict = verdicts[name]
            if verdict == "callable":
                continue
            why = {"missing": f"{class_name} has no attribute {name!r}",
                   "not_callable": f"{class_name}.{name} is not callable (a state attribute?)"}.get(
                verdict, f"{class_name} could not be asked about {name!r} ({verdict}; the check ended "
                         f"{result.status}: {clean_text(result.stderr)[-300:]})")
            raise InvalidRequest(f"tools.{index}: declared tool {name!r} is not a tool of the class: {why}; "
                                 f"its public methods are: {', '.join(sorted(methods)) or 'none'}",
                                 field=f"tools.{index}")
        return frozenset(names)

    def _derive_tools(self, tenant: str, source_code: str, class_name: str) -> list[dict[str, Any]]:
        try:
            return self.sandboxes.describe(tenant=tenant, source=source_code, class_name=class_name)
        except CodeFailed as exc:
            raise InvalidRequest(f"environment code failed in the sandbox ({exc.status}): "
                                 f"{clean_text(exc.observation)[:2000]}", field="source_code") from None

    def _try_instantiate(self, tenant: str, source_code: str, class_name: str,
                         init_config: dict[str, Any]) -> list[dict[str, str]]:
        """Instantiate the class once in a sandbox and discard the instance (registration's
        check that ``__init__`` works); returns the config keys that replaced an attribute
        the constructor set to a value of another type, as the sandbox found them
        (``[{"key", "constructed", "config"}]``). Raises InvalidRequest (``sample_init_config``)."""
        try:
            session = self.sandboxes.open_session(tenant=tenant, source=source_code, class_name=class_name,
                                                  init_config=init_config)
        except CodeFailed as exc:
            raise InvalidRequest(f"instantiating {class_name} with sample_init_config "
                                 f"{'{}' if not init_config else '(given)'} failed ({exc.status}): "
                                 f"{clean_text(exc.observation)[:2000]}; give a sample_init_config with what "
                                 "__init__ needs", field="sample_init_config") from None
        retyped = session.retyped
        session.close()
        return retyped

    def inline_environment(self, tenant: str, source_code: str, class_name: str) -> models.Environment:
        """The tenant's inline environment of this code and class (registered without the
        instantiation check on first use)."""
        check_code(self.settings, source_code)
        digest = code_digest(source_code)
        with self.db.read() as db:
            existing = db.scalars(select(models.Environment).where(
                models.Environment.tenant == tenant, models.Environment.code_sha256 == digest,
                models.Environment.class_name == class_name, models.Environment.inline.is_(True)).limit(1)).first()
        if existing is not None:
            return existing
        return self.create_environment(tenant, name=None, source_code=source_code, class_name=class_name,
                                       description=None, inline=True)

    def get_environment(self, tenant: str, environment_id: str) -> models.Environment:
        """The environment or :class:`NotFound` (also for another tenant's id:
        :func:`~.common.owned_row`). Every env create asks it: one prebuilt Core query, its
        row made an object by :func:`~sandpit.api.db.database.object_of` (read-only: no
        session knows it). Raises ServiceUnavailable (database)."""
        with self.db.read_connection() as conn:
            found = conn.execute(ENVIRONMENT_BY_ID, {"id": environment_id}).mappings().first()
        return owned_row(None if found is None else object_of(models.Environment, found), environment_id, tenant,
                         "environment")

    def list_environments(self, tenant: str, limit: int, offset: int) -> tuple[list[models.Environment], int]:
        """A page of registered (non-inline) environments, newest first, and the total."""
        where = (models.Environment.tenant == tenant, models.Environment.inline.is_(False))
        with self.db.read() as db:
            total = db.scalar(select(func.count()).select_from(models.Environment).where(*where)) or 0
            rows = db.scalars(select(models.Environment).where(*where)
                              .order_by(models.Environment.created_at.desc(), models.Environment.id)
                              .limit(limit).offset(offset)).all()
        return list(rows), total

    def delete_environment(self, tenant: str, environment_id: str) -> None:
        """Delete an environment. Raises NotFound, or Conflict while envs use it."""
        with self.db.write() as db:
            row = owned(db, models.Environment, environment_id, tenant, "environment")
            users = db.scalar(select(func.count()).select_from(models.Env)
                              .where(models.Env.environment_id == row.id)) or 0
            episodes = db.scalar(select(func.count()).select_from(models.Episode)
                                 .where(models.Episode.environment_id == row.id)) or 0
            scenarios = db.scalar(select(func.count()).select_from(models.Scenario)
                                  .where(models.Scenario.environment_id == row.id)) or 0
            if users or scenarios or episodes:
                raise Conflict(f"environment {environment_id!r} is used by {max(users, episodes and 1)} env(s) and "
                               f"{scenarios} scenario(s); delete them first")
            db.delete(row)


def environment_public(row: models.Environment) -> EnvironmentPublic:
    """``row`` as the API shows it: ``tools`` what the agent is shown (declared or
    derived), ``derived_tools`` always the derived ones, ``tools_source`` which,
    ``tool_differences`` as stored."""
    return EnvironmentPublic.model_validate({
        "id": row.id, "name": row.name, "class_name": row.class_name, "code_sha256": row.code_sha256,
        "tools": agent_tools(row), "derived_tools": list(row.tools),
        "tools_source": "declared" if row.declared_tools is not None else "derived",
        "tool_differences": row.tool_differences or [], "description": row.description,
        "introduction": row.introduction, "rules": row.rules, "policy": row.policy,
        "policy_report": row.policy_report, "argument_checking": row.argument_checking,
        "created_at": row.created_at})


def code_digest(source_code: str) -> str:
    """Hex SHA-256 of the code (lone surrogates kept as they are)."""
    return hashlib.sha256(source_code.encode("utf-8", "surrogatepass")).hexdigest()
