"""Executor errors across the Ray hop (an actor call or a host link): what crosses is plain
data, ``{"type", "message", ...fields}``, and it comes back as the same class with its
fields (:func:`error_data`, :func:`raise_error`). A type this side does not know, or a
hostile one, is a plain :class:`~sandpit.executor.errors.ExecutorError` naming it: nothing
received is ever looked up as a class by name. Host methods answer ``{"ok": value}`` or
``{"error": data}`` (:func:`guard`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import (
    ArgumentError,
    CapacityError,
    DockerUnavailable,
    ExecutorError,
    HostDraining,
    ImageError,
    ProfileError,
    SandboxLost,
    SandboxStartError,
    SessionClosed,
    SessionError,
    SessionLost,
    SessionOpenError,
    ToolSchemaError,
)


def error_data(exc: BaseException) -> dict[str, Any]:
    """An executor error (or another ValueError, sent as an ArgumentError) as plain data
    for :func:`raise_error`."""
    kind = type(exc).__name__ if isinstance(exc, ExecutorError) else "ArgumentError"
    data: dict[str, Any] = {"type": kind, "message": str(exc)}
    for attr in ("retry_after_s", "sandbox_id", "status", "observation", "traceback", "logs"):
        if hasattr(exc, attr):
            data[attr] = getattr(exc, attr)
    return data


def raise_error(data: dict[str, Any]) -> None:
    """Re-raise what :func:`error_data` described, as the same class."""
    kind, message = data["type"], data["message"]
    if kind in ("SessionOpenError", "ToolSchemaError"):
        cls = ToolSchemaError if kind == "ToolSchemaError" else SessionOpenError
        raise cls(data["status"], data["observation"], data.get("traceback"))
    if kind == "CapacityError":
        raise CapacityError(message, retry_after_s=float(data.get("retry_after_s", 1.0)))
    if kind == "SandboxLost":
        raise SandboxLost(message, data.get("sandbox_id", ""), data.get("status", "crashed"))
    if kind == "HostDraining":
        raise HostDraining(message)
    if kind == "SandboxStartError":
        raise SandboxStartError(message, data.get("sandbox_id", ""), data.get("logs", ""))
    simple: dict[str, type[Exception]] = {
        "ProfileError": ProfileError, "SessionClosed": SessionClosed, "SessionLost": SessionLost,
        "SessionError": SessionError,
        "DockerUnavailable": DockerUnavailable, "ImageError": ImageError, "ArgumentError": ArgumentError,
        "ValueError": ArgumentError}
    raise simple.get(kind, ExecutorError)(message if kind in simple else f"{kind}: {message}")


def guard(fn: Callable[[], Any]) -> dict[str, Any]:
    """``{"ok": fn()}``, or ``{"error": ...}`` for an executor error or a ValueError (a bad
    argument, pydantic's validation included); anything else is a bug and propagates."""
    try:
        return {"ok": fn()}
    except (ExecutorError, ValueError) as exc:
        return {"error": error_data(exc)}
