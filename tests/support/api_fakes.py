"""The API's service graph over the executor's scripted fake (``sandpit.executor.fake``):
a ``Counter`` environment whose tools are Python functions over a state dict. The source
text registered with the API only has to pass the static policy: the fake never runs it;
and the whole app over that fake (:func:`fake_app`, :func:`with_app`)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr
from sandpit.api.app import create_app
from sandpit.api.db.engine import upgrade
from sandpit.api.services.quotas import TenantContext
from sandpit.api.settings import ApiSettings, Quotas, new_operator_key
from sandpit.executor.fake import FakeExecutor

SOURCE = '''
class Counter:
    """A counter with records (the fake plays it: this text is never executed)."""

    def __init__(self, init_config):
        self.count = init_config.get("count", 0)
'''


def bump(state: dict[str, Any], by: int = 1) -> int:
    """Add to the counter.

    Args:
        by: how much to add.
    """
    state["count"] += by
    state["log"] = [*state["log"], f"bump {by}"]
    return int(state["count"])


def set_record(state: dict[str, Any], key: str, value: str) -> str:
    """Create or replace one record.

    Args:
        key: record id.
        value: new value.
    """
    state["records"] = {**state["records"], key: {"value": value}}
    return f"stored {key}"


def fail(state: dict[str, Any], message: str) -> str:
    """Raise an error with ``message``, after changing the state.

    Args:
        message: what to say.
    """
    state["count"] = -1
    raise ValueError(message)


def counter_state(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("explode"):
        raise RuntimeError("init refused")
    return {"count": 0, "records": {}, "log": []}


def fake_executor() -> FakeExecutor:
    """A fake with ``Counter`` registered."""
    fake = FakeExecutor()
    fake.register("Counter", {"bump": bump, "set_record": set_record, "fail": fail}, init=counter_state)
    return fake


def caller(tenant: str = "team-a", **quotas: Any) -> TenantContext:
    """A tenant's request context with default quotas (``quotas`` overrides)."""
    return TenantContext(tenant=tenant, actor=f"key_{tenant}", quotas=Quotas().merged(quotas))


OPERATOR = new_operator_key()
"""The operator key of :func:`fake_app`'s apps."""


def fake_app(tmp_path: Path, **settings: Any) -> Any:
    """The app on a migrated SQLite file in ``tmp_path`` and the executor's fake."""
    api_settings = ApiSettings(data_dir=tmp_path, operator_key=SecretStr(OPERATOR), warm_on_start=False,
                               janitor_interval_s=60, **settings)
    upgrade(api_settings.resolved_database_url())
    return create_app(api_settings, executor_factory=lambda _settings: fake_executor())


class Stepper:
    """A running app with tenants ``team-a`` and ``team-b`` and an env of ``team-a``."""

    def __init__(self, app: Any, client: httpx.AsyncClient, keys: dict[str, dict[str, str]], env_id: str) -> None:
        self.app, self.client, self.keys, self.env_id = app, client, keys, env_id

    async def post(self, body: str | bytes, query: str = "", headers: dict[str, str] | None = None,
                   env_id: str | None = None, who: str = "team-a", path: str | None = None) -> httpx.Response:
        """A step request with ``body`` sent as given (JSON content type and ``who``'s key
        unless ``headers`` says otherwise) to ``path`` (default: the step path of
        ``env_id``, else of :attr:`env_id`)."""
        sent = {"content-type": "application/json", **self.keys[who], **(headers or {})}
        return await self.client.post(f"{path or f'/v1/envs/{env_id or self.env_id}/step'}{query}", headers=sent,
                                      content=body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body)

    async def fresh_env(self, **episode: Any) -> str:
        made = await self.client.post("/v1/envs", headers=self.keys["team-a"], json={
            "environment_id": self.environment_id, "episode": {"max_steps": 1000, "termination_action": "finish",
                                                               **episode}})
        return str(made.json()["id"])

    environment_id = ""


def with_app(tmp_path: Path, test: Callable[[Stepper], Awaitable[None]], raise_app_exceptions: bool = True,
             **settings: Any) -> Any:
    """Run ``test`` against a fresh app (lifespan started, two tenants, one env); the app."""
    app = fake_app(tmp_path, **settings)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
            async with httpx.AsyncClient(transport=transport, base_url="http://sandpit") as client:
                keys = {}
                for tenant in ("team-a", "team-b"):
                    made = await client.post("/v1/admin/tenants", json={"id": tenant},
                                             headers={"Authorization": f"Bearer {OPERATOR}"})
                    keys[tenant] = {"authorization": f"Bearer {made.json()['api_key']['key']}"}
                environment = await client.post("/v1/environments", headers=keys["team-a"],
                                                json={"source_code": SOURCE, "class_name": "Counter"})
                stepper = Stepper(app, client, keys, "")
                stepper.environment_id = environment.json()["id"]
                stepper.env_id = await stepper.fresh_env()
                await test(stepper)

    asyncio.run(main())
    return app


