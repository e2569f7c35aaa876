"""An environment's class and instance, as EnvScaler makes them (child side).

Stdlib only. Runs in the processes that execute environment code: a session
(``child_session.py``) and a template (``child_template.py``), which share these steps so
that a session forked from a template starts exactly as one that made its instance itself.

* :func:`load_class`: the source executed as the module ``dynamic_env`` (EnvScaler
  ``init_env_class``), the class looked up by name;
* :func:`instantiate`: EnvScaler ``init_env_instance`` (``cls(init_config)``, else
  ``cls()``, then every key set as an attribute), with :func:`retyped_attributes` (keys
  whose value replaces a constructed attribute of another type);
* :func:`flush_std`: the standard streams flushed before a reply, a fork or an exit, so
  what the environment printed is in the pipes PID 1 reads (never printed twice).
"""

from __future__ import annotations

import builtins
import sys
import types

from .limits import INIT_RETYPED_MAX, INIT_RETYPED_NAME_CHARS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

MODULE_NAME = "dynamic_env"
"""The environment's module (EnvScaler ``init_env_class`` names it ``dynamic_env``)."""
LEGACY_MODULE_NAMES = ("sandpit_env",)
"""Earlier names of the module, kept as aliases so pickles in older snapshots load."""


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def load_class(source: str, class_name: str) -> type:
    """Execute ``source`` as the module ``dynamic_env`` (EnvScaler ``init_env_class``; also
    registered under LEGACY_MODULE_NAMES) and return its class ``class_name``. Raises what
    the code raises, LookupError (no such name) or TypeError (not a class)."""
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = "<environment>"
    module.__builtins__ = builtins  # type: ignore[attr-defined]  # the real module, as EnvScaler's exec gives it
    sys.modules[MODULE_NAME] = module
    for alias in LEGACY_MODULE_NAMES:
        sys.modules[alias] = module
    code = compile(source, "<environment>", "exec")
    exec(code, module.__dict__)  # noqa: S102 - this is the sandbox
    if class_name not in module.__dict__:
        raise LookupError(f"class {class_name!r} is not defined by the environment code")
    cls = module.__dict__[class_name]
    if not issubclass(type(cls), type):  # its real type: a forged __class__ does not count
        raise TypeError(f"{class_name!r} is not a class (the environment code binds it to a "
                        f"{type(cls).__name__})")
    return cls  # type: ignore[no-any-return]


def instantiate(cls: type, init_config: dict[str, Any], retyped: list[dict[str, str]] | None = None) -> object:
    """EnvScaler ``init_env_instance``: ``cls(init_config)`` (``cls({})`` when the config is
    empty); on ``TypeError``, ``cls()``; then every key of a non-empty config is set as an
    attribute. ``init_config`` is this process's own copy (parsed from the request). When
    ``retyped`` is a list, :func:`retyped_attributes` of the constructed instance (before
    the keys are set) are appended to it."""
    try:
        instance = cls(init_config) if init_config else cls({})
    except TypeError:
        instance = cls()
    if retyped is not None and init_config:
        retyped.extend(retyped_attributes(instance, init_config))
    for key, value in init_config.items():
        setattr(instance, key, value)
    return instance


def retyped_attributes(instance: object, init_config: dict[str, Any]) -> list[dict[str, str]]:
    """The keys of ``init_config`` whose value will replace an attribute the constructor
    set to a value of another type (EnvScaler sets every key over what ``__init__`` made:
    a constructor that turned ``init_config["orders"]``, a list, into a dict keyed by id
    gets the list back, and its first tool call fails on ``list.get``), as
    ``{"key", "constructed", "config"}`` (the key, which is the attribute's name, and the
    two types' names), at most INIT_RETYPED_MAX, names cut to INIT_RETYPED_NAME_CHARS.
    Only attributes in the instance's ``__dict__`` count (a key the constructor did not
    set is a new attribute); a constructed ``None`` (a placeholder) and ``int`` <->
    ``float`` are not reported. Types are compared exactly (``defaultdict`` -> ``dict`` is
    reported) and named through ``type``'s own slot, so no environment code runs here;
    an instance without a readable ``__dict__`` reports nothing."""
    try:
        attrs = object.__getattribute__(instance, "__dict__")
    except Exception:  # noqa: BLE001 - slots or a hostile descriptor: nothing to compare
        return []
    if not isinstance(attrs, dict):
        return []
    numbers = (int, float)
    found: list[dict[str, str]] = []
    for key, value in init_config.items():
        if len(found) >= INIT_RETYPED_MAX:
            break
        before = dict.get(attrs, key, _MISSING) if type(key) is str else _MISSING
        if before is _MISSING or before is None:
            continue
        old, new = type(before), type(value)
        if old is new or (old in numbers and new in numbers):
            continue
        found.append({"key": key[:INIT_RETYPED_NAME_CHARS], "constructed": _type_name(old),
                      "config": _type_name(new)})
    return found


_MISSING = object()


def _type_name(kind: type) -> str:
    """``kind.__name__`` read through ``type``'s own slot (a metaclass cannot intercept
    it), cut to INIT_RETYPED_NAME_CHARS."""
    name = type.__dict__["__name__"].__get__(kind, type)
    return str(name)[:INIT_RETYPED_NAME_CHARS]


def flush_std() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr`` (whatever the environment made of them);
    a stream that raises is left as it is."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the environment's own streams
            pass
