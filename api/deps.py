"""Typed dependencies for routes (``ServiceDep``, ``CallerDep``, ``PageDep``, ...)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from .evaluation import EvaluationService
from .quotas import QuotaService, TenantContext
from .service import EnvService
from .tenancy import TenantService


def get_service(request: Request) -> EnvService:
    """The app's :class:`EnvService` (created in the lifespan)."""
    return request.app.state.service


def get_evaluation(request: Request) -> EvaluationService:
    """The app's :class:`EvaluationService` (created in the lifespan)."""
    return request.app.state.evaluation


def get_tenants(request: Request) -> TenantService:
    """The app's :class:`TenantService`."""
    return request.app.state.tenants


def get_quotas(request: Request) -> QuotaService:
    """The app's :class:`QuotaService`."""
    return request.app.state.quotas


def get_caller(request: Request) -> TenantContext:
    """The tenant of the request's ``Authorization: Bearer <api key>``. Raises
    Unauthorized (401: missing, unknown, revoked or expired key), Forbidden (403: the
    operator key on a tenant route)."""
    return request.app.state.tenants.authenticate(request.headers.get("authorization"))


def require_operator(request: Request) -> None:
    """Admin routes: the operator key. Raises Unauthorized (401) or Forbidden (403)."""
    request.app.state.tenants.require_operator(request.headers.get("authorization"))


class Page:
    """``limit`` (1..max_list_limit) and ``offset`` query parameters."""

    def __init__(self, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> None:
        self.limit = limit
        self.offset = offset


ServiceDep = Annotated[EnvService, Depends(get_service)]
EvaluationDep = Annotated[EvaluationService, Depends(get_evaluation)]
TenantsDep = Annotated[TenantService, Depends(get_tenants)]
QuotasDep = Annotated[QuotaService, Depends(get_quotas)]
CallerDep = Annotated[TenantContext, Depends(get_caller)]
OperatorDep = Annotated[None, Depends(require_operator)]
PageDep = Annotated[Page, Depends(Page)]
