"""The static proof that a check function only reads (``child_readonly``): EnvScaler-style
checks pass it; every way to change a shared state, reach a module, a frame or a file, or
name something dangerous is refused with a reason (those checks take the forked path)."""

from __future__ import annotations

import pytest
from sandpit.sandbox_images.runner.child_readonly import why_not_read_only
from sandpit.sandbox_images.runner.limits import READ_ONLY_CHECK_MAX_NODES as MAX_NODES


def check(body: str, prelude: str = "") -> str:
    lines = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return f"{prelude}\n" * bool(prelude) + f"def check_func(final_state):\n{lines}\n"


# What ScenGenerator writes (its prompt: "must not modify any input data"): lookups,
# comparisons, loops with counters, comprehensions, helpers, string normalisation.
READ_ONLY = [
    check("return final_state['orders']['O1']['status'] == 'shipped'"),
    check("order = final_state.get('orders', {}).get('O1')\nif not order:\n    return False\n"
          "return order.get('status', '').lower().strip() in ('shipped', 'delivered')"),
    check("count = 0\nfor oid, order in final_state['orders'].items():\n    if order['status'] == 'shipped':\n"
          "        count += 1\nreturn count == 1"),
    check("new = set(final_state['users']) - set(initial_state['users'])\nreturn len(new) == 1"),
    check("return any(u['name'] == 'Ann' and u.get('tier') == 'gold' for u in final_state['users'].values())"),
    check("ids = [r['id'] for r in final_state['log'] if isinstance(r, dict)]\nids.sort()\n"
          "seen = {}\nfor i in ids:\n    seen[i] = seen.get(i, 0) + 1\nreturn all(v == 1 for v in seen.values())"),
    check("try:\n    return float(final_state['balance']) == 80.0\nexcept (KeyError, TypeError, ValueError):\n"
          "    return False"),
    check("return helper(final_state) and initial_state['balance'] == 100",
          prelude="def helper(state):\n    total = sum(x.get('amount', 0) for x in state['payments'])\n"
                  "    return round(total, 2) == 20"),
    check("items = sorted(final_state['items'], key=lambda i: i['price'])\nreturn items[0]['sku'].startswith('P')"),
    check("copy = final_state['orders'].copy()\ncopy.pop('O1', None)\ncopy.update({'x': 1})\nreturn 'x' in copy"),
    check("msg = f\"{final_state['balance']:.2f}\"\nprint('balance', msg)\nreturn msg == '80.00'"),
    check("rows: list = []\nrows += [1, 2]\nrows.append(3)\ndel rows[0]\nreturn len(rows) == 2"),
    check("d = final_state['meta']['created']\nreturn d.year == 2024 and d.isoformat().startswith('2024')"),
    "check_func = lambda final_state: final_state['balance'] == 80\n",
]


@pytest.mark.parametrize("source", READ_ONLY)
def test_envscaler_style_checks_are_read_only(source: str) -> None:
    assert why_not_read_only(source) is None


