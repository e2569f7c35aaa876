"""Python client for Sandpit's HTTP API: `Client` (sync) and `AsyncClient` (async).

Usage::

    from sandpit.client import Client

    with Client("http://127.0.0.1:8600", api_key="...") as client:
        environment = client.environments.create(source_code, "OrderDesk")
        env = client.envs.create(environment.id, init_config={"products": {}})
        result = env.step("add_to_cart", customer_id="C1", product_id="P1")
        result.status, result.observation
        env.delete()

Modules, one concept each:

* `clients`: `Client`, `AsyncClient` and their namespaces: `environments`
  (`environments.py`), `scenarios` (`scenarios.py`), `envs` and env handles (`envs.py`),
  `evaluations` (`evaluations.py`), `admin` (`admin.py`: tenants, keys, audit with the
  operator key);
* `models`: the wire models (`attempts`: an env's `Attempt`); `errors`: the `SandpitError` tree (drawn there) and the
  response -> error mapping; `calls`: every endpoint as a sans-IO `Call`;
  `transport`: the sync and async transports and what they retry;
* `llm`: the OpenAI-compatible model client (synthesis, rollouts, simulated users;
  `pip install 'sandpit[llm]'`: the default install is this package without openai);
* `rl` (gymnasium `RLEnv`, `AsyncRLEnv`, `SandpitVectorEnv`; `pip install 'sandpit[rl]'`),
  `gem_env` (GEM environments; `sandpit[gem]`) and `skyrl_env` (the SkyRL text env;
  `sandpit[skyrl]`): imported on their own, never here.
"""

from .attempts import Attempt
from .calls import tool_call_body
from .clients import AsyncClient, Client
from .envs import AsyncEnvHandle, EnvHandle
from .errors import (
    Conflict,
    InvalidRequest,
    InvalidResponse,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RequestInFlight,
    SandpitConnectionError,
    SandpitError,
    ServerError,
    Unauthorized,
    Unavailable,
)
from .models import (
    ApiKey,
    AuditEvent,
    CheckOutcome,
    Env,
    EnvConstruction,
    Environment,
    Episode,
    EpisodeResult,
    Evaluation,
    EvaluationJob,
    EvaluationProgress,
    EvaluationSummary,
    ExecResult,
    Include,
    Page,
    Profile,
    Scenario,
    StateView,
    StepResult,
    Tenant,
    ToolAction,
    Trajectory,
    TrajectoryStep,
    every_item,
)
from .transport import DEFAULT_URL

__all__ = [
    "Attempt",
    "DEFAULT_URL",
    "ApiKey",
    "AsyncClient",
    "AsyncEnvHandle",
    "AuditEvent",
    "CheckOutcome",
    "Client",
    "Conflict",
    "Env",
    "EnvConstruction",
    "EnvHandle",
    "Environment",
    "Episode",
    "EpisodeResult",
    "Evaluation",
    "EvaluationJob",
    "EvaluationProgress",
    "EvaluationSummary",
    "ExecResult",
    "Include",
    "InvalidRequest",
    "InvalidResponse",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "Profile",
    "RateLimited",
    "RequestInFlight",
    "SandpitConnectionError",
    "SandpitError",
    "Scenario",
    "ServerError",
    "StateView",
    "StepResult",
    "Tenant",
    "ToolAction",
    "Trajectory",
    "TrajectoryStep",
    "Unauthorized",
    "Unavailable",
    "every_item",
    "tool_call_body",
]
