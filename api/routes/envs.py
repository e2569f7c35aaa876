"""``/v1/envs``: create, read, list, delete envs; step, reset, state, trajectory,
episodes, restore, fork and evaluate."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from sandpit.executor.profiles import ProfileOverrides

from ..deps import CallerDep, EvaluationDep, PageDep, QuotasDep, ServiceDep, TenantsDep
from ..errors import InvalidRequest
from ..models import Env
from ..schemas import (
    EnvCreate,
    EnvPublic,
    EnvsPublic,
    EpisodePublic,
    EpisodesPublic,
    EvaluateRequest,
    EvaluationPublic,
    ForkRequest,
    ResetRequest,
    RestoreRequest,
    StateView,
    StepRequest,
    StepResult,
    Trajectory,
    TrajectoryStep,
)
from ..service import EnvService, clean_text
from ..strict_json import StrictJSONRoute
from ..tools import json_size, parse_step, text_size

router = APIRouter(prefix="/v1/envs", tags=["envs"], route_class=StrictJSONRoute)
INCLUDES = {"state_diff", "state"}


def _public(service: EnvService, row: Env, tools: bool = True) -> EnvPublic:
    return EnvPublic(id=row.id, environment_id=row.environment_id, episode=row.episode, step=row.step,
                     init_config=row.init_config, created_at=row.created_at, expires_at=row.expires_at,
                     forked_from=row.forked_from, forked_at_step=row.forked_at_step, scenario_id=row.scenario_id,
                     **service.env_view(row, with_tools=tools))


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EnvPublic)
def create_env(body: EnvCreate, service: ServiceDep, caller: CallerDep, quotas: QuotasDep,
               tenants: TenantsDep) -> EnvPublic:
    """Instantiate an environment (registered, inline code, or a scenario's) in a sandbox;
    step 0 is stored. 429 over the tenant's ``max_live_envs``, ``max_concurrent_calls``,
    ``max_profile`` or size quotas (nothing is created then)."""
    if body.source_code is not None:
        quotas.check_size(caller, "max_code_bytes", text_size(body.source_code),
                          "source_code")
    if body.init_config is not None:
        quotas.check_size(caller, "max_init_config_bytes", json_size(body.init_config), "init_config")
    requested = body.profile.model_dump(exclude_none=True) if body.profile else None
    if requested:  # above the operator's profile is a bad request (422) whatever the tenant's quota
        service.pool.profile(overrides=ProfileOverrides(**requested))
    default = service.pool.profile()
    profile = quotas.profile_overrides(caller, requested,
                                       {"memory_mib": default.memory_mib, "cpus": default.cpus,
                                        "call_timeout_s": default.call_timeout_s})
    with quotas.reserve_envs(caller), quotas.call(caller):
        row = service.create_env(caller.tenant, environment_id=body.environment_id, source_code=body.source_code,
                                 class_name=body.class_name, init_config=body.init_config,
                                 scenario_id=body.scenario_id, profile=profile, episode=body.episode,
                                 argument_checking=body.argument_checking)
    tenants.audit(caller.tenant, caller.actor, "env.create", row.id,
                  {"environment_id": row.environment_id, "scenario_id": row.scenario_id})
    return _public(service, row)


@router.get("/{env_id}", response_model=EnvPublic)
def get_env(env_id: str, service: ServiceDep, caller: CallerDep) -> EnvPublic:
    """One env with its tools and current episode (404 for unknown ids and other tenants' ids)."""
    return _public(service, service.get_env(caller.tenant, env_id))


@router.get("", response_model=EnvsPublic)
def list_envs(page: PageDep, service: ServiceDep, caller: CallerDep) -> EnvsPublic:
    """The tenant's envs, newest first (``limit``/``offset``)."""
    rows, total = service.list_envs(caller.tenant, page.limit, page.offset)
    return EnvsPublic(data=[_public(service, r, tools=False) for r in rows], count=total)


@router.delete("/{env_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_env(env_id: str, service: ServiceDep, caller: CallerDep, tenants: TenantsDep) -> Response:
    """Delete an env: its sandbox session, trajectory and snapshots."""
    service.delete_env(caller.tenant, env_id)
    tenants.audit(caller.tenant, caller.actor, "env.delete", env_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{env_id}/step", response_model=StepResult, response_class=Response)
def step(env_id: str, body: StepRequest, service: ServiceDep, caller: CallerDep, quotas: QuotasDep,
         include: Annotated[str | None, Query(max_length=64)] = None) -> Response:
    """One action (``{"name","arguments"}``, an OpenAI tool call, or raw model ``text``):
    EnvScaler ``step()``. Returns the observation, ``reward``, ``terminated`` and
    ``truncated``; committed before the reply. A malformed action is a recorded
    ``rejected`` step (200). 409 ``episode_ended`` after the episode ended; 429 over the
    tenant's ``steps_per_minute``, ``max_concurrent_calls``, ``max_running_calls`` (queue
    wait) or ``max_arguments_bytes`` (nothing is recorded)."""
    wanted = set(filter(None, (include or "").split(",")))
    if not wanted <= INCLUDES:
        raise InvalidRequest(f"include may name {sorted(INCLUDES)}, got {sorted(wanted - INCLUDES)}", field="include")
    settings = service.settings
    action = parse_step(body, settings.max_arguments_bytes, settings.max_json_depth,
                        lambda size: quotas.check_size(caller, "max_arguments_bytes", size, "arguments"))
    with quotas.call(caller):
        quotas.take_step(caller)
        out = service.step(caller.tenant, env_id, action, want_diff="state_diff" in wanted,
                           want_state="state" in wanted)
    run, r = out.run, out.result
    result = StepResult(env_id=out.env_id, episode=out.episode, step=out.step, action=out.action,
                        observation=run.observation, status=run.status, observation_role=run.role,
                        reward=out.reward, terminated=out.terminated, truncated=out.truncated,
                        duration_ms=run.duration_ms, stdout=clean_text(r.stdout), stderr=clean_text(r.stderr),
                        traceback=clean_text(r.traceback) if r.traceback else None, error=run.error,
                        argument_findings=run.findings, checks=out.checks, recovered=out.recovered,
                        state_diff=EnvService.diff(out) if "state_diff" in wanted else None,
                        state=out.state_after if "state" in wanted else None)
    # serialized once here (the hot path): no second validation by the response model
    return Response(result.model_dump_json(), media_type="application/json")


@router.post("/{env_id}/reset", response_model=EnvPublic)
def reset(env_id: str, service: ServiceDep, caller: CallerDep, quotas: QuotasDep,
          body: ResetRequest | None = None) -> EnvPublic:
    """Begin the next episode (EnvScaler ``reset()``: the response has the initial
    ``observation``, ``tools`` and ``introduction``), optionally with another scenario,
    ``init_config`` or episode options. The previous episode stays readable."""
    if body is not None and body.init_config is not None:
        quotas.check_size(caller, "max_init_config_bytes", json_size(body.init_config), "init_config")
    with quotas.call(caller):
        row = service.reset(caller.tenant, env_id, body.init_config if body else None,
                            scenario_id=body.scenario_id if body else None, episode=body.episode if body else None)
    return _public(service, row)


@router.get("/{env_id}/state", response_model=StateView)
def get_state(env_id: str, service: ServiceDep, caller: CallerDep,
              step: Annotated[int | None, Query(ge=0, le=10**9)] = None,
              episode: Annotated[int | None, Query(ge=1, le=10**9)] = None) -> StateView:
    """State at the head, or at ``?step=k`` of the current episode or of ``?episode=e``
    (EnvScaler's state: every non-dunder attribute; non-JSON values as ``$`` tags)."""
    row, number, at, state, truncated = service.state(caller.tenant, env_id, step, episode)
    return StateView(env_id=row.id, episode=number, step=at, state=state, truncated=truncated)


@router.get("/{env_id}/trajectory", response_model=Trajectory)
def trajectory(env_id: str, service: ServiceDep, caller: CallerDep,
               episode: Annotated[int | None, Query(ge=1, le=10**9)] = None,
               limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
               offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> Trajectory:
    """Steps of the current episode (or ``?episode=e``): action, observation, status,
    reward, duration; ``limit``/``offset`` page through long episodes."""
    row, number, steps, total, record = service.trajectory(caller.tenant, env_id, episode, limit, offset)
    return Trajectory(env_id=row.id, episode=number, count=total,
                      status=record.status if record is not None else "running",
                      reward=record.reward if record is not None else None,
                      steps=[TrajectoryStep.model_validate(s, from_attributes=True) for s in steps])


@router.get("/{env_id}/episodes", response_model=EpisodesPublic)
def episodes(env_id: str, page: PageDep, service: ServiceDep, caller: CallerDep) -> EpisodesPublic:
    """Every episode of the env, oldest first: scenario, status, steps, reward."""
    records, total = service.episodes(caller.tenant, env_id, page.limit, page.offset)
    return EpisodesPublic(count=total, data=[
        EpisodePublic(episode=r.episode, environment_id=r.environment_id, scenario_id=r.scenario_id, status=r.status,
                      steps=steps, observation=r.observation, task=r.task, reward=r.reward, checks=r.checks,
                      config=r.config, started_at=r.started_at, ended_at=r.ended_at)
        for r, steps in records])


@router.post("/{env_id}/restore", response_model=EnvPublic)
def restore(env_id: str, body: RestoreRequest, service: ServiceDep, caller: CallerDep) -> EnvPublic:
    """Go back to step ``k`` of the episode (later steps are discarded; 409 past the head)."""
    return _public(service, service.restore(caller.tenant, env_id, body.step))


@router.post("/{env_id}/fork", status_code=status.HTTP_201_CREATED, response_model=EnvsPublic)
def fork(env_id: str, body: ForkRequest, service: ServiceDep, caller: CallerDep, quotas: QuotasDep,
         tenants: TenantsDep) -> EnvsPublic:
    """``count`` new envs sharing this env's history up to ``step`` (head by default);
    429 when they would exceed the tenant's ``max_live_envs``."""
    if body.count > service.settings.max_fork_count:  # a bad request (422) before any quota question
        raise InvalidRequest(f"count {body.count} is over the maximum {service.settings.max_fork_count}", field="count")
    with quotas.reserve_envs(caller, body.count):
        rows = service.fork(caller.tenant, env_id, body.step, body.count)
    tenants.audit(caller.tenant, caller.actor, "env.fork", env_id, {"forks": [r.id for r in rows]})
    return EnvsPublic(data=[_public(service, r, tools=False) for r in rows], count=len(rows))


@router.post("/{env_id}/evaluate", response_model=EvaluationPublic)
def evaluate(env_id: str, evaluation: EvaluationDep, caller: CallerDep, quotas: QuotasDep, tenants: TenantsDep,
             body: EvaluateRequest | None = None) -> EvaluationPublic:
    """Reward: check functions (given, or the env's scenario's) on its initial and current state."""
    with quotas.call(caller):
        result = evaluation.evaluate(caller.tenant, env_id, body.checks if body else None)
    tenants.audit(caller.tenant, caller.actor, "env.evaluate", env_id, {"reward": result.reward, "evaluation": result.id})
    return result