class DoorSpy:
    """A door of the app (the batched step's, the create's: anything with ``matches`` and
    an ASGI ``__call__``) that notes the paths it answered, then answers as the real one."""

    def __init__(self, door: Any) -> None:
        self.door = door
        self.paths: list[str] = []

    def matches(self, scope: Any) -> bool:
        return bool(self.door.matches(scope))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await self.door(scope, receive, send)


_ID = re.compile(r"\b[a-z]+_[0-9a-f]{12,}\b|\d{4}-\d\d-\d\dT[0-9:.+Z-]+")


class AccessLines(logging.Handler):
    """Keeps the access log's lines as ``(method, template, status, tenant)`` (add it to
    the ``sandpit.access`` logger at INFO)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[Any, ...]] = []

    def emit(self, record: logging.LogRecord) -> None:
        method, template, status, _ms, tenant = record.args  # type: ignore[misc]
        self.lines.append((method, template, status, tenant))


class IdNames:
    """Ids and times replaced by ``<id1>``, ``<id2>``... in the order of their first
    appearance (two apps that see the same requests in the same order name them alike)."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        return _ID.sub(lambda m: self.seen.setdefault(m.group(0), f"<id{len(self.seen) + 1}>"), text)


Answer = tuple[int, list[tuple[str, str]], str, list[tuple[Any, ...]]]
"""A door test's record of one reply: status, headers (ids named, ``content-length``'s
value dropped), body (ids named) and the access log's lines for it."""


async def tenant_environment(stepper: Stepper, tenant: str, **quotas: Any) -> str:
    """Make ``tenant`` with ``quotas`` (its key in ``stepper.keys``) unless it is there; the
    id of a new environment of its own (the ``Counter`` source)."""
    if tenant not in stepper.keys:
        made = await stepper.client.post("/v1/admin/tenants", json={"id": tenant, "quotas": quotas},
                                         headers={"Authorization": f"Bearer {OPERATOR}"})
        stepper.keys[tenant] = {"authorization": f"Bearer {made.json()['api_key']['key']}"}
    environment = await stepper.client.post("/v1/environments", headers=stepper.keys[tenant],
                                            json={"source_code": SOURCE, "class_name": "Counter"})
    assert environment.status_code == 201, environment.text
    return str(environment.json()["id"])


async def send_case(stepper: Stepper, log: AccessLines, ids: IdNames, url: str, body: str | bytes,
                    headers: dict[str, str], names: dict[str, str], digest: Callable[[bytes], str]) -> Answer:
    """One case of a door's differential test, POSTed to ``url``: ``body`` with the
    placeholders of ``names`` replaced (bytes as given), a JSON content type and
    ``team-a``'s key unless ``headers`` (their values' placeholders replaced too) says
    otherwise; ``"who"`` names the tenant whose key is sent, and ``"claim"`` has the
    ``Idempotency-Key`` taken first by a request still in flight (under ``digest`` of the
    body). The :data:`Answer`, ``content-length`` checked against the body first."""
    if isinstance(body, str):
        for placeholder, value in names.items():
            body = body.replace(placeholder, value)
        body = body.encode("utf-8", "surrogatepass")
    sent = {"content-type": "application/json", **stepper.keys["team-a"],
            **{k: names.get(v, v) for k, v in headers.items()}}
    who, claim = sent.pop("who", "team-a"), sent.pop("claim", None)
    sent.update(stepper.keys[who] if "authorization" not in headers else {})
    if claim:
        stepper.app.state.idempotency.begin(who, sent["idempotency-key"], digest(body))
    del log.lines[:]
    reply = await stepper.client.post(url, headers=[(k.encode(), v.encode("utf-8")) for k, v in sent.items()],
                                      content=body)
    raw = [(k.decode(), v.decode("latin-1")) for k, v in reply.headers.raw]
    assert ("content-length", str(len(reply.content))) in raw, (url, raw)
    seen = [(k, "<n>" if k == "content-length" else ids(v)) for k, v in raw]
    return reply.status_code, seen, ids(reply.text), log.lines[:]


def door_and_route(tmp_path: Callable[[str], Path], door: str, kind: type,
                   run: Callable[[Stepper, AccessLines], Awaitable[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """``run``'s record in an app with its door (the app's attribute ``door``, e.g.
    ``"reset_door"``, an instance of ``kind``) and in one with that door taken away, so FastAPI's route answers:
    ``{"door": ..., "route": ...}``, each app made in ``tmp_path(name)``; the access log
    at INFO meanwhile."""
    out: dict[str, dict[str, Any]] = {}
    logger = logging.getLogger("sandpit.access")
    log, level = AccessLines(), logger.level
    logger.addHandler(log)
    logger.setLevel(logging.INFO)
    try:
        for way in ("door", "route"):
            async def test(stepper: Stepper, way: str = way) -> None:
                assert isinstance(getattr(stepper.app, door), kind)
                if way == "route":
                    setattr(stepper.app, door, None)
                out[way] = await run(stepper, log)

            with_app(tmp_path(f"{door}-{way}"), test)
    finally:
        logger.removeHandler(log)
        logger.setLevel(level)
    return out
