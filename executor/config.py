"""Which backend runs sandboxes, as typed data: one config class per backend, each with a
``type`` discriminator and a ``build`` that imports its backend only when called (the
local backend never imports Ray; nothing imports Docker until a Docker pool is built).

::

    LocalConfig  type="local"  a SandboxPool over a DockerDriver in this process (default)
    RayConfig    type="ray"    a RayExecutor over the Ray cluster's sandbox hosts

:data:`ExecutorConfig` is their discriminated union, what data (JSON, a settings dict)
validates into; :func:`configured` gives the one the environment chooses
(:class:`~sandpit.executor.settings.BackendSettings`: ``SANDPIT_EXECUTOR_BACKEND``,
``SANDPIT_RAY_ADDRESS``, ``SANDPIT_RAY_DIRECT_CALLS``); :func:`get_executor` builds and
starts an executor from any :class:`BackendConfig`. The composition root (the API's app
factory) calls it once, handing in what only it has (the database's :class:`Affinity`).

A new backend is one driver (or one executor) in its own folder plus one config class here
in the union, with a ``type`` of its own and a ``build`` that imports it lazily; nothing in
the API changes (``docs/kubernetes.md``).
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .interface import Affinity, Executor
from .settings import BackendSettings, ExecutorSettings, ImageSettings, get_backend_settings


class BackendConfig(Protocol):
    """What :func:`get_executor` needs of a backend's config."""

    @property
    def type(self) -> str:
        """The backend's name (``local``, ``ray``, ...)."""
        ...

    def build(self, settings: ExecutorSettings | None = None, *, image_settings: ImageSettings | None = None,
              affinity: Affinity | None = None) -> Executor:
        """A started executor of this backend; see :func:`get_executor`."""
        ...


class LocalConfig(BaseModel):
    """Sandboxes in containers of this machine's Docker Engine, placed by a pool in this
    process (the default; no Ray, no shared database needed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["local"] = "local"

    def build(self, settings: ExecutorSettings | None = None, *, image_settings: ImageSettings | None = None,
              affinity: Affinity | None = None) -> Executor:
        """A started :class:`~sandpit.executor.pool.SandboxPool` over a
        :class:`~sandpit.executor.docker.DockerDriver` (``affinity`` is not used: one
        process holds every session).

        Raises:
            DockerUnavailable: the engine is unreachable or its runtime is not registered
                as Sandpit needs it. ImageError: the sandbox image is not built.
        """
        from .docker import docker_pool

        return docker_pool(settings, image_settings).start()


class RayConfig(BaseModel):
    """Sandboxes on the Ray cluster's nodes that offer the ``sandpit_docker`` resource, one
    host actor per node (``executor/ray``); needs the ``ray`` extra and, for several API
    replicas, a shared database holding the :class:`Affinity`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["ray"] = "ray"
    address: str | None = None
    """Ray cluster address (``ray.init(address=...)``); None or empty: ``auto``, the cluster
    this machine's ``ray start`` joined."""
    direct_calls: bool = True
    """Send session requests (tool calls, restores, state reads) to the hosts over direct
    TCP links (``executor/ray/link.py``); False sends everything through Ray."""

    def build(self, settings: ExecutorSettings | None = None, *, image_settings: ImageSettings | None = None,
              affinity: Affinity | None = None) -> Executor:
        """A started :class:`~sandpit.executor.ray.RayExecutor`; env -> host placements and
        drains go to ``affinity`` (an in-process one when None).

        Raises:
            DockerUnavailable: Ray is not installed or not reachable, or no node offers
                ``sandpit_docker``.
        """
        from .ray import RayExecutor

        return RayExecutor(self.address, settings, image_settings, affinity=affinity,
                           direct=self.direct_calls).start()


ExecutorConfig = Annotated[LocalConfig | RayConfig, Field(discriminator="type")]
"""Every backend's config, told apart by ``type``."""
EXECUTOR_CONFIG: TypeAdapter[LocalConfig | RayConfig] = TypeAdapter(ExecutorConfig)
"""Validates data (``{"type": "ray", "address": ...}``) into an :data:`ExecutorConfig`;
raises pydantic's ValidationError naming the field for anything else."""


def configured(settings: BackendSettings | None = None) -> LocalConfig | RayConfig:
    """The config the settings choose (default: the environment's,
    :func:`~sandpit.executor.settings.get_backend_settings`). Raises pydantic's
    ValidationError when they name no backend or give it a bad option."""
    return EXECUTOR_CONFIG.validate_python((settings or get_backend_settings()).config_data())


def get_executor(config: BackendConfig | None = None, settings: ExecutorSettings | None = None, *,
                 image_settings: ImageSettings | None = None, affinity: Affinity | None = None) -> Executor:
    """Build and start the executor of ``config`` (default: :func:`configured`) with
    ``settings`` (default: this process's ``SANDPIT_EXECUTOR_*``); ``affinity`` is where a
    multi-host backend records env -> host placements and drains. The caller closes it.

    Raises:
        DockerUnavailable, ImageError (or another ExecutorError): the backend cannot start.
    """
    return (config or configured()).build(settings, image_settings=image_settings, affinity=affinity)
