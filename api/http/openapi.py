"""The OpenAPI document lists every status an operation can send, with the real bodies.

FastAPI documents a route's success response and, for routes with parameters, its own
``422 {"detail": [...]}``; this server answers every error as :class:`~sandpit.api.errors.ErrorBody`
and sends 401/403/404/408/409/413/429/503 too. :func:`install` post-processes the
generated document in one place, deriving each operation's error statuses from what the
route is made of:

=========================================  =============================================
route has                                   statuses
=========================================  =============================================
an ``Authorization`` dependency             401 (``WWW-Authenticate``), 403, 503
                                            (``Retry-After``: the key lookup needs the
                                            database)
path parameters                             404 (unknown id, or another tenant's)
query or header parameters, or a body       422
:class:`~.strict_json.StrictJSONRoute`      413; with POST/PUT/PATCH also 408 and 422
the :data:`~.deps.METERED` marker           429 (``Retry-After``)
the ``Idempotency-Key`` header              409 (``idempotency_key_reused``,
                                            ``idempotency_key_in_flight`` with ``Retry-After``)
the ``Sandpit-Attempt`` header              409 (``stale_attempt``)
an entry in :data:`EXTRA`                   those (409s, 404s for ids in bodies)
=========================================  =============================================

It also gives ``application/json`` content to success responses of routes that return
a pre-serialized ``Response`` (the step route), and declares the bearer security scheme.

The request schemas say what the server enforces, so a request the document allows is
never refused for its shape (schemathesis' ``positive_data_acceptance`` check). Rules of
the models themselves are in the models (patterns, bounds, ``oneOf`` beside a model
validator); :func:`_service_rules` adds what services check beyond them, from the same
constants: the quota override fields (``QuotaOverrides``, from
:class:`~sandpit.api.settings.Quotas`), NUL-free code
(:func:`~sandpit.api.services.limits.check_code`),
``max_fork_count``, and the operator's default resource profile as the most a request
may ask for (callers may only lower it; given by :func:`install`'s ``default_limits``).
What remains a 422 for data of the right shape depends on the data's meaning (code that
does not parse or load, an ``init_config`` the class does not accept, the tenant's or
operator's model endpoints): ``tests/integration/api/test_api_fuzz.py`` lists those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast, get_args

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIRouter
from pydantic import BaseModel

from ..errors import ErrorBody
from ..services.idempotency import KEY_HEADER
from ..settings import ApiSettings, Quotas
from .deps import get_caller, require_operator
from .strict_json import StrictJSONRoute

ERROR_REF = "#/components/schemas/ErrorBody"
SECURITY_SCHEME = "bearer"

RETRY_AFTER = {"Retry-After": {"description": "Seconds before trying again can help.",
                               "schema": {"type": "integer", "minimum": 1}}}
STATUSES: dict[int, tuple[str, dict[str, Any]]] = {
    401: ("Missing, malformed, unknown, revoked or expired API key.",
          {"WWW-Authenticate": {"description": 'Always `Bearer realm="sandpit"`.', "schema": {"type": "string"}}}),
    403: ("Authenticated but not allowed: the operator key on a tenant route, a tenant key "
          "(or no operator key configured) on `/v1/admin`.", {}),
    404: ("Unknown id, or an id of another tenant (indistinguishable on purpose).", {}),
    408: ("The request body did not arrive whole within `SANDPIT_BODY_READ_TIMEOUT_S`; the "
          "connection is closed.", {}),
    409: ("The request contradicts the resource's state (past the head, expired env, in use, "
          "exists, already finished; `stale_attempt`: the `Sandpit-Attempt` token is not the env's "
          "current attempt's), or its `Idempotency-Key` was used for another request "
          "(`idempotency_key_reused`) or belongs to a request still running "
          "(`idempotency_key_in_flight`, with `Retry-After`); nothing was done.",
          {"Retry-After": {"description": "`idempotency_key_in_flight` only: seconds before the first "
                                          "request's response may be ready.",
                           "schema": {"type": "integer", "minimum": 1}}}),
    413: ("The body (`SANDPIT_MAX_BODY_BYTES`), code, `init_config` or arguments are over the "
          "server's cap.", {}),
    422: ("Invalid input: malformed or non-strict JSON, a value out of range, a refused "
          "combination; `field` names the part.", {}),
    429: ("A tenant quota was hit (`limit` names it); nothing was done.", RETRY_AFTER),
    503: ("No sandbox capacity, or the Docker Engine or database is unreachable; nothing was done.",
          RETRY_AFTER),
}
"""Error status -> (description, response headers)."""

EXTRA: dict[str, set[int]] = {
    "create_env": {404},  # environment_id / scenario_id in the body
    "create_scenario": {404},
    "create_evaluation": {404},
    "delete_environment": {409},  # used by envs or scenarios
    "step": {409},  # expired env
    "reset": {409, 404},  # expired env; scenario_id in the body
    "get_state": {409},  # past the head
    "restore": {409},
    "resume": {409},  # expired env
    "fork": {409},
    "evaluate": {409},  # no scenario and no checks
    "cancel_evaluation": {409},  # already finished
    "create_tenant": {409},  # exists
    "drain_host": {409},  # the last host taking envs, or the local backend
    "metrics": {401, 403},  # with SANDPIT_METRICS_REQUIRE_AUTH
}
"""Statuses a route sends that its parts do not show, by route name."""

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

NO_NUL = r"^[^\x00]*$"
CODE_FIELDS = (("ValidateRequest", "source_code"), ("ExecuteRequest", "code"), ("EnvCreate", "source_code"),
               ("EnvironmentCreate", "source_code"))
"""Code that :func:`~sandpit.api.services.limits.check_code` refuses with a NUL byte, by component."""
QUOTA_FIELDS = (("TenantCreate", "quotas"), ("TenantUpdate", "quotas"))
PROFILE_FIELDS = (("ProfileRequest", "memory_mib", "memory_mib"), ("ProfileRequest", "cpus", "cpus"),
                  ("ProfileRequest", "call_timeout_s", "call_timeout_s"), ("ExecuteRequest", "memory_mb", "memory_mib"),
                  ("ExecuteRequest", "timeout_s", "call_timeout_s"))
"""(component, field, profile field): lowerings of the default resource profile."""


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for dependency in dependant.dependencies:
        if dependency.call is not None:
            yield dependency.call
        yield from _calls(dependency)


def _params(dependant: Dependant, kind: str) -> bool:
    return bool(getattr(dependant, kind)) or any(_params(d, kind) for d in dependant.dependencies)


def _all_params(dependant: Dependant, kind: str) -> Iterator[Any]:
    yield from getattr(dependant, kind)
    for dependency in dependant.dependencies:
        yield from _all_params(dependency, kind)


def error_statuses(route: APIRoute) -> set[int]:
    """The error statuses ``route`` can answer (see the module's table)."""
    calls = set(_calls(route.dependant))
    statuses = set(EXTRA.get(route.name, ()))
    if calls & {get_caller, require_operator}:
        statuses |= {401, 403, 503}
    if _params(route.dependant, "path_params"):
        statuses.add(404)
    if _params(route.dependant, "query_params") or _params(route.dependant, "header_params") \
            or route.body_field is not None:
        statuses.add(422)
    if isinstance(route, StrictJSONRoute):
        statuses.add(413)
        if (route.methods or set()) & BODY_METHODS:
            statuses |= {408, 422}
    if any(param.alias in (KEY_HEADER, "Sandpit-Attempt") for param in _all_params(route.dependant, "header_params")):
        statuses.add(409)  # idempotency_key_reused, idempotency_key_in_flight, stale_attempt
    if 429 in route.responses or "429" in route.responses:  # the METERED marker
        statuses.add(429)
    return statuses


def is_authenticated(route: APIRoute) -> bool:
    return bool(set(_calls(route.dependant)) & {get_caller, require_operator})


def _error_response(status: int) -> dict[str, Any]:
    description, headers = STATUSES[status]
    response: dict[str, Any] = {"description": description,
                                "content": {"application/json": {"schema": {"$ref": ERROR_REF}}}}
    if headers:
        response["headers"] = headers
    return response


def quota_overrides_schema() -> dict[str, Any]:
    """``QuotaOverrides``: any fields of :class:`Quotas`, ``max_profile`` partial, none
    required, no defaults (an override that is absent keeps the default)."""
    quotas = Quotas.model_json_schema()
    ceiling = quotas.pop("$defs")["ProfileCeiling"]

    def optional(schema: dict[str, Any]) -> dict[str, Any]:
        schema = {**schema, "properties": {name: {k: v for k, v in prop.items() if k != "default"}
                                           for name, prop in schema["properties"].items()}}
        schema.pop("required", None)
        return schema

    schema = optional(quotas)
    schema["properties"]["max_profile"] = optional(ceiling)
    schema["title"] = "QuotaOverrides"
    schema["description"] = ("Overrides of a tenant's quotas (fields of the server's defaults; "
                             "`max_profile` may be partial). Sizes in bytes, rates per minute, times in seconds.")
    return schema


def _numeric(prop: dict[str, Any]) -> dict[str, Any]:
    """The number branch of a property schema (``anyOf: [number, null]`` or the property)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") in ("integer", "number"):
            return cast(dict[str, Any], branch)
    raise TypeError(f"not a number: {prop}")


BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def _exact_bounds(served: Any, model: Any) -> None:
    """Put the integer bounds of ``model`` (pydantic's schema of a component) back in
    ``served`` (FastAPI's copy): FastAPI's OpenAPI model keeps bounds as floats, and a
    float is not the bound past 2**53 (``le=2**64 - 1`` was served as 2**64, and a
    generator took 2**64 + 383 for valid)."""
    if isinstance(served, dict) and isinstance(model, dict):
        for key, value in served.items():
            exact = model.get(key)
            if key in BOUNDS and type(value) is float and type(exact) is int and float(exact) == value:
                served[key] = exact
            else:
                _exact_bounds(value, exact)
    elif isinstance(served, list) and isinstance(model, list):
        for value, exact in zip(served, model, strict=False):
            _exact_bounds(value, exact)


def _body_models(routes: list[APIRoute]) -> dict[str, Any]:
    """pydantic's schema of every component the routes' bodies use, by name."""
    found: dict[str, Any] = {}
    for route in routes:
        annotation = route.body_field.field_info.annotation if route.body_field is not None else None
        for model in (annotation, *get_args(annotation)):
            if isinstance(model, type) and issubclass(model, BaseModel):
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                found.update(schema.pop("$defs", {}))
                found[model.__name__] = schema
    return found


def _service_rules(definitions: dict[str, Any], settings: ApiSettings | None,
                   default_limits: dict[str, float] | None) -> None:
    """What services refuse beyond the request models (the module docstring)."""
    definitions["QuotaOverrides"] = quota_overrides_schema()
    for component, field in QUOTA_FIELDS:
        definitions[component]["properties"][field]["anyOf"] = [
            {"$ref": "#/components/schemas/QuotaOverrides"}, {"type": "null"}]
    for component, field in CODE_FIELDS:
        definitions[component]["properties"][field]["pattern"] = NO_NUL
    if settings is not None:
        _numeric(definitions["ForkRequest"]["properties"]["count"])["maximum"] = settings.max_fork_count
    if default_limits is not None:
        for component, field, limit in PROFILE_FIELDS:
            number = _numeric(definitions[component]["properties"][field])
            number["maximum"] = min(number.get("maximum", default_limits[limit]), default_limits[limit])


def _document(schema: dict[str, Any], routes: list[APIRoute], settings: ApiSettings | None = None,
              default_limits: dict[str, float] | None = None) -> None:
    components = schema.setdefault("components", {})
    definitions = components.setdefault("schemas", {})
    error_schema = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions.update(error_schema.pop("$defs", {}))
    definitions["ErrorBody"] = error_schema
    components["securitySchemes"] = {SECURITY_SCHEME: {
        "type": "http", "scheme": "bearer",
        "description": "A tenant's API key; the operator key (`SANDPIT_OPERATOR_KEY`) for `/v1/admin`."}}
    for route in routes:
        if not route.include_in_schema:
            continue
        for method in route.methods or ():
            operation = schema["paths"][route.path_format][method.lower()]
            responses = operation["responses"]
            responses.pop("422", None)  # FastAPI's {"detail": [...]}, also where nothing can fail
            for status in error_statuses(route):
                if str(status) in responses and status == 503 and route.name == "readyz":
                    continue  # /readyz answers 503 with its Health body
                responses[str(status)] = _error_response(status)
            if is_authenticated(route):
                operation["security"] = [{SECURITY_SCHEME: []}]
            if route.response_model is not None:
                success = responses.get(str(route.status_code or 200))
                if success is not None and "content" not in success and route.status_code != 204:
                    ref = f"#/components/schemas/{route.response_model.__name__}"
                    success["content"] = {"application/json": {"schema": {"$ref": ref}}}
    for unused in ("HTTPValidationError", "ValidationError"):
        definitions.pop(unused, None)
    for name, schema in _body_models(routes).items():
        _exact_bounds(definitions.get(name), schema)
    _service_rules(definitions, settings, default_limits)


def install(app: FastAPI, routers: list[APIRouter],
            default_limits: Callable[[], dict[str, float]] | None = None) -> None:
    """Make ``app.openapi()`` return the document with the error responses of the routes
    of ``routers`` (included in ``app`` without a prefix) and the services' rules (the
    module docstring; ``app.state.settings`` for ``max_fork_count``); built once.
    ``default_limits()``: ``memory_mib``, ``cpus`` and ``call_timeout_s`` of the operator's
    default resource profile (the most a request may ask for), or no such maxima."""
    routes = [route for router in routers for route in router.routes if isinstance(route, APIRoute)]
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _document(generate(), routes, getattr(app.state, "settings", None),
                      default_limits() if default_limits is not None else None)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
