"""`EnvHandle.resume` on a real server: the resumed handle steps, a handle of the
previous attempt gets `Conflict` (`stale_attempt`) and changes nothing, and a handle
that never resumed is not fenced."""

from __future__ import annotations

import pytest
from api_server import COUNTER_SOURCE
from sandpit.client import Client, Conflict

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one


def test_resume_fences_the_previous_attempts_handle(server) -> None:
    with Client(server.url, api_key=server.api_key, timeout=30) as client:
        env = client.envs.create(source_code=COUNTER_SOURCE, class_name="Counter")
        first = env.resume()
        stale = client.envs.get(env.id, attempt=first.token)  # the previous attempt's worker
        assert stale.step("bump", by=1).observation == "1"
        second = env.resume()
        assert (second.attempt, second.env_id) == (first.attempt + 1, env.id) and env.attempt == second.token
        for call in (lambda: stale.step("bump", by=1), lambda: stale.reset(), lambda: stale.restore(0),
                     stale.delete):
            with pytest.raises(Conflict) as refused:
                call()
            assert refused.value.code == "stale_attempt"
        assert env.state()["count"] == 1
        assert env.step("bump", by=1).observation == "2"
        unfenced = client.envs.get(env.id)
        assert unfenced.attempt is None and unfenced.step("bump", by=1).observation == "3"
        env.delete()
