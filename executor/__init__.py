"""Sandpit's executor: where untrusted environment code runs. This package face is what the
API (and any other host program) imports; it names the contract, never a backend::

    interface   Executor, ExecutorSession (every backend); Cluster (several sandbox hosts:
                drains, per-host info), KeyedSessions (sessions keyed by the caller that
                outlive this process), Affinity (where a multi-host backend records which
                host an env is on); all runtime_checkable: callers use isinstance
    errors      the documented exception tree (ExecutorError and below)
    results     what calls return (CallResult, CheckResult, ExecResult, Snapshot, ...)
    recovering  RecoveringSession: a session that keeps its state and re-opens after a
                lost sandbox, for code that uses the executor on its own
    profiles    resource profiles (ResourceProfile, ProfileOverrides)
    settings    ExecutorSettings (SANDPIT_EXECUTOR_*), BackendSettings (which backend)
    config      LocalConfig | RayConfig, configured(), get_executor(config)

Backends live in folders the face never imports at import time: ``pool/`` (placement over a
driver, backend-neutral), ``docker/`` (the Docker driver), ``ray/`` (the Ray backend).
``fake`` is a scripted in-memory executor for tests of code above the executor.
``tests/unit/executor/test_import_rules.py`` holds these boundaries.
"""

from .config import (
    EXECUTOR_CONFIG,
    BackendConfig,
    ExecutorConfig,
    LocalConfig,
    RayConfig,
    configured,
    get_executor,
)
from .errors import (
    ArgumentError,
    CapacityError,
    DockerUnavailable,
    ExecutorError,
    HostDraining,
    ImageError,
    LinkRefused,
    ProfileError,
    SandboxLost,
    SandboxStartError,
    SessionClosed,
    SessionError,
    SessionLost,
    SessionOpenError,
    ToolSchemaError,
)
from .interface import Affinity, Cluster, Executor, ExecutorSession, HostInfo, KeyedSessions
from .pool.configs import SharedConfig
from .pool.grouped import call_many, start_call
from .pool.jobs import PreparedState, encode_json_state, prepare_state
from .pool.session import StartedCall
from .profiles import ProfileOverrides, ResourceProfile, resolve_profile
from .recovering import RecoveringSession
from .results import (
    CallResult,
    CallRules,
    CheckResult,
    Construction,
    ExecResult,
    OpenedState,
    Snapshot,
    StateDelta,
    is_truncated,
    render_entry,
)
from .settings import (
    BackendName,
    BackendSettings,
    ExecutorSettings,
    ImageSettings,
    get_backend_settings,
    get_image_settings,
    get_settings,
)

__all__ = [
    "EXECUTOR_CONFIG", "Affinity", "ArgumentError", "BackendConfig", "BackendName", "BackendSettings", "CallResult", "CallRules",
    "CapacityError", "CheckResult", "Cluster", "Construction", "DockerUnavailable", "ExecResult", "Executor", "ExecutorConfig",
    "ExecutorError", "ExecutorSession", "ExecutorSettings", "HostDraining", "HostInfo", "ImageError",
    "ImageSettings", "KeyedSessions", "LinkRefused", "LocalConfig", "OpenedState", "PreparedState", "ProfileError", "ProfileOverrides",
    "RayConfig", "RecoveringSession", "call_many", "start_call", "StartedCall", "ResourceProfile", "SandboxLost", "SandboxStartError", "SessionClosed", "SessionError",
    "SessionLost", "SessionOpenError", "SharedConfig", "Snapshot", "StateDelta", "ToolSchemaError", "configured", "encode_json_state", "prepare_state",
    "get_backend_settings", "get_executor", "get_image_settings", "get_settings", "is_truncated", "render_entry",
    "resolve_profile",
]
