"""``sandpit serve`` raises its soft limit of open files to the hard one
(:func:`sandpit.cli.raise_open_files`), in a child process so this one keeps its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = """
import json, resource, sys
from sandpit.cli import raise_open_files
soft, hard = (int(v) for v in sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
got = raise_open_files()
print(json.dumps([got, *resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


def limits_after(soft: int, hard: int) -> list[int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(soft), str(hard)], capture_output=True, text=True,
                         check=True, timeout=60)
    return list(json.loads(out.stdout))


@pytest.fixture
def hard() -> int:
    import resource

    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if limit != resource.RLIM_INFINITY and limit < 2048:
        pytest.skip(f"the hard limit of open files here is {limit}")
    return 2048


def test_the_soft_limit_is_raised_to_the_hard_one(hard: int) -> None:
    assert limits_after(256, hard) == [hard, hard, hard]


def test_a_soft_limit_at_the_hard_one_stays(hard: int) -> None:
    assert limits_after(hard, hard) == [hard, hard, hard]
