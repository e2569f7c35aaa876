"""The API's service graph over the executor's scripted fake (``sandpit.executor.fake``):
a ``Counter`` environment whose tools are Python functions over a state dict. The source
text registered with the API only has to pass the static policy: the fake never runs it."""

from __future__ import annotations

from typing import Any

from sandpit.api.services.quotas import TenantContext
from sandpit.api.settings import Quotas
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
