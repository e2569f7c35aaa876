"""Encoded states restored as Python objects, for the check functions of a batch.

Stdlib only. Runs inside a sandbox, in a check batch's zygote (``child_checks.py``). The
states are *encoded* states (one entry per attribute: ``["j", value]``, ``["p", base64
pickle]``, ``["u", rendering]``, see ``child_session.py``) and are restored in one of two
ways:

* by default (a scenario's ``check_objects: standins``; no ``source`` in the request) no
  code of the environment runs in this process or in any check's: pickles are restored by
  ``child_standins.py``, which gives the standard library's value types (sets, dates,
  Decimal, OrderedDict...) as themselves and every other class a pickle names (the
  environment's own) as a *stand-in* carrying the same attributes. So the process that
  computes a verdict holds only the runner's code, the check's own code and data: the
  code being judged cannot install hooks, patch modules or rewrite results here;
* with ``source`` (``check_objects: environment``, an explicit opt-in) the environment's
  module (or a module it creates when it loads, as BFCL's environments do) is loaded
  from ``source`` when a pickle refers to it, so its classes unpickle as themselves
  (methods, ``isinstance``) exactly as EnvScaler's in-process check sees them. Its
  module-level code then runs here: what it installs at import that this module can take
  back (profile and trace functions, builtins, ``sys`` streams and hooks, replaced
  ``sys.modules`` entries) is put back before any check runs (:class:`ProcessState`),
  but the environment's code takes part in the verdict (its methods run inside checks,
  and audit hooks or threads it starts cannot be taken back).
``"u"`` attributes (not picklable) arrive as their rendering. ``"j"`` values that are tags
of ``child_render.py`` (only possible in states a caller wrote by hand, e.g. validation cases)
are turned back into the objects they stand for (:func:`unrender`).
"""

from __future__ import annotations

import builtins
import sys
import types

from . import child_standins
from .child_instance import LEGACY_MODULE_NAMES, MODULE_NAME
from .limits import ERROR_CHARS
from .wire import error_observation, is_encoded_entry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


class StateError(Exception):
    """An encoded state could not be restored (a pickle that does not load, the
    environment's module failing to load, a malformed entry)."""


