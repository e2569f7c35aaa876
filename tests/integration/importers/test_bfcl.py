"""The BFCL importer against the real server: episodes replayed through the API end in the
same states as stepping the class directly in a sandbox; scenarios made from them reward
the ground truth and notice a wrong trajectory; `check_policy` judges BFCL's modules
through `/v1/validate`."""

from __future__ import annotations

import contextlib
import os

import pytest
from sandpit.client import Client, InvalidRequest, SandpitError
from sandpit.executor.docker import docker_pool
from sandpit.executor.settings import ExecutorSettings
from sandpit.importers import bfcl
from sandpit.importers.bfcl.replay import register_environments, replay_episode

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one


@pytest.fixture(scope="module")
def suite() -> bfcl.BfclSuite:
    wheel = bfcl.cached_wheel()
    if wheel is None:
        if os.environ.get("SANDPIT_REQUIRE_DOCKER"):
            pytest.fail("bfcl-eval wheel not cached: run scripts/setup")
        pytest.skip("bfcl-eval wheel not cached: run scripts/setup")
    return bfcl.load_suite(wheel)


@pytest.mark.slow
def test_bfcl_replay_through_the_api_matches_stepping_in_a_sandbox(server, suite: bfcl.BfclSuite) -> None:
    from sandpit.importers.bfcl.scenarios import plain

    sample = []
    seen: set[str] = set()
    for episode in suite.episodes:  # one episode per environment combination, 8 in all
        if episode.environment_name not in seen and len(sample) < 8:
            seen.add(episode.environment_name)
            sample.append(episode)
    with Client(server.url, api_key=server.api_key, timeout=120) as client:
        ids = register_environments(client, suite)
        assert register_environments(client, suite) == ids  # idempotent
        replays = [replay_episode(client, ep, ids[ep.environment_name], want_state=True) for ep in sample]
    with docker_pool(ExecutorSettings(pool_size=0)) as pool:
        for episode, replay in zip(sample, replays, strict=True):
            assert replay.error is None and replay.statuses.get("ok", 0) == replay.steps > 0, replay
            environment = suite.environments[episode.environment_name]
            session = pool.open_session(tenant="direct", source=environment.source_code,
                                        class_name=environment.class_name, init_config=episode.init_config)
            try:
                for turn in episode.turns:
                    for call in turn:
                        assert session.call(call.name, call.arguments).status == "ok"
                # BFCL's state checker: public attributes (private ones hold timestamps of the run)
                assert plain(session.state()) == plain(replay.final_state), episode.id
            finally:
                session.close()


def test_bfcl_scenarios_reward_the_ground_truth_and_notice_a_wrong_trajectory(server, suite: bfcl.BfclSuite) -> None:
    from sandpit.importers.bfcl.scenarios import make_scenarios, replay_items
    from sandpit.policy import check_source

    with Client(server.url, api_key=server.api_key, timeout=120) as client:
        ids = register_environments(client, suite)
        made = make_scenarios(client, suite, ids, limit=6, concurrency=3)
        assert [m.error for m in made] == [None] * 6
        assert [m.scenario_id for m in make_scenarios(client, suite, ids, limit=6)] == [m.scenario_id for m in made]
        scenario = client.scenarios.get(made[0].scenario_id)
        assert scenario.external_id == suite.episodes[0].id and scenario.task.startswith("Turn 1: ")
        assert all(check_source(c["check_func"], "standard").passed for c in scenario.checklist_with_func)

        def rewards(items: list[dict]) -> list[float]:
            out = []
            for item in items:
                env = client.envs.create(scenario_id=item["scenario_id"])
                for call in item["tool_calls"]:
                    with contextlib.suppress(InvalidRequest):  # a ground-truth call the schema refuses
                        env.step_call(call)
                out.append(env.evaluate().reward)
                env.delete()
            return out

        assert rewards(replay_items(made)) == [1.0] * 6
        assert min(rewards(replay_items(made, drop_last_call=True))) < 1.0  # the checks see the state


def test_check_policy_judges_bfcl_modules_through_the_api(server, suite: bfcl.BfclSuite) -> None:
    from collections import Counter

    from sandpit.importers.bfcl.replay import check_policy
    from sandpit.policy import check_source

    expected: Counter[str] = Counter()
    seen: set[str] = set()
    for environment in suite.environments.values():
        for dotted, source in bfcl.embedded_modules(environment.source_code).items():
            if dotted not in seen:
                seen.add(dotted)
                expected.update(f"{f.rule} ({f.severity})" for f in check_source(source, "standard").findings)
    hostile = bfcl.BfclEnvironment(
        name="bfcl:Hostile", class_name=bfcl.CLASS_NAME, classes=("Hostile",), tool_names=(), signatures={},
        required={}, tool_classes={},
        source_code=f"_install({bfcl.BACKEND_PACKAGE + '.hostile'!r}, 'x = ().__class__.__bases__[0].__subclasses__()')\n")
    with Client(server.url, api_key=server.api_key, timeout=120) as client:
        assert check_policy(client, suite) == dict(expected) and expected  # what the executor's policy says
        with pytest.raises(SandpitError, match=r"hostile fails the standard policy: line 1 dunder"):
            check_policy(client, bfcl.BfclSuite(version=suite.version, environments={"bfcl:Hostile": hostile},
                                                episodes=()))
