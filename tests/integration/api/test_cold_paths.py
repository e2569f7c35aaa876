"""Cold paths over real HTTP (issue 14): an ``init_config`` is stored once however many
envs use it (and a config that differs by one value is stored apart), ``GET /state``
served from pre-rendered bytes says exactly what the uncached renderings say (the step's
``include=state``, ``?step=k`` from the database, after a restart) across steps, reset,
restore and fork, and hostile create bodies get the same 4xx as before."""

from __future__ import annotations

import json
import sqlite3
import time

import httpx
import pytest

pytestmark = pytest.mark.docker


def _config(records: int = 3000, marker: int = 0) -> dict:
    """A ~0.5 MB Counter config (``records`` of padded values)."""
    return {"count": 1, "records": {f"r{i:05d}": {"value": f"v{i}", "pad": "p" * 120, "marker": marker if i == 7 else 0}
                                    for i in range(records)}}


def _configs_stored(db_path) -> list[tuple[str, int]]:
    with sqlite3.connect(db_path) as conn:
        return conn.execute("SELECT hash, size FROM init_configs ORDER BY hash").fetchall()


def _create(api: httpx.Client, environment_id: str, config: dict) -> dict:
    response = api.post("/v1/envs", content=json.dumps({"environment_id": environment_id, "init_config": config}),
                        headers={"Content-Type": "application/json"})
    assert response.status_code == 201, response.text
    return response.json()


def _step(api: httpx.Client, env_id: str, name: str, **arguments) -> dict:
    response = api.post(f"/v1/envs/{env_id}/step", json={"name": name, "arguments": arguments},
                        params={"include": "state"})
    assert response.status_code == 200, response.text
    return response.json()


