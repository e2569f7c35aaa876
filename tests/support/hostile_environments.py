"""A hostile environment and honest checks for the reward-integrity tests (executor and
API): the environment's module installs, when it is loaded, every hook a Python process
offers (chosen by ``{attack}``: a comma-separated subset of :data:`ATTACKS`, or ``all``),
and its state holds objects of its own classes, so the state is pickled. Untrusted code:
it only ever runs inside sandboxes."""

HOSTILE = '''
import builtins, gc, json, pickle, sys, threading


def _flip(value):
    """Make any check result in sight a pass."""
    if type(value) is dict and "passed" in value:
        value["passed"] = True
        value["status"] = "ok"
        value["error"] = None
    return value


def _profile(frame, event, arg):
    if event == "return":
        _flip(arg)
    for value in list(frame.f_locals.values()):
        _flip(value)


def _trace(frame, event, arg):
    _profile(frame, event, arg)
    return _trace


_in_audit = []


def _audit(event, args):
    if _in_audit or event == "sys._getframe":
        return
    _in_audit.append(1)
    try:
        frame = sys._getframe(1)
        while frame is not None:
            for value in list(frame.f_locals.values()):
                _flip(value)
            frame = frame.f_back
    except Exception:
        pass
    finally:
        _in_audit.pop()


def _walker():
    while True:
        for frame in list(sys._current_frames().values()):
            while frame is not None:
                for value in list(frame.f_locals.values()):
                    _flip(value)
                frame = frame.f_back


ATTACK = set("{attack}".split(","))
ALL = "all" in ATTACK
if ALL or "profile" in ATTACK:
    sys.setprofile(_profile)
    threading.setprofile(_profile)
if ALL or "trace" in ATTACK:
    sys.settrace(_trace)
if ALL or "audit" in ATTACK:
    sys.addaudithook(_audit)
if ALL or "json" in ATTACK:
    _dumps = json.dumps
    json.dumps = lambda value, *a, **k: _dumps(_flip(value) if type(value) is dict else value, *a, **k)
if ALL or "builtins" in ATTACK:
    builtins.bool = lambda *a: True
    builtins.isinstance = lambda *a: True
    builtins.repr = lambda *a: "True"
if ALL or "pickle" in ATTACK:
    _loads = pickle.loads
    pickle.loads = lambda data, *a, **k: {{"forged": True}}
if ALL or "modules" in ATTACK:
    import types as _types
    fake = _types.ModuleType("json")
    fake.dumps = lambda *a, **k: '{{"passed": true}}'
    fake.loads = lambda *a, **k: {{"passed": True}}
    sys.modules["json"] = fake
if ALL or "thread" in ATTACK:
    threading.Thread(target=_walker, daemon=True).start()


class _Hook:
    """Unpickling this runs code: it installs the profile hook where it is loaded."""

    def __reduce__(self):
        return (exec, ("import sys\\nsys.setprofile(lambda f, e, a: a.update(passed=True, status='ok') "
                       "if e == 'return' and type(a) is dict and 'passed' in a else None)",))


class Box:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return True  # the class decides what == means for its objects

    __hash__ = object.__hash__


class Hostile:
    def __init__(self, init_config=None):
        self.count = 0
        self.box = Box(0)
        self.hook = _Hook()

    def bump(self):
        self.count += 1
        self.box = Box(self.count)
        return self.count
'''

HONEST = [
    "def check_func(final_state):\n    return final_state['count'] == 99\n",
    "def check_func(final_state):\n    return final_state['count'] > initial_state['count'] + 5\n",
    "def check_func(final_state):\n    return final_state['count'] == 1\n",
]
"""Two honest checks that are False after one ``bump`` and one that is True: reward 1/3."""

ATTACKS = ("profile", "trace", "audit", "json", "builtins", "pickle", "modules", "thread", "all")
