"""The Docker backend: sandboxes as hardened containers on a Docker Engine, placed by a
:class:`~sandpit.executor.pool.SandboxPool` over :class:`DockerDriver`. The only package
that imports the Docker SDK (``docker``): the engine edge (:mod:`.engine`), the image build
(:mod:`.images`), one sandbox (:mod:`.sandbox`), the driver (:mod:`.driver`), owner leases
(:mod:`.owners`) and the gVisor seccomp profile (:mod:`.seccomp`).
"""

from __future__ import annotations

import docker

from ..pool import SandboxPool
from ..settings import ExecutorSettings, ImageSettings, get_settings
from .driver import DockerDriver

__all__ = ["DockerDriver", "docker_pool"]


def docker_pool(settings: ExecutorSettings | None = None, image_settings: ImageSettings | None = None,
                client: docker.DockerClient | None = None) -> SandboxPool:
    """A :class:`SandboxPool` over a :class:`DockerDriver`, both with ``settings`` (default:
    this process's ``SANDPIT_EXECUTOR_*``); not started (``start()``, or use it as a
    context manager). ``client``: a Docker client to use instead of connecting."""
    settings = settings or get_settings()
    return SandboxPool(DockerDriver(settings, image_settings, client), settings)
