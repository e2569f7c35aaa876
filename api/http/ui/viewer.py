"""What the viewer's pages read: the services the API already has (so tenant isolation
and every read are exactly the API's) plus the viewer's sessions and listings."""

from __future__ import annotations

from dataclasses import dataclass

from ...envs.history import EnvHistory
from ...envs.lifecycle import EnvLifecycle
from ...envs.listings import Listings
from ...evaluations.jobs import EvaluationJobs
from ...evaluations.listings import EvaluationListings
from ...services.environments import EnvironmentService
from ...services.scenarios import ScenarioService
from ...services.tenants import TenantService
from ...services.ui_sessions import UiSessions


@dataclass(frozen=True)
class Viewer:
    """The viewer's services (``app.state.viewer``, built in the app's lifespan)."""

    sessions: UiSessions
    listings: Listings
    evaluation_listings: EvaluationListings
    tenants: TenantService
    history: EnvHistory
    envs: EnvLifecycle
    environments: EnvironmentService
    scenarios: ScenarioService
    jobs: EvaluationJobs
