"""The web viewer (``/ui``) in a real headless browser: Debian's chromium driven by
Playwright (``executable_path``: no browser download), against a real ``sandpit serve``
with real sandboxes and a scripted OpenAI-compatible model for the evaluation.

One server and one browser for the module. Every page visited is saved as a screenshot
under ``$SANDPIT_ARTIFACTS_DIR/viewer`` (or the pytest tmp directory). Every page also
records console errors and dialogs: a script the viewer let through from an observation
or a state would open a dialog, and CSP violations show as console errors.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import ApiServer
from fake_openai import Rule, ScriptedLLM, ToolCallScript

pytestmark = [pytest.mark.docker, pytest.mark.slow]
playwright_sync = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
HOSTILE = '<script>alert("xss")</script><img src=x onerror=alert(2)><b>bold</b>'
"""Text an LLM-written environment or agent could produce; it must show as text."""
CHECKS = [
    {"check_item": "count is 5 <i>exactly</i>",
     "check_func": "def check_func(final_state):\n    return final_state['count'] == 5\n"},
    {"check_item": "record a stored",
     "check_func": "def check_func(final_state):\n    return 'a' in final_state['records']\n"},
]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("SANDPIT_ARTIFACTS_DIR")
    path = Path(root) / "viewer" if root else tmp_path_factory.mktemp("viewer-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        pytest.skip(f"{CHROMIUM} is not installed (scripts/setup installs it)")
    with playwright_sync.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield launched
        finally:
            launched.close()


class Tab:
    """A browser context (own cookies) with one page that records dialogs and console
    errors, and saves a screenshot of each page it is asked to."""

    def __init__(self, browser: Any, base: str, artifacts: Path) -> None:
        self.context = browser.new_context(base_url=base, viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.base = base
        self.artifacts = artifacts
        self.dialogs: list[str] = []
        self.console_errors: list[str] = []
        self.page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        self.page.on("console", lambda msg: self.console_errors.append(msg.text) if msg.type == "error" else None)

    def goto(self, path: str) -> Any:
        return self.page.goto(self.base + path)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.artifacts / f"{name}.png"), full_page=True)

    def sign_in(self, key: str) -> None:
        self.goto("/ui/signin")
        self.page.fill("#key", key)
        self.page.click("#signin")
        self.page.wait_for_load_state()

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    rules = [Rule(contains=["viewer rollout"], turn=0, tool_calls=[ToolCallScript(name="bump", arguments={"by": 5})],
                  delay_s=0.4),
             Rule(contains=["viewer rollout"], turn=1,
                  tool_calls=[ToolCallScript(name="set_record", arguments={"key": "a", "value": HOSTILE})],
                  delay_s=0.4),
             Rule(contains=["viewer rollout"], turn=2, content="done", delay_s=0.2)]
    with ScriptedLLM(rules) as server:
        yield server


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def step(api: httpx.Client, env_id: str, action: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = ok(api.post(f"/v1/envs/{env_id}/step", json=action))
    return result


@pytest.fixture(scope="module")
def episode(server: ApiServer, counter_env_id: str) -> dict[str, str]:
    """A finished scenario episode with a hostile observation and state value, and a fork
    of it (at step 1) that ended differently."""
    with server.client() as api:
        scenario_id = ok(api.post("/v1/scenarios", json={
            "environment_id": counter_env_id, "task": f"Bump to 5 and store a. {HOSTILE}",
            "init_config": {"count": 0}, "checklist_with_func": CHECKS}), 201)["id"]
        env_id = ok(api.post("/v1/envs", json={"scenario_id": scenario_id}), 201)["id"]
        step(api, env_id, {"name": "bump", "arguments": {"by": 5}})
        step(api, env_id, {"name": "fail", "arguments": {"message": HOSTILE}})
        step(api, env_id, {"name": "set_record", "arguments": {"key": "a", "value": HOSTILE}})
        assert step(api, env_id, {"name": "chat_with_user", "arguments": {"content": "done"}})["reward"] == 1.0
        fork_id = ok(api.post(f"/v1/envs/{env_id}/fork", json={"step": 1}), 201)["data"][0]["id"]
        assert step(api, fork_id, {"name": "chat_with_user", "arguments": {"content": "done"}})["reward"] == 0.5
    return {"env_id": env_id, "fork_id": fork_id, "scenario_id": scenario_id}


@pytest.fixture(scope="module")
def tab(browser: Any, server: ApiServer, artifacts: Path) -> Iterator[Tab]:
    """A signed-in tab of tenant ``default``."""
    signed = Tab(browser, server.url, artifacts)
    signed.sign_in(server.api_key)
    try:
        yield signed
    finally:
        signed.close()


def test_sign_in_page_headers_and_a_bad_key(browser: Any, server: ApiServer, artifacts: Path) -> None:
    fresh = Tab(browser, server.url, artifacts)
    try:
        response = fresh.goto("/ui/episodes")  # not signed in: sent to the sign-in form
        assert fresh.page.url.startswith(f"{server.url}/ui/signin?next=")
        headers = response.headers
        assert "script-src 'self'" in headers["content-security-policy"]
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "same-origin"
        fresh.shot("signin")
        fresh.page.fill("#key", "sp_not-a-key-" + "x" * 30)
        fresh.page.click("#signin")
        assert fresh.page.locator("#error-message").inner_text() == "invalid API key"
        assert "sp_not-a-key" not in fresh.page.content()  # the key is never echoed
        assert not [c for c in fresh.context.cookies() if c["name"] == "sandpit_ui"]
    finally:
        fresh.close()


def test_session_cookie_is_http_only_strict_and_holds_no_key(tab: Tab, server: ApiServer) -> None:
    cookie = next(c for c in tab.context.cookies() if c["name"] == "sandpit_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert server.api_key not in cookie["value"]
    assert server.api_key not in tab.page.content() and server.api_key not in tab.page.url


def test_episode_timeline_escapes_and_expands_a_diff(tab: Tab, episode: dict[str, str]) -> None:
    tab.goto("/ui/episodes")
    assert tab.page.locator(f'a.episode-link[href="/ui/envs/{episode["env_id"]}/episodes/1"]').count() == 1
    tab.shot("episodes")
    tab.goto(f"/ui/envs/{episode['env_id']}/episodes/1")
    assert tab.page.locator("#episode-status").inner_text() == "terminated"
    assert tab.page.locator("#episode-reward").inner_text() == "1"
    assert tab.page.locator("#episode-failure").inner_text() == "environment"  # step 2's tool raised
    assert tab.page.locator("#step-2 .badge.failure").inner_text() == "environment"
    assert tab.page.locator("#step-1 .badge.failure").count() == 0  # no failure, no badge
    checks = tab.page.locator("table.checks tbody tr")
    assert checks.count() == 2 and "count is 5 <i>exactly</i>" in checks.nth(0).inner_text()
    observation = tab.page.locator("#step-2 pre.observation").inner_text()
    assert HOSTILE in observation  # the markup is the text itself
    assert tab.page.locator("main script, main img, main b").count() == 0
    diff = tab.page.locator("#step-3 details.lazy-diff")
    diff.locator("summary").click()
    tab.page.wait_for_selector("#step-3 details.lazy-diff.loaded table.diff")
    row = diff.locator("table.diff tbody tr").first
    assert "records › a" in row.inner_text() and "added" in row.inner_text()
    value = row.locator("details.v").first  # the added record: a small dict, shown expanded
    assert value.get_attribute("open") is not None and HOSTILE in row.inner_text()
    value.locator("summary").first.click()  # collapsed
    assert HOSTILE not in row.inner_text()
    value.locator("summary").first.click()  # and expanded again
    assert HOSTILE in row.inner_text()
    tab.shot("episode")
    tab.goto(f"/ui/envs/{episode['env_id']}/episodes/1/steps/3/state")
    assert tab.page.locator("ul.state > li").count() == 3  # count, records, log
    tab.shot("state")
    assert tab.dialogs == [] and tab.console_errors == []


def test_compare_two_forks(tab: Tab, episode: dict[str, str]) -> None:
    tab.goto(f"/ui/envs/{episode['env_id']}/episodes/1")
    tab.page.locator(f'a.compare-link:has-text("{episode["fork_id"]}")').click()
    tab.page.wait_for_load_state()
    assert "/ui/compare?" in tab.page.url
    sides = tab.page.locator(".sides section")
    assert "reward 1" in sides.nth(0).inner_text() and "reward 0.5" in sides.nth(1).inner_text()
    final = tab.page.locator("#final-diff").inner_text()
    assert "records › a\tremoved" in final  # only the first episode stored record a
    tab.shot("compare")
    tab.page.go_back()  # plain links: the back button returns to the episode
    assert tab.page.url.endswith(f"/ui/envs/{episode['env_id']}/episodes/1")


def test_environment_page(tab: Tab, counter_env_id: str) -> None:
    tab.goto("/ui/environments?q=count")
    tab.page.locator("a.environment-link").first.click()
    tab.page.wait_for_load_state()
    assert tab.page.url.endswith(f"/ui/environments/{counter_env_id}")
    assert tab.page.locator("div.code .k").count() > 0  # highlighted keywords
    assert "set_record" in tab.page.locator("table.tools").inner_text()
    tab.shot("environment")
    assert tab.console_errors == []


def test_evaluation_progress_updates_without_reload(tab: Tab, server: ApiServer, counter_env_id: str,
                                                     llm: ScriptedLLM) -> None:
    with server.client() as api:
        ids = [ok(api.post("/v1/scenarios", json={
            "environment_id": counter_env_id, "task": f"viewer rollout {n}", "init_config": {"count": 0},
            "checklist_with_func": CHECKS}), 201)["id"] for n in range(3)]
        job = ok(api.post("/v1/evaluations", json={
            "mode": "rollout", "scenario_ids": ids, "model": "scripted", "base_url": llm.base_url,
            "api_key": "sk-test", "concurrency": 1, "max_steps": 5}), 201)
    tab.goto(f"/ui/evaluations/{job['id']}")
    section = tab.page.locator("section.progress")
    # the page's script updates the numbers in place (marking each poll); the CSP forbids
    # eval, so the wait is a selector, not a JavaScript predicate
    tab.page.wait_for_selector("section.progress[data-polls]", state="attached", timeout=30_000)
    tab.shot("evaluation-running")
    tab.page.wait_for_selector("#summary", timeout=90_000)  # the page reloaded itself once finished
    assert section.locator('[data-field="done"]').inner_text() == "3"
    assert tab.page.locator("#histogram .count").last.inner_text() == "3"  # three rewards of 1.0
    tab.shot("evaluation")
    tab.page.locator("a.eval-episode-link").first.click()
    tab.page.wait_for_load_state()
    timeline = tab.page.locator("ol.timeline").inner_text()  # the arguments as JSON text
    assert '"value": "<script>alert(\\"xss\\")</script><img src=x onerror=alert(2)><b>bold</b>"' in timeline
    tab.shot("evaluation-episode")
    assert tab.dialogs == [] and tab.console_errors == []


def test_another_tenants_episode_is_404(browser: Any, server: ApiServer, artifacts: Path,
                                        episode: dict[str, str]) -> None:
    other = Tab(browser, server.url, artifacts)
    try:
        other.sign_in(server.new_tenant("viewer-other"))
        response = other.goto(f"/ui/envs/{episode['env_id']}/episodes/1")
        assert response.status == 404 and "not found" in other.page.locator("#error-message").inner_text()
        for path in (f"/ui/envs/{episode['env_id']}/episodes/1/steps/1/state",
                     f"/ui/envs/{episode['env_id']}/episodes/1/steps/1/diff?fragment=true",
                     f"/ui/compare?a={episode['env_id']}&b={episode['fork_id']}"):
            assert other.goto(path).status == 404, path
        other.goto("/ui/episodes")
        assert episode["env_id"] not in other.page.content()
        other.shot("other-tenant-404")
    finally:
        other.close()


def test_a_post_without_the_form_token_is_refused_and_sign_out_ends_the_session(
        browser: Any, server: ApiServer, artifacts: Path) -> None:
    mine = Tab(browser, server.url, artifacts)
    try:
        mine.sign_in(server.api_key)
        forged = mine.page.request.post(f"{server.url}/ui/signout", form={"csrf": "0" * 64})
        assert forged.status == 403
        assert mine.goto("/ui/episodes").status == 200  # still signed in
        token = next(c for c in mine.context.cookies() if c["name"] == "sandpit_ui")["value"]
        mine.page.click("#signout")
        mine.page.wait_for_load_state()
        assert mine.page.url.startswith(f"{server.url}/ui/signin")
        # the old cookie no longer opens anything, even sent by hand
        replay = httpx.get(f"{server.url}/ui/episodes", cookies={"sandpit_ui": token}, follow_redirects=False)
        assert replay.status_code == 303 and replay.headers["location"].startswith("/ui/signin")
    finally:
        mine.close()


def test_a_revoked_key_ends_its_sessions(browser: Any, server: ApiServer, artifacts: Path) -> None:
    created = httpx.post(f"{server.url}/v1/admin/tenants", headers=server.operator_headers, timeout=30,
                         json={"id": "viewer-revoked"}).json()["api_key"]
    mine = Tab(browser, server.url, artifacts)
    try:
        mine.sign_in(created["key"])
        assert mine.goto("/ui/episodes").status == 200
        revoked = httpx.post(f"{server.url}/v1/admin/keys/{created['id']}/revoke", headers=server.operator_headers)
        assert revoked.status_code == 200, revoked.text
        mine.goto("/ui/episodes")
        assert mine.page.url.startswith(f"{server.url}/ui/signin")
    finally:
        mine.close()


def test_the_operator_sees_tenants_read_only(browser: Any, server: ApiServer, artifacts: Path) -> None:
    operator = Tab(browser, server.url, artifacts)
    try:
        operator.sign_in(server.operator_key)
        assert operator.page.url.endswith("/ui/tenants")
        assert re.search(r"\bdefault\b", operator.page.locator("table").inner_text())
        assert operator.page.locator("main form").count() == 0  # nothing to change here
        assert operator.goto("/ui/episodes").status == 403
        operator.shot("tenants")
    finally:
        operator.close()


def test_malformed_queries_get_an_error_page_not_a_500(tab: Tab) -> None:
    for path, status in (("/ui/episodes?status=nope", 422), ("/ui/episodes?offset=-1", 422),
                         ("/ui/episodes?reward_min=abc", 422), ("/ui/envs/nope/episodes/1", 404),
                         ("/ui/evaluations/nope", 404), ("/ui/environments/" + "x" * 300, 404),
                         ("/ui/envs/nope/episodes/99999999999999999999999", 422),
                         ("/ui/envs/nope/episodes/1/steps/-1/state", 422), ("/ui/envs/nope/episodes/1/steps/0/diff", 422),
                         ("/ui/evaluations/nope/episodes/99999999999999999999", 422),
                         ("/ui/compare?a=x", 422), ("/ui/static/../web.py", 404)):
        response = tab.goto(path)
        assert response.status == status, path
    for path in ("/ui/nowhere", "/ui/envs", "/ui/" + "%3Cscript%3Ealert(1)%3C%2Fscript%3E", "/ui/a/b/c/d?x=<y>"):
        response = tab.goto(path)  # a path no page has: the viewer's own 404 page, not the API's JSON
        assert response.status == 404, path
        assert response.headers["content-type"].startswith("text/html"), path
        assert response.headers["content-security-policy"].startswith("default-src 'none'"), path
        assert tab.page.locator("#error-message").inner_text() == "There is no such page.", path
    assert tab.goto("/ui").status == 200
    home = tab.page.url
    assert tab.goto("/ui/").status == 200 and tab.page.url == home  # the home page, as before
    started = time.monotonic()
    assert tab.goto("/ui/signin?next=//evil.example/").status == 200
    assert time.monotonic() - started < 10
    assert 'value="/ui"' in tab.page.content()  # no open redirect through ``next``


def test_the_sign_in_form_needs_its_token_and_a_small_body(server: ApiServer) -> None:
    with httpx.Client(base_url=server.url, follow_redirects=False) as client:
        no_token = client.post("/ui/signin", data={"key": server.api_key})
        assert no_token.status_code == 403 and "sandpit_ui" not in no_token.cookies
        form = client.get("/ui/signin")
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
        assert token is not None
        huge = client.post("/ui/signin", data={"csrf": token.group(1), "key": "k" * 20_000})
        assert huge.status_code == 413
        static = client.get("/ui/static/viewer.js")
        assert static.status_code == 200 and "javascript" in static.headers["content-type"]
        assert static.headers["x-content-type-options"] == "nosniff"
        signed = client.post("/ui/signin", data={"csrf": token.group(1), "key": server.api_key,
                                                 "next": "/ui/environments"})
        assert signed.status_code == 303 and signed.headers["location"] == "/ui/environments"


def test_a_bfcl_demo_episode_reads_as_a_timeline(tab: Tab, server: ApiServer) -> None:
    """One episode of the demo's BFCL suite (registered as ``sandpit import bfcl`` registers
    it, its ground truth replayed): every call on the timeline in order, and a step's diff
    of the real environment's state expands."""
    from sandpit.client import Client
    from sandpit.importers import bfcl
    from sandpit.importers.bfcl.replay import replay_episode

    wheel = bfcl.cached_wheel()
    assert wheel is not None, "bfcl-eval wheel not cached: run scripts/setup"
    suite = bfcl.load_suite(wheel)
    episode = next(e for e in suite.episodes if sum(len(turn) for turn in e.turns) >= 2)
    environment = suite.environments[episode.environment_name]
    with Client(server.url, api_key=server.api_key, timeout=120) as client:
        created = client.environments.create(environment.source_code, environment.class_name,
                                             name=episode.environment_name, policy="audit")
        replay = replay_episode(client, episode, created.id, keep=True)
    assert replay.error is None and replay.env_id is not None and replay.steps >= 2, replay
    calls = [call.name for turn in episode.turns for call in turn]
    tab.goto(f"/ui/envs/{replay.env_id}/episodes/1")
    steps = tab.page.locator("ol.timeline li.step")
    shown = min(len(calls), steps.count())
    assert shown >= 2 and [steps.nth(i).locator(".tool").inner_text() for i in range(shown)] == calls[:shown]
    diff = tab.page.locator("#step-1 details.lazy-diff")
    diff.locator("summary").click()
    tab.page.wait_for_selector("#step-1 details.lazy-diff.loaded")
    assert diff.inner_text().strip() != ""
    tab.shot("bfcl-episode")
