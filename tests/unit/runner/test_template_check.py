"""The template check of ``child_template.py``: which environment sources may be executed
once and forked for many sessions (their import must be deterministic and touch nothing
outside the process), and the run-time check of what an import left behind."""

from __future__ import annotations

import os
import threading

import pytest
from sandpit.sandbox_images.runner import child_template
from sandpit.sandbox_images.runner.pid1_templates import template_key

TYPICAL = '''
from typing import Any, Dict, List, Optional
from dataclasses import dataclass, field
from enum import Enum
import copy, uuid, datetime


class Status(Enum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass
class Order:
    order_id: str
    items: List[str] = field(default_factory=list)


class Shop:
    """Orders and customers."""

    MAX_ITEMS = 10

    def __init__(self, init_config: Dict[str, Any]):
        self.orders: Dict[str, Order] = {}
        self.created = datetime.datetime.now().isoformat()
        self.id = str(uuid.uuid4())

    @property
    def size(self) -> int:
        return len(self.orders)

    def add(self, order_id: str, item: str, note: Optional[str] = None) -> str:
        self.orders.setdefault(order_id, Order(order_id)).items.append(item)
        return copy.deepcopy(order_id)
'''


def test_a_typical_environment_is_templatable() -> None:
    assert child_template.unsuitable(TYPICAL, "Shop") is None


@pytest.mark.parametrize(("source", "reason"), [
    ("import os\nclass E: pass", "imports os"),
    ("from os import path\nclass E: pass", "imports from os"),
    ("from . import x\nclass E: pass", "imports from"),
    ("class E:\n    def f(self):\n        import subprocess\n", "imports subprocess"),
    ("import random\nrandom.seed(3)\nclass E: pass", "calls seed at import"),
    ("import random\nRNG = random.Random()\nclass E: pass", "calls Random at import"),
    ("import uuid\nX = uuid.uuid4()\nclass E: pass", "calls uuid4 at import"),
    ("import datetime\nclass E:\n    T = datetime.datetime.now()\n", "calls now at import"),
    ("import datetime\ndef f(t=datetime.date.today()):\n    pass\n", "calls today at import"),
    ("def g():\n    return 1\nX = g()\n", "calls g at import"),
    ("def d(f):\n    return f\n@d\nclass E: pass", "decorator d runs at import"),
    ("class M(type): pass\nclass E(metaclass=M): pass", "a metaclass runs at import"),
    ("class B:\n    def __init_subclass__(cls):\n        pass\nclass E(B): pass", "a class hook runs at import"),
    ("class E:\n    def f(self):\n        return open('/tmp/x')\n", "names open"),
    ("class E:\n    def f(self, c):\n        return eval(c)\n", "names eval"),
    ("X = 0\ndef f():\n    global X\n    X = 1\n", "rebinds module globals"),
    ("class E(:\n", "does not parse"),
    ("while True:\n    pass\n", None),  # no call: passes the check, killed at its deadline instead
])
def test_imports_that_could_differ_per_session_are_not_templatable(source: str, reason: str | None) -> None:
    found = child_template.unsuitable(source, "E")
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found, found


def test_the_run_time_check_sees_threads_and_descriptors() -> None:
    read_end, write_end = os.pipe()
    try:
        found = child_template._extra_descriptors(own=-1)
        assert found is not None and "descriptors" in found  # pytest's own files, and the pipe
        assert child_template._extra_state(own=-1) is not None
    finally:
        os.close(read_end)
        os.close(write_end)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        found = child_template._extra_threads()
        assert found is not None and "threads" in found
        assert child_template._extra_state(own=-1) is not None
    finally:
        stop.set()
        thread.join()


def test_template_keys_separate_sources_and_classes() -> None:
    assert template_key("class A: pass", "A") == template_key("class A: pass", "A")
    assert template_key("class A: pass", "A") != template_key("class A:  pass", "A")
    assert template_key("class A: pass\nclass B: pass", "A") != template_key("class A: pass\nclass B: pass", "B")
    assert template_key("x = '\udc80'", "A")  # a lone surrogate does not raise
