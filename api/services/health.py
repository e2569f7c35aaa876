"""Health: ``/readyz`` (database, sandbox backend, warm pool) and ``/metrics``."""

from __future__ import annotations

from ..db.database import Database
from ..metrics import Metrics
from ..sandboxes import Sandboxes
from ..schemas.health import Health
from ..settings import ApiSettings
from .tenants import TenantService


class HealthService:
    """Readiness and metrics of one app instance.

    Args:
        warm_target: idle+active sandboxes the pool must have for ``/readyz`` (0: none).
    """

    def __init__(self, settings: ApiSettings, db: Database, sandboxes: Sandboxes, metrics: Metrics,
                 tenants: TenantService, warm_target: int) -> None:
        self.settings = settings
        self.db = db
        self.sandboxes = sandboxes
        self.metrics = metrics
        self.tenants = tenants
        self.warm_target = warm_target

    def ready(self) -> Health:
        """``ok`` when the database answers, the sandbox backend answers and the pool is
        warm; ``not_ready`` with what is not (``checks``) otherwise."""
        checks: dict[str, str] = {}
        try:
            self.db.ping()
            checks["database"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            checks["database"] = f"error: {type(exc).__name__}"
        try:
            self.sandboxes.ping()
            checks["docker"] = "ok"
        except Exception as exc:  # noqa: BLE001
            checks["docker"] = f"error: {type(exc).__name__}"
        stats = self.sandboxes.stats()
        want = self.warm_target
        checks["pool"] = "ok" if stats["idle"] + stats["active"] >= want else f"warming ({stats['idle']}/{want} idle)"
        ready = all(v == "ok" for v in checks.values())
        return Health(status="ok" if ready else "not_ready", checks=checks)

    def metrics_text(self, authorization: str | None) -> bytes:
        """The Prometheus exposition. Raises Unauthorized/Forbidden when
        ``metrics_require_auth`` and ``authorization`` is not the operator key."""
        if self.settings.metrics_require_auth:
            self.tenants.require_operator(authorization)
        return self.metrics.render()
