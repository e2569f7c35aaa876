"""The client's idempotent retries on a real server: a step whose answer is lost (the
client's read timeout is shorter than the tool) is resent with the same
``Idempotency-Key`` and runs once; the retry waits out 409 ``idempotency_key_in_flight``
and gets the first step's result."""

from __future__ import annotations

import pytest
from sandpit.client import Client

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

SLOW_SOURCE = '''
import time


class Slow:
    """A counter whose bump takes a while."""

    def __init__(self, init_config):
        self.count = 0

    def bump(self, seconds: float = 1.5) -> int:
        """Add one after sleeping `seconds`."""
        time.sleep(seconds)
        self.count += 1
        return self.count
'''


def test_a_step_whose_answer_is_lost_runs_once(server) -> None:
    with Client(server.url, api_key=server.api_key, timeout=0.6, max_retry_wait_s=30) as client:
        env = client.envs.create(source_code=SLOW_SOURCE, class_name="Slow")
        result = env.step("bump", seconds=1.5)
        assert (result.status, result.observation, result.step) == ("ok", "1", 1)
        assert env.state()["count"] == 1  # the tool ran once, though the client sent the step more than once
        assert len(env.trajectory().steps) == 1
        env.delete()
