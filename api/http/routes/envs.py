"""``/v1/envs``: create, read, list, delete envs; reset, state, trajectory, episodes,
restore, fork and evaluate. The step (``POST /v1/envs/{env_id}/step``) has a door of its
own: :mod:`..step`; the batched step and the create are answered by doors in front of the
router (:mod:`..batch_step`, :mod:`..create_env`), which answer as these routes do (their
tests compare the two)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response, status

from ...schemas.batch import BatchStepRequest, BatchStepResponse
from ...schemas.envs import (
    AttemptPublic,
    EnvCreate,
    EnvPublic,
    EnvsPublic,
    EpisodesPublic,
    ForkRequest,
    ResetRequest,
    RestoreRequest,
    StateView,
    Trajectory,
)
from ...schemas.evaluations import EvaluateRequest, EvaluationPublic
from ..deps import (
    METERED,
    AttemptsDep,
    BatchDep,
    CallerDep,
    EnvsDep,
    EpisodesDep,
    FencedDep,
    HistoryDep,
    IdempotentDep,
    PageDep,
    RewardsDep,
    json_router,
)

router = json_router(prefix="/v1/envs", tags=["envs"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EnvPublic, responses=METERED)
def create_env(body: EnvCreate, envs: EnvsDep, caller: CallerDep, keyed: IdempotentDep) -> Response:
    """Instantiate an environment (registered, inline code, or a scenario's) in a sandbox;
    step 0 is stored. 429 over the tenant's ``max_live_envs``, ``max_concurrent_calls``,
    ``max_profile`` or size quotas (nothing is created then). With ``Idempotency-Key``, a
    retry gets the first response and creates nothing."""
    # the reply echoes init_config (megabytes): spliced in as the bytes already computed for it
    return keyed.respond(caller, status.HTTP_201_CREATED, lambda: envs.create(caller, body).json())


@router.post(":step", response_model=BatchStepResponse, responses=METERED)
def step_envs(body: BatchStepRequest, batch: BatchDep, caller: CallerDep) -> Response:
    """One action for each of several envs (at most 256, each env once), carried out as
    ``POST /v1/envs/{id}/step`` carries each out, the envs concurrently. ``results[i]``
    is the outcome of ``steps[i]``: ``status`` 200 with the step's ``result``, or the
    status and ``error`` the step alone would have got (a refused step never fails the
    batch). A step's ``idempotency_key`` works as the step route's ``Idempotency-Key``.
    422 for a malformed batch or an env named twice (nothing runs)."""
    return Response(batch.step_many(caller, body), media_type="application/json")


@router.get("/{env_id}", response_model=EnvPublic)
def get_env(env_id: str, envs: EnvsDep, caller: CallerDep) -> EnvPublic:
    """One env with its tools and current episode (404 for unknown ids and other tenants' ids)."""
    return envs.read(caller, env_id)


@router.get("", response_model=EnvsPublic)
def list_envs(page: PageDep, envs: EnvsDep, caller: CallerDep) -> EnvsPublic:
    """The tenant's envs, newest first (``limit``/``offset``)."""
    return envs.page(caller, page.limit, page.offset)


@router.delete("/{env_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_env(env_id: str, envs: EnvsDep, caller: CallerDep, _: FencedDep) -> Response:
    """Delete an env: its sandbox session, trajectory and snapshots."""
    envs.delete(caller, env_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{env_id}/reset", response_model=EnvPublic, responses=METERED)
def reset(env_id: str, episodes: EpisodesDep, caller: CallerDep, keyed: IdempotentDep, _: FencedDep,
          body: ResetRequest | None = None) -> Response:
    """Begin the next episode (EnvScaler ``reset()``: the response has the initial
    ``observation``, ``tools`` and ``introduction``), optionally with another scenario,
    ``init_config`` or episode options. The previous episode stays readable. With
    ``Idempotency-Key``, a retry gets the first response and starts no episode."""
    return keyed.respond(caller, status.HTTP_200_OK,
                         lambda: episodes.reset(caller, env_id, body).model_dump_json().encode("utf-8"))


@router.get("/{env_id}/state", response_model=StateView, response_class=Response)
def get_state(env_id: str, history: HistoryDep, caller: CallerDep,
              step: Annotated[int | None, Query(ge=0, le=10**9)] = None,
              episode: Annotated[int | None, Query(ge=1, le=10**9)] = None) -> Response:
    """State at the head, or at ``?step=k`` of the current episode or of ``?episode=e``
    (EnvScaler's state: every non-dunder attribute; non-JSON values as ``$`` tags)."""
    # pre-rendered bytes (one rendering per state root): no model round trip of a large state
    return Response(history.state(caller, env_id, step, episode), media_type="application/json")


@router.get("/{env_id}/trajectory", response_model=Trajectory)
def trajectory(env_id: str, history: HistoryDep, caller: CallerDep,
               episode: Annotated[int | None, Query(ge=1, le=10**9)] = None,
               limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
               offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> Trajectory:
    """Steps of the current episode (or ``?episode=e``): action, observation, status,
    reward, duration; ``limit``/``offset`` page through long episodes."""
    return history.trajectory(caller, env_id, episode, limit, offset)


@router.get("/{env_id}/episodes", response_model=EpisodesPublic)
def episodes(env_id: str, page: PageDep, history: HistoryDep, caller: CallerDep) -> EpisodesPublic:
    """Every episode of the env, oldest first: scenario, status, steps, reward."""
    return history.episodes(caller, env_id, page.limit, page.offset)


@router.post("/{env_id}/restore", response_model=EnvPublic)
def restore(env_id: str, body: RestoreRequest, episodes: EpisodesDep, caller: CallerDep, _: FencedDep) -> EnvPublic:
    """Go back to step ``k`` of the episode (later steps are discarded; 409 past the head)."""
    return episodes.restore(caller, env_id, body)


@router.post("/{env_id}/attempts", status_code=status.HTTP_201_CREATED, response_model=AttemptPublic)
def resume(env_id: str, attempts: AttemptsDep, caller: CallerDep) -> AttemptPublic:
    """Resume the env as a new attempt: its number and token (send it as
    ``Sandpit-Attempt``). Calls carrying an earlier attempt's token are 409
    ``stale_attempt`` from now on; the env itself (episode, head, sandbox) is unchanged."""
    return attempts.resume(caller, env_id)


@router.post("/{env_id}/fork", status_code=status.HTTP_201_CREATED, response_model=EnvsPublic,
             responses=METERED)
def fork(env_id: str, body: ForkRequest, episodes: EpisodesDep, caller: CallerDep, keyed: IdempotentDep) -> Response:
    """``count`` new envs sharing this env's history up to ``step`` (head by default);
    429 when they would exceed the tenant's ``max_live_envs``. With ``Idempotency-Key``,
    a retry gets the first response and forks nothing."""
    return keyed.respond(caller, status.HTTP_201_CREATED,
                         lambda: episodes.fork(caller, env_id, body).model_dump_json().encode("utf-8"))


@router.post("/{env_id}/evaluate", response_model=EvaluationPublic, responses=METERED)
def evaluate(env_id: str, rewards: RewardsDep, caller: CallerDep,
             body: EvaluateRequest | None = None) -> EvaluationPublic:
    """Reward: check functions (given, or the env's scenario's) on its initial and current state."""
    return rewards.evaluate(caller, env_id, body)
