"""Short calls of the env verbs on the services :func:`sandpit.api.app.build` wires (the API's
unit tests over the executor's fake), as tenant ``team-a`` (:data:`ME`), and the checks of
the ``Counter`` scenario the tests of episodes use."""

from __future__ import annotations

import json
from typing import Any

from api_fakes import caller
from sandpit.api.app import Services
from sandpit.api.schemas.envs import EnvCreate, StepRequest, StepResult

ME = caller()
CHECK_COUNT = "def check_func(final_state):\n    return final_state['count'] == 3\n"
CHECK_LOG = "def check_func(final_state):\n    return len(final_state['log']) == 1\n"


def create(services: Services, environment_id: str, **body: Any) -> str:
    """A new env of ``environment_id`` (``body``: more ``EnvCreate`` fields); its id."""
    return services.envs.create(ME, EnvCreate(environment_id=environment_id, **body)).public.id


def step(services: Services, env_id: str, name: str, include: str | None = None, **arguments: Any) -> StepResult:
    """One ``name(**arguments)`` step of ``env_id``, as the API shows it."""
    return services.steps.step(ME, env_id, StepRequest(name=name, arguments=arguments), include).public()


def state(services: Services, env_id: str, at: int | None = None, episode: int | None = None) -> dict[str, Any]:
    """The state ``GET /state`` shows (at step ``at`` of ``episode``; the head by default)."""
    return dict(json.loads(services.history.state(ME, env_id, at, episode))["state"])
