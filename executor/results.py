"""Result and state models exchanged with callers of the executor.

State encoding (per public attribute of the environment instance, EnvScaler "state =
public attributes"): ``["j", <JSON value>]`` exact JSON-native value; ``["p", <base64>]``
opaque pickle, decoded only inside a sandbox; ``["u", <repr>]`` not serializable (not
restorable; the attribute keeps what instantiation produced).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sandpit.sandbox_images.runner.protocol import ProtocolViolation

Status = Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "oom", "crashed", "rejected")
EncodedValue = list[Any]


def check_encoded(mapping: object, what: str) -> dict[str, EncodedValue]:
    """Validate an encoded-state mapping received from a sandbox (nothing it sends is
    trusted). Raises :class:`ProtocolViolation` on any malformed entry."""
    if not isinstance(mapping, dict):
        raise ProtocolViolation(f"{what} is not an object")
    for key, entry in mapping.items():
        if (not isinstance(entry, list) or len(entry) != 2 or entry[0] not in ("j", "p", "u")
                or (entry[0] != "j" and not isinstance(entry[1], str))):
            raise ProtocolViolation(f"{what}: malformed entry for attribute {key!r}")
    return mapping


class StateDelta(BaseModel):
    """Attributes a call changed (``set``, encoded) and removed (``deleted``)."""

    model_config = ConfigDict(extra="forbid")

    set: dict[str, EncodedValue] = Field(default_factory=dict)
    deleted: list[str] = Field(default_factory=list)


class Snapshot(BaseModel):
    """Everything needed to put a session back into a state: the encoded attributes.

    JSON-serializable; opaque entries are base64 pickles that only a sandbox decodes.
    """

    model_config = ConfigDict(extra="forbid")

    attributes: dict[str, EncodedValue]


class CallResult(BaseModel):
    """Outcome of one tool call (EnvScaler step semantics).

    A tool that raises, times out or exhausts memory is a result, not an exception.
    """

    model_config = ConfigDict(extra="forbid")

    status: Status
    """ok | error (tool raised) | timeout | oom | crashed | rejected (bad name/arguments)."""
    observation: str
    """``str(result)``, or ``"Error: <Type>: <message>"``; capped by the profile."""
    duration_ms: float
    """Host-measured round trip of the call, milliseconds."""
    tool_ms: float | None = None
    """Time spent inside the tool itself (measured in the session process), milliseconds."""
    stdout: str = ""
    """What the tool printed during this call, capped at ``output_cap_bytes``."""
    stderr: str = ""
    traceback: str | None = None
    """Bounded traceback (last frames, at most 4 KiB) when the tool raised."""
    observation_truncated: bool = False
    delta: StateDelta = Field(default_factory=StateDelta)
    """Encoded state changes; empty unless status is ok or error."""
    recovered: bool = False
    """True when the session was re-created from its last snapshot before this call
    (its sandbox had died or been evicted)."""