def _state(api: httpx.Client, env_id: str, **params) -> dict:
    response = api.get(f"/v1/envs/{env_id}/state", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_same_config_is_stored_once_and_a_changed_one_apart(server, api: httpx.Client,
                                                                 counter_env_id: str) -> None:
    before = _configs_stored(server.db_path)
    config = _config()
    first = _create(api, counter_env_id, config)
    second = _create(api, counter_env_id, config)
    assert first["init_config"] == config == second["init_config"]  # still echoed as given
    added = [row for row in _configs_stored(server.db_path) if row not in before]
    assert len(added) == 1 and added[0][1] == len(json.dumps(config, separators=(",", ":")))
    with sqlite3.connect(server.db_path) as conn:  # the env rows point at it; they hold no copy
        rows = conn.execute("SELECT init_config, init_config_hash FROM envs WHERE id IN (?, ?)",
                            (first["id"], second["id"])).fetchall()
    assert [(json.loads(c), h) for c, h in rows] == [({}, added[0][0])] * 2

    changed = _create(api, counter_env_id, _config(marker=1))  # one value differs
    assert changed["init_config"]["records"]["r00007"]["marker"] == 1
    assert len([row for row in _configs_stored(server.db_path) if row not in before]) == 2

    forks = api.post(f"/v1/envs/{first['id']}/fork", json={"count": 2}).json()["data"]
    assert [api.get(f"/v1/envs/{f['id']}").json()["init_config"] for f in forks] == [config, config]
    reset = api.post(f"/v1/envs/{second['id']}/reset").json()  # the current config, again
    assert reset["init_config"] == config and reset["episode"] == 2
    assert len([row for row in _configs_stored(server.db_path) if row not in before]) == 2
    assert _state(api, forks[0]["id"])["state"]["records"] == config["records"]  # restored from the stored config

    for env in (first, second, changed, *forks):
        assert api.delete(f"/v1/envs/{env['id']}").status_code == 204


def test_state_reads_match_the_uncached_renderings(server, api: httpx.Client, counter_env_id: str) -> None:
    config = _config(records=400)
    env_id = _create(api, counter_env_id, config)["id"]
    zero = _state(api, env_id)
    assert zero == _state(api, env_id) == _state(api, env_id, step=0)  # miss, hit, database
    assert (zero["step"], zero["episode"], zero["truncated"]) == (0, 1, False)
    assert zero["state"] == {"count": 1, "records": config["records"], "log": []}

    seen = {0: zero["state"]}
    for k, (name, arguments) in enumerate([("bump", {"by": 2}), ("set_record", {"key": "r00003", "value": "new"}),
                                           ("bump", {"by": 2**70}), ("fail", {"message": "x"})], start=1):
        step = _step(api, env_id, name, **arguments)
        head = _state(api, env_id)
        assert head["step"] == k and head["state"] == step["state"] == _state(api, env_id)["state"]
        seen[k] = head["state"]
    assert seen[3]["count"] == 3 + 2**70  # beyond 64 bits: rendered by Python's json, exactly
    for k, state in seen.items():
        assert _state(api, env_id, step=k)["state"] == state

    assert api.post(f"/v1/envs/{env_id}/restore", json={"step": 1}).status_code == 200
    assert _state(api, env_id) == {**_state(api, env_id, step=1), "step": 1} and _state(api, env_id)["state"] == seen[1]
    fork = api.post(f"/v1/envs/{env_id}/fork", json={"count": 1}).json()["data"][0]["id"]
    assert _state(api, fork)["state"] == seen[1] and _state(api, fork)["env_id"] == fork

    reset = api.post(f"/v1/envs/{env_id}/reset", json={"init_config": {"count": 9}})
    assert reset.status_code == 200, reset.text
    assert _state(api, env_id)["state"] == {"count": 9, "records": {}, "log": []}
    assert _state(api, env_id, episode=1)["state"] == seen[1]
    assert _state(api, env_id, episode=1, step=0)["state"] == seen[0]
    assert api.get(f"/v1/envs/{env_id}/state", params={"step": 5}).status_code == 409
    assert api.get(f"/v1/envs/{env_id}/state", params={"episode": 1, "step": 9}).status_code == 404
    assert api.get(f"/v1/envs/{env_id}/state", params={"episode": 7}).status_code == 404

    other = server.new_tenant("cold-other")
    with server.client(other) as stranger:  # another tenant's env: 404, live or not
        assert stranger.get(f"/v1/envs/{env_id}/state").status_code == 404
        assert stranger.get(f"/v1/envs/{env_id}/state", params={"step": 0}).status_code == 404
    assert api.get("/v1/envs/env_unknown/state").status_code == 404

    head = _state(api, env_id)
    server.stop()  # a restart: nothing live, every read from the database
    server.start()
    with server.client() as fresh:
        assert fresh.get(f"/v1/envs/{env_id}/state").json() == head
        assert fresh.get(f"/v1/envs/{fork}/state").json()["state"] == seen[1]
        assert fresh.get(f"/v1/envs/{env_id}/state", params={"episode": 1, "step": 1}).json()["state"] == seen[1]
        assert fresh.get(f"/v1/envs/{env_id}").json()["init_config"] == {"count": 9}


def test_hostile_create_bodies_get_the_same_4xx(api: httpx.Client, counter_env_id: str) -> None:
    big = _config(records=20000)  # ~3 MB
    deep: object = "x"
    for _ in range(70):
        deep = [deep]
    body = {"environment_id": counter_env_id, "init_config": {**big, "deep": deep}}
    lone = json.dumps({"environment_id": counter_env_id, "init_config": {**big, "name": "\ud800"}})
    for _ in range(2):  # large bodies that failed are never remembered as parsed
        response = api.post("/v1/envs", content=json.dumps(body), headers={"Content-Type": "application/json"})
        assert response.status_code == 422 and "nested deeper than 64" in response.json()["error"]["message"]
        response = api.post("/v1/envs", content=lone, headers={"Content-Type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == "init_config.name"

    # the same large body again is parsed once and echoed as given, in key order; a
    # body differing in one byte is a body of its own
    good = json.dumps({"environment_id": counter_env_id, "init_config": {**big, "name": "é\u00e9"}})
    replies = [api.post("/v1/envs", content=good, headers={"Content-Type": "application/json"}) for _ in range(2)]
    replies.append(api.post("/v1/envs", content=good.replace('"count": 1', '"count": 2'),
                            headers={"Content-Type": "application/json"}))
    assert [r.status_code for r in replies] == [201, 201, 201], replies[-1].text
    echoed = [r.json() for r in replies]
    assert echoed[0]["init_config"] == echoed[1]["init_config"] == {**big, "name": "éé"}
    assert list(echoed[1]["init_config"]) == list(big) + ["name"]
    assert echoed[2]["init_config"] == {**big, "name": "éé", "count": 2}
    for reply in echoed:  # the spliced reply says what GET says
        fetched = api.get(f"/v1/envs/{reply['id']}").json()
        assert list(reply) == list(fetched)
        assert reply["construction"]["path"] in ("template", "constructed") and fetched["construction"] is None
        create_only = ("status", "construction")  # how the instance was made: said by the create alone
        assert {k: v for k, v in reply.items() if k not in create_only} == \
            {k: v for k, v in fetched.items() if k not in create_only}
        assert api.delete(f"/v1/envs/{reply['id']}").status_code == 204

    for config in ([1, 2], "text", 3, None):
        response = api.post("/v1/envs", json={"environment_id": counter_env_id, "init_config": config})
        if config is None:  # no config: the environment's defaults
            assert response.status_code == 201
            api.delete(f"/v1/envs/{response.json()['id']}")
        else:
            assert response.status_code == 422, response.text
            assert response.json()["error"]["field"].startswith("init_config")

    nan = b'{"environment_id": "%s", "init_config": {"a": NaN}}' % counter_env_id.encode()
    response = api.post("/v1/envs", content=nan, headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and "finite" in response.json()["error"]["message"]
    huge = json.dumps({"environment_id": counter_env_id, "init_config": {"n": 2**80}})
    response = api.post("/v1/envs", content=huge, headers={"Content-Type": "application/json"})
    assert response.status_code == 201 and response.json()["init_config"] == {"n": 2**80}
    api.delete(f"/v1/envs/{response.json()['id']}")


def test_repeated_creates_of_one_config_start_equal_and_stay_apart(make_server, counter_source: str) -> None:
    """Shared sandboxes (config templates on): envs of one config share the stored initial
    state (one root, content-addressed) but never each other's changes; the blobs survive
    a collection that ran after the first env was deleted; configs that differ only in
    ``1``/``1.0``/``true`` or key order are different envs."""
    server = make_server(SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX="8", SANDPIT_EXECUTOR_POOL_SIZE="1",
                         SANDPIT_JANITOR_INTERVAL_S="0.2")
    with server.client() as api:
        response = api.post("/v1/environments", json={"source_code": counter_source, "class_name": "Counter"})
        assert response.status_code == 201, response.text
        environment_id = response.json()["id"]
        config = _config(records=400)
        envs = [_create(api, environment_id, config) for _ in range(5)]  # the later ones fork from a template
        roots = set()
        with sqlite3.connect(server.db_path) as conn:
            for env in envs:
                roots.add(conn.execute("SELECT state_root FROM steps WHERE env_id = ? AND step = 0",
                                       (env["id"],)).fetchone()[0])
        assert len(roots) == 1
        states = [_state(api, env["id"])["state"] for env in envs]
        assert all(state == states[0] for state in states) and states[0]["records"] == config["records"]

        _step(api, envs[3]["id"], "set_record", key="r00001", value="changed")
        _step(api, envs[3]["id"], "bump", by=5)
        assert _state(api, envs[4]["id"])["state"] == states[0]
        assert _state(api, envs[3]["id"])["state"]["records"]["r00001"]["value"] == "changed"
        assert api.get(f"/v1/envs/{envs[3]['id']}/state", params={"step": 0}).json()["state"] == states[0]

        for env in envs:  # every env gone: a collection may delete the shared blobs
            assert api.delete(f"/v1/envs/{env['id']}").status_code == 204
        root = roots.pop()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the janitor collects the now unreferenced blobs
            with sqlite3.connect(server.db_path) as conn:
                if conn.execute("SELECT count(*) FROM blobs WHERE hash = ?", (root,)).fetchone()[0] == 0:
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("the janitor never collected the shared initial state")
        again = _create(api, environment_id, config)
        assert _state(api, again["id"])["state"] == states[0]
        assert api.get(f"/v1/envs/{again['id']}/state", params={"step": 0}).json()["state"] == states[0]

        variants = [{"count": 1, "flag": 1}, {"count": 1, "flag": 1.0}, {"count": 1, "flag": True},
                    {"flag": 1, "count": 1}]
        for _ in range(2):  # the second round may fork from config templates
            for variant in variants:
                env = _create(api, environment_id, variant)
                state = json.loads(api.get(f"/v1/envs/{env['id']}/state").content)["state"]
                assert type(state["flag"]) is type(variant["flag"]) and state["flag"] == variant["flag"]
                assert env["init_config"] == variant and list(env["init_config"]) == list(variant)