def _load_env_module(source: str | None) -> types.ModuleType:
    """The environment's module, loaded from ``source`` on first use (only when a pickle
    refers to it). Raises StateError when there is no source or it fails to load."""
    module = sys.modules.get(MODULE_NAME)
    if module is not None:
        return module
    if not source:
        raise StateError("the state holds instances of the environment's classes, but no environment "
                         "source was given to load them")
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = "<environment>"
    module.__builtins__ = builtins  # type: ignore[attr-defined]  # the real module, as EnvScaler's exec gives it
    for name in (MODULE_NAME, *LEGACY_MODULE_NAMES):
        sys.modules[name] = module
    try:
        exec(compile(source, "<environment>", "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - sandbox
    except MemoryError:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported as the state's error
        for name in (MODULE_NAME, *LEGACY_MODULE_NAMES):
            sys.modules.pop(name, None)
        raise StateError(f"loading the environment's module failed: {error_observation(exc, ERROR_CHARS)}") from None
    return module


CHECK_OBJECTS = ("standins", "environment")
"""How a check batch restores objects of the environment's classes (a scenario's
``check_objects``): ``standins`` rebuilds them without running any environment code
(``child_standins.py``); ``environment`` loads the environment's module from ``source``
so its classes unpickle as themselves (its code then runs in this process)."""


def decode_state(encoded: dict[str, Any], source: str | None, objects: str = "standins",
                 factory: child_standins.StandInFactory | None = None, tagged: bool = True) -> dict[str, Any]:
    """Python objects of an encoded state (module docstring). With ``objects ==
    "standins"`` no code of the environment runs: pickles are restored by
    ``child_standins.loads`` (pass one ``factory`` for both states of a check batch);
    ``"environment"`` loads the environment's module from ``source`` when a pickle refers
    to it. ``tagged=False`` says no string in the state begins with ``$`` (PID 1 read
    its text: ``pid1_job_requests``), so its ``"j"`` values hold no tag and are taken as
    they are: :func:`unrender` would rebuild them equal. Raises StateError (also for a
    value that is not an object of ``wire.is_encoded_entry`` entries); MemoryError
    propagates."""
    import base64

    if type(encoded) is not dict or not all(is_encoded_entry(entry) for entry in encoded.values()):
        raise StateError("the state is not an encoded state ({name: [kind, data]})")

    unpickle = _environment_unpickler(source) if objects == "environment" else None
    if factory is None:
        factory = child_standins.StandInFactory()
    state: dict[str, Any] = {}
    for name, entry in encoded.items():
        kind = entry[0]
        if kind == "j":
            state[name] = unrender(entry[1]) if tagged else entry[1]
        elif kind == "p":
            try:
                blob = base64.b64decode(entry[1])
                state[name] = unpickle(blob) if unpickle is not None else child_standins.loads(blob, factory)
            except (MemoryError, StateError):
                raise
            except BaseException as exc:  # noqa: BLE001 - a pickle that does not load
                raise StateError(f"attribute {name!r} could not be restored: {error_observation(exc, ERROR_CHARS)}") from None
        else:
            state[name] = entry[1] if len(entry) > 1 else None
    return state


def _environment_unpickler(source: str | None) -> Any:
    """``pickle.loads`` that loads the environment's module (from ``source``) before a
    class of it, or of a module its code creates when it loads (BFCL's embedded
    packages), is looked up: the ``check_objects: environment`` opt-in."""
    import io
    import pickle

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            if module == MODULE_NAME or module in LEGACY_MODULE_NAMES:
                _load_env_module(source)
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                if not source or MODULE_NAME in sys.modules:
                    raise
                _load_env_module(source)
                return super().find_class(module, name)

    return lambda blob: _Unpickler(io.BytesIO(blob)).load()


class ProcessState:
    """What the environment's module may change in this process when it is loaded for
    ``check_objects: environment``, taken before it runs and put back after (so hooks and
    patches it installs at import do not act on the checks): builtins, the standard
    streams and hooks of ``sys``, replaced ``sys.modules`` entries, profile and trace
    functions. It cannot take back audit hooks, threads it started, or changes made
    inside module objects; docs/isolation.md says so."""

    def __init__(self) -> None:
        self.builtins = dict(builtins.__dict__)
        self.modules = dict(sys.modules)
        self.sys_attrs = {name: getattr(sys, name, None) for name in _SYS_ATTRS}
        self.import_hooks = (list(sys.meta_path), list(sys.path_hooks))

    def restore(self) -> None:
        sys.setprofile(None)
        sys.settrace(None)
        threading = sys.modules.get("threading")
        if threading is not None and self.modules.get("threading") is threading:
            threading.setprofile(None)
            threading.settrace(None)
        current = builtins.__dict__
        for name, value in self.builtins.items():
            if current.get(name, _MISSING) is not value:
                current[name] = value
        for name in [name for name in current if name not in self.builtins]:
            del current[name]
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
        for name, value in self.sys_attrs.items():
            if value is not None and getattr(sys, name, None) is not value:
                setattr(sys, name, value)
        sys.meta_path[:], sys.path_hooks[:] = self.import_hooks
        sys.setprofile(None)
        sys.settrace(None)


_SYS_ATTRS = ("stdout", "stderr", "stdin", "excepthook", "displayhook", "unraisablehook", "breakpointhook",
              "meta_path", "path_hooks", "path")
_MISSING = object()


def unrender(value: Any) -> object:
    """Objects back from a rendering's tags (``child_render.py``) where Python can rebuild them:
    sets, frozensets, tuples, bytes, dates and times, Decimal, Fraction, complex, UUID,
    non-finite floats, dicts with non-str keys; ``$object`` becomes a
    ``types.SimpleNamespace`` of its attributes, ``$enum`` its value; ``$repr``,
    ``$cycle`` and ``$truncated`` stay as they are. Plain JSON comes back unchanged."""
    kind = type(value)
    if kind is list:
        return [unrender(item) for item in value]
    if kind is not dict:
        return value
    if len(value) != 1:
        return {key: unrender(item) for key, item in value.items()}
    tag, body = next(iter(value.items()))
    if not (type(tag) is str and tag.startswith("$")):
        return {tag: unrender(body)}
    try:
        return _unrender_tag(tag, body, value)
    except (TypeError, ValueError, ArithmeticError):
        return value


def _unrender_tag(tag: str, body: Any, whole: dict[str, Any]) -> object:
    if tag in ("$set", "$frozenset", "$tuple") and type(body) is list:
        items = [unrender(item) for item in body]
        return set(items) if tag == "$set" else frozenset(items) if tag == "$frozenset" else tuple(items)
    if tag in ("$bytes", "$bytearray") and type(body) is str:
        import base64

        data = base64.b64decode(body)
        return data if tag == "$bytes" else bytearray(data)
    if tag in ("$datetime", "$date", "$time") and type(body) is str:
        import datetime

        kind: type[datetime.datetime | datetime.date | datetime.time] = {
            "$datetime": datetime.datetime, "$date": datetime.date, "$time": datetime.time}[tag]
        return kind.fromisoformat(body)
    if tag == "$timedelta" and type(body) in (int, float):
        import datetime

        return datetime.timedelta(seconds=body)
    if tag == "$decimal" and type(body) is str:
        import decimal

        return decimal.Decimal(body)
    if tag == "$fraction" and type(body) is str:
        import fractions

        return fractions.Fraction(body)
    if tag == "$complex" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    if tag == "$uuid" and type(body) is str:
        import uuid

        return uuid.UUID(body)
    if tag == "$float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "$dict" and type(body) is list:
        return {_hashable(unrender(pair[0])): unrender(pair[1]) for pair in body}
    if tag == "$enum" and type(body) is dict:
        return unrender(body.get("value"))
    if tag == "$object" and type(body) is dict and type(body.get("attrs")) is dict:
        return types.SimpleNamespace(**{k: unrender(v) for k, v in body["attrs"].items() if k.isidentifier()})
    return whole


def _hashable(key: object) -> object:
    if type(key) is list:
        return tuple(_hashable(k) for k in key)
    if type(key) is dict:
        return tuple(sorted((str(k), repr(v)) for k, v in key.items()))
    return key
