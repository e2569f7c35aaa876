"""Which check function sources a scenario takes (``scenarios.check_policy``): decided on
the host from the text alone (nothing is executed), as the sandbox would find them."""

from __future__ import annotations

import pytest
from sandpit.api.errors import InvalidRequest
from sandpit.api.schemas.scenarios import CheckSpec
from sandpit.api.services.scenarios import binds_check_func, check_policy, checks_size


@pytest.mark.parametrize("source", [
    "def check_func(final_state):\n    return True\n",
    "async def check_func(final_state):\n    return True\n",
    "check_func = lambda final_state: True\n",
    "if True:\n    def check_func(s):\n        return True\n",
    "try:\n    import json\nexcept ImportError:\n    pass\nelse:\n    check_func = bool\n",
    "def make():\n    global check_func\n    check_func = bool\nmake()\n",
    "from operator import truth as check_func\n",
    "class check_func:\n    def __new__(cls, s):\n        return True\n",
    "for check_func in [bool]:\n    pass\n",
    "with open('x') as check_func:\n    pass\n",
    "try:\n    pass\nexcept Exception as check_func:\n    pass\n",
    "(check_func := bool)\n",
    "check_func: object = bool\n",
    "match 1:\n    case check_func:\n        pass\n",
])
def test_sources_that_bind_check_func(source: str) -> None:
    assert binds_check_func(source)


@pytest.mark.parametrize("source", [
    "", "   \n", "# only a comment\n", "x = 1\n",
    "def check(final_state):\n    return True\n",
    "def helper():\n    check_func = 1\n",
    "class Holder:\n    check_func = staticmethod(bool)\n",
    "check_func: object\n",  # an annotation alone binds nothing
    "values = [check_func for check_func in [bool]]\n",
    "f = lambda check_func: check_func\n",
    "def g(check_func=1):\n    return check_func\n",
    "def check_func(final_state:\n",  # does not parse
])
def test_sources_that_do_not(source: str) -> None:
    assert not binds_check_func(source)


def test_check_policy_names_the_first_bad_check_and_why() -> None:
    good = CheckSpec(check_item="g", check_func="def check_func(s):\n    return True\n")
    for bad, why in [("x = 1", "no check_func defined"), ("def check_func(:", "syntax-error"),
                     ("import os\ncheck_func = lambda s: os.getpid()", None),
                     ("check_func = lambda s: __import__('os')", "dynamic-import"),
                     ("check_func = bool\n#" + "é" * 40_000, "bytes of UTF-8")]:
        checks = [good, CheckSpec(check_item="b", check_func=bad)]
        if why is None:
            check_policy(checks, "checklist_with_func")  # a warning, not an error
            continue
        with pytest.raises(InvalidRequest) as caught:
            check_policy(checks, "checklist_with_func")
        assert caught.value.field == "checklist_with_func.1.check_func" and why in caught.value.message


def test_checks_size_counts_utf8_bytes_of_every_source() -> None:
    checks = [CheckSpec(check_item="a", check_func="é" * 10), CheckSpec(check_item="b", check_func="x")]
    assert checks_size(checks) == 21
