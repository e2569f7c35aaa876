"""Typed dependencies for routes (``ServiceDep``, ``TenantDep``, ``PageDep``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from .evaluation import EvaluationService
from .service import EnvService


def get_service(request: Request) -> EnvService:
    """The app's :class:`EnvService` (created in the lifespan)."""
    return request.app.state.service


def get_evaluation(request: Request) -> EvaluationService:
    """The app's :class:`EvaluationService` (created in the lifespan)."""
    return request.app.state.evaluation


def get_tenant(request: Request) -> str:
    """The caller's tenant. Until API keys exist (multi-tenancy issue) every request
    belongs to ``SANDPIT_TENANT``."""
    return request.app.state.settings.tenant


class Page:
    """``limit`` (1..max_list_limit) and ``offset`` query parameters."""

    def __init__(self, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> None:
        self.limit = limit
        self.offset = offset


ServiceDep = Annotated[EnvService, Depends(get_service)]
EvaluationDep = Annotated[EvaluationService, Depends(get_evaluation)]
TenantDep = Annotated[str, Depends(get_tenant)]
PageDep = Annotated[Page, Depends(Page)]
