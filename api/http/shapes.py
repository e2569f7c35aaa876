"""The shapes of a request that every door in front of FastAPI checks as FastAPI does:
a body read as JSON or not by its content type and validated against the route's model
(:func:`validated_body`), a header validated as the route's header parameter
(:func:`header_errors`), and the 422 they add up to (:class:`Invalid`)."""

from __future__ import annotations

import email.message
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

_T = TypeVar("_T")


class Invalid(Exception):
    """The request's shape is invalid: pydantic's ``errors`` (``loc``, ``msg``), located
    as FastAPI locates them (``("body", ...)``, ``("query", "include")``)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors


def reads_as_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of ``content_type`` as JSON: ``application/json`` or
    ``application/*+json`` (parameters and case aside); no content type is not JSON."""
    if content_type == "application/json":
        return True
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def validated_body(adapter: TypeAdapter[_T], body: bytes, parsed: Any,
                   content_type: str | None) -> tuple[_T | None, list[dict[str, Any]]]:
    """``(value, errors)`` of a request ``body`` read as FastAPI reads a body model's: a
    non-empty body, already ``parsed`` by the JSON rules (:func:`~.strict_json.parse_body`,
    whatever its content type), is validated by ``adapter`` (the parsed value when the
    content type is JSON, else the raw bytes); ``errors`` located as FastAPI locates them
    (``("body", ...)``), empty when the body is valid."""
    if not body:
        return None, [{"type": "missing", "loc": ("body",), "msg": "Field required"}]
    try:
        return adapter.validate_python(parsed if reads_as_json(content_type) else body, from_attributes=True), []
    except ValidationError as exc:
        return None, [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]


def header_errors(adapter: TypeAdapter[Any], name: str, value: str | None) -> list[dict[str, Any]]:
    """The errors FastAPI reports for header ``name``'s ``value`` under ``adapter`` (a
    route's header parameter), located ``("header", name, ...)``; none when the value is
    valid or the header absent."""
    if value is None:
        return []
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        return [{**e, "loc": ("header", name, *e["loc"])} for e in exc.errors(include_url=False)]
    return []
