"""Issue 12 ("no 5xx under fuzzing"), the cases a schemathesis run found, on a real
server: profile values the executor refuses, the documented error statuses, ``/metrics``
as text, stalled and abandoned request bodies."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.docker


def _field_error(response: httpx.Response) -> str:
    assert response.status_code == 422, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["message"], error
    return error["field"]


@pytest.mark.parametrize("memory", [0, 16, 24, 31])
def test_memory_below_the_executor_floor_is_422_on_every_route(api: httpx.Client, counter_env_id: str,
                                                               memory: int) -> None:
    """16..31 MiB passed validation and made the executor raise (500)."""
    assert _field_error(api.post("/v1/envs", json={"environment_id": counter_env_id,
                                                   "profile": {"memory_mib": memory}})) == "profile.memory_mib"
    assert _field_error(api.post("/v1/execute", json={"code": "print(1)", "memory_mb": memory})) == "memory_mb"
    assert _field_error(api.post("/v1/execute/batch", json={"snippets": [{"code": "print(1)", "memory_mb": memory}]})
                        ) == "snippets.0.memory_mb"


def test_profile_values_at_the_executor_bounds_are_never_5xx(api: httpx.Client, counter_env_id: str) -> None:
    """Accepted by validation means accepted by the executor: the lowest memory runs, the
    highest is refused by the configured profile (422), not by a crash."""
    low = api.post("/v1/execute", json={"code": "print(1)", "memory_mb": 32, "timeout_s": 5})
    assert low.status_code == 200, low.text
    for body in ({"code": "print(1)", "memory_mb": 65536}, {"code": "print(1)", "timeout_s": 3600},
                 {"code": "print(1)", "timeout_s": 1e-300}):
        response = api.post("/v1/execute", json=body)
        assert response.status_code < 500, (body, response.status_code, response.text)
    for profile in ({"memory_mib": 65536}, {"cpus": 64}, {"call_timeout_s": 3600}):
        response = api.post("/v1/envs", json={"environment_id": counter_env_id, "profile": profile})
        assert response.status_code in (422, 429), (profile, response.status_code, response.text)