# Each refused with the reason that names what it does (a prefix of the message).
REFUSED = [
    # changing a shared state, directly or through an alias
    (check("final_state['balance'] = 0\nreturn True"), "changes an item of 'final_state'"),
    (check("final_state['log'].append('x')\nreturn True"), "calls append on an expression"),
    (check("final_state.clear()\nreturn True"), "calls clear on 'final_state'"),
    (check("log = final_state['log']\nlog.append(1)\nreturn True"), "calls append on 'log'"),
    (check("for o in final_state['orders'].values():\n    o['status'] = 'x'\nreturn True"),
     "changes an item of 'o'"),
    (check("x = final_state['log']\nx += ['forged']\nreturn True"), "updates 'x' in place"),
    (check("x = []\nx = final_state['log']\nx.append(1)\nreturn True"), "calls append on 'x'"),
    (check("x = final_state['log'] or []\nx.append(1)\nreturn True"), "calls append on 'x'"),
    (check("x = [final_state['log']]\nx[0] += [1]\nreturn True"), "updates an expression in place"),
    (check("x = [final_state['log']]\nx[0].append(1)\nreturn True"), "calls append on an expression"),
    (check("del final_state['orders']\nreturn True"), "changes an item of 'final_state'"),
    (check("(y := final_state['log']).append(1)\nreturn True"), "calls append on an expression"),
    (check("return f()", prelude="def f(x=initial_state):\n    x.clear()\n    return True"), "calls clear on 'x'"),
    (check("return True", prelude="initial_state |= {'balance': 0}"), "updates 'initial_state' in place"),
    (check("return True", prelude="initial_state = {}\ninitial_state.clear()"), "calls clear on 'initial_state'"),
    (check("return list.append(final_state['log'], 1)"), "calls append on 'list'"),
    (check("return True", prelude="def g():\n    list = []\ndef h():\n    list.append(initial_state['log'], 1)"),
     "calls append on 'list'"),
    (check("y = list(final_state['log'])\ny.append(1)\nreturn True", prelude="list = lambda v: v"),
     "calls append on 'y'"),
    (check("final_state.x = 1\nreturn True"), "sets attribute 'x'"),
    # reaching modules, frames, files, code
    ("import os\ndef check_func(final_state):\n    return True\n", "imports os"),
    (check("from json import dumps\nreturn True"), "imports from json"),
    (check("return open('/tmp/x', 'w') is None"), "names 'open'"),
    (check("return getattr(final_state, 'x', 1) == 1"), "names 'getattr'"),
    (check("return type(final_state) is dict"), "names 'type'"),
    (check("return globals() is None"), "names 'globals'"),
    (check("return __import__('os') is None"), "names '__import__'"),
    (check("return __builtins__ is None"), "names '__builtins__'"),
    (check("return final_state.__class__ is dict"), "reads attribute '__class__'"),
    (check("g = (x for x in [1])\nreturn g.gi_frame is None"), "reads attribute 'gi_frame'"),
    (check("return '{0.__class__}'.format(final_state) == ''"), "reads attribute 'format'"),
    (check("return str.format('{0.__class__}', 1) == ''"), "reads attribute 'format'"),
    (check("return 'a'.encode('idna') == b'a'"), "reads attribute 'encode'"),  # a codec lookup imports
    (check("return True", prelude="def f():\n    open = print\n"), "binds 'open'"),
    (check("return x", prelude="def f(eval):\n    return 1\nx = True"), "binds 'eval'"),
    (check("return unknown_name"), "names 'unknown_name'"),
    (check("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    return e.__traceback__ is None"),
     "reads attribute '__traceback__'"),
    (check("return e.args == ()", prelude="e = ValueError()"), "reads attribute 'args'"),
    # statements outside the read-only subset
    (check("global initial_state\ninitial_state = {}\nreturn True"), "uses Global"),
    (check("class A:\n    pass\nreturn True"), "uses ClassDef"),
    (check("with final_state as s:\n    pass\nreturn True"), "uses With"),
    (check("yield 1"), "uses Yield"),
    (check("match final_state:\n    case _:\n        return True"), "uses Match"),
    (check("return True", prelude="@print\ndef deco():\n    pass"), "decorates a function"),
    ("async def check_func(final_state):\n    return True\n", "uses AsyncFunctionDef"),
    ("def check_func(final_state)\n    return True\n", "does not parse"),
    ("def check_func(final_state):\n    return True\n\x00", "does not parse"),
    ("x = (" * 300 + ")" * 300 + "\n", "does not parse"),
]


@pytest.mark.parametrize(("source", "reason"), REFUSED)
def test_anything_that_could_change_or_reach_more_than_its_states_is_refused(source: str, reason: str) -> None:
    got = why_not_read_only(source)
    assert got is not None and got.startswith(reason), (got, reason)


def test_huge_sources_are_not_analysed() -> None:
    source = check("x = 1\n" * (MAX_NODES // 3 + 10) + "return x == 1")
    assert why_not_read_only(source) == f"more than {MAX_NODES} syntax nodes"


@pytest.mark.parametrize("hostile", [None, 5, b"def check_func(s): return True", ""])
def test_never_raises(hostile: object) -> None:
    reason = why_not_read_only(hostile)  # type: ignore[arg-type]
    assert reason is None or isinstance(reason, str)
