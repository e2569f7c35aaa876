"""``engine.check_runtime``: a pool refuses a runtime the engine registers without what
Sandpit's isolation needs (runsc without ``--oci-seccomp``). The engine's answer to
``GET /info`` is given as data here; ``tests/integration/executor/test_gvisor_confine.py``
checks the real engine's registration."""

from __future__ import annotations

from typing import Any

import pytest
from sandpit.executor.docker import engine
from sandpit.executor.errors import DockerUnavailable


class _Info:
    """Stands in for ``docker.DockerClient`` where only ``info()`` is read."""

    def __init__(self, runtimes: dict[str, Any]) -> None:
        self.runtimes = runtimes

    def info(self) -> dict[str, Any]:
        return {"Runtimes": self.runtimes}


RUNC = {"runc": {"path": "runc"}}


@pytest.mark.parametrize("args", [
    ["--network=none", "--host-uds=open", "--oci-seccomp"],
    ["-oci-seccomp"],
    ["--oci-seccomp=true", "--network=none"],
])
def test_runsc_with_oci_seccomp_is_accepted(args: list[str]) -> None:
    engine.check_runtime(_Info({**RUNC, "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": args}}), "runsc")  # type: ignore[arg-type]


@pytest.mark.parametrize("registered", [
    {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"]},  # the old registration
    {"path": "/usr/bin/runsc"},
    {"path": "/usr/bin/runsc", "runtimeArgs": ["--oci-seccomp=false"]},
    {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none --oci-seccomp"]},  # one word, not a flag
])
def test_runsc_without_oci_seccomp_is_refused(registered: dict[str, Any]) -> None:
    with pytest.raises(DockerUnavailable, match="without --oci-seccomp.*scripts/ensure-docker"):
        engine.check_runtime(_Info({**RUNC, "runsc": registered}), "runsc")  # type: ignore[arg-type]


@pytest.mark.parametrize("runtimes", [RUNC, {**RUNC, "runsc": "not a mapping"}, {}])
def test_runsc_missing_is_refused(runtimes: dict[str, Any]) -> None:
    with pytest.raises(DockerUnavailable, match="no runtime 'runsc'"):
        engine.check_runtime(_Info(runtimes), "runsc")  # type: ignore[arg-type]


def test_runc_needs_no_registration() -> None:
    engine.check_runtime(_Info({}), "runc")  # type: ignore[arg-type]
