"""States rebuilt for check functions without running the code that defined their objects.

Stdlib only; runs in a check batch's process (``child_restore.py``) inside the sandbox. A
state attribute that is not plain JSON arrives as a pickle made by the session process,
where the environment's code runs. Unpickling it the ordinary way imports whatever
module the pickle names and calls whatever callable it names: the environment's own
module (whose top-level code would then run where the verdict is computed) or any
function at all (``__reduce__`` may return ``(exec, (source,))``). :func:`loads` unpickles
with a closed list of globals instead:

* the standard library's value types are themselves (:data:`SAFE_GLOBALS`: ``set``,
  ``frozenset``, ``bytearray``, ``complex``, ``datetime``/``date``/``time``/``timedelta``/
  ``timezone``, ``Decimal``, ``Fraction``, ``UUID``, ``OrderedDict``, ``defaultdict``,
  ``Counter``, ``deque``, ``SimpleNamespace``, and the ``copyreg`` helpers that rebuild
  instances), none of which runs code it is given;
* every other global the pickle names (the environment's classes, classes of modules its
  code creates, and any function or class of any other module) becomes a *stand-in
  class*: a subclass of :class:`StandIn` with the same ``__name__``, ``__qualname__`` and
  ``__module__``. Calling it, as a pickle's ``REDUCE`` does, only records the arguments.

What a check can do with a stand-in (EnvScaler checks read attributes and compare them):

=====================================  ==============================================
works as on the real object            differs
=====================================  ==============================================
attributes (``__dict__`` and slots),   methods of the environment's classes (none
``vars(x)``, ``getattr``,              exist), ``isinstance`` against them,
``type(x).__name__``                   properties (a stand-in has the stored fields)
items of a ``dict`` subclass           ``isinstance(x, dict)`` for such a subclass is
(``x[k]``, ``x.get``, ``keys``,        False; its items are what pickle stored
``items``, ``len``, ``in``, iteration)
items of a ``list`` subclass           ``isinstance(x, list)`` is False
fields of a ``tuple`` subclass /       field names of a namedtuple (``x.name``);
namedtuple by index                    ``x[0]`` works
an ``Enum`` member: ``x.value``,       ``x.name``, ``isinstance(x, Enum)``; ``==`` with
``==``/``<``/``hash`` as its value     the value is True also for a plain ``Enum``
``==`` of two stand-ins: same class    a class with its own ``__eq__`` (or none: then
name and equal fields, as a            EnvScaler compares by identity) decides
dataclass compares                     differently
=====================================  ==============================================

A stand-in's code is this module's: nothing a pickle carries can change what it does. A
malformed or hostile pickle fails with ``pickle.UnpicklingError`` (or the error of the
allowed constructor it misused, e.g. ``TypeError``), which the caller reports as a
state that could not be restored.
"""

from __future__ import annotations

import builtins
import io
import pickle
import reprlib

from .limits import STANDIN_NAME_CHARS as NAME_CHARS
from .limits import STANDIN_REPR_CHARS as REPR_CHARS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

SAFE_GLOBALS = frozenset({
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"), ("builtins", "bytes"),
    ("builtins", "complex"), ("builtins", "object"), ("builtins", "list"), ("builtins", "dict"),
    ("builtins", "tuple"), ("builtins", "int"), ("builtins", "float"), ("builtins", "str"), ("builtins", "bool"),
    ("builtins", "slice"), ("builtins", "range"),
    ("copyreg", "_reconstructor"), ("copyreg", "__newobj__"), ("copyreg", "__newobj_ex__"),
    ("datetime", "date"), ("datetime", "datetime"), ("datetime", "time"), ("datetime", "timedelta"),
    ("datetime", "timezone"),
    ("decimal", "Decimal"), ("fractions", "Fraction"), ("uuid", "UUID"),
    ("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "Counter"),
    ("collections", "deque"), ("types", "SimpleNamespace"),
})
"""Globals a state's pickle may name that are used as they are: standard value types
whose construction from any arguments runs no code of the caller's, and ``copyreg``'s
rebuilders (which only call ``__new__``/``__init__`` of a class this list or a stand-in
provides)."""


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def _slot(obj: object, name: str) -> Any:
    """A stand-in's own slot (None when unset: ``copyreg`` may create it with
    ``object.__new__``, which skips :meth:`StandIn.__new__`)."""
    try:
        return _SLOTS[name].__get__(obj, type(obj))
    except AttributeError:
        return None


class StandIn:
    """An object of a class the checks may not run (module docstring). Subclasses are
    made per pickled class name by :func:`standin_class`; instances keep what the pickle
    gave them: attributes in ``__dict__``, constructor arguments, ``dict``-like items and
    ``list``-like items."""

    __slots__ = ("__dict__", "__weakref__", "_StandIn__args", "_StandIn__kwargs", "_StandIn__items",
                 "_StandIn__seq", "_StandIn__extra")
    _standin_key: tuple[str, str] = ("", "StandIn")

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        self = object.__new__(cls)
        _SLOTS["_StandIn__args"].__set__(self, args)
        _SLOTS["_StandIn__kwargs"].__set__(self, kwargs or None)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the arguments were recorded by ``__new__``."""

    # -- what pickle calls ---------------------------------------------------------------
    def __setstate__(self, state: object) -> None:
        """``BUILD``: a ``__dict__`` (str keys), ``(dict, slots)``, or an opaque state kept as is."""
        if type(state) is tuple and len(state) == 2 and all(part is None or type(part) is dict for part in state):
            merged: dict[Any, Any] = {}
            for part in state:
                if part:
                    merged.update(part)
            state = merged
        if type(state) is dict and all(type(key) is str for key in state):
            object.__getattribute__(self, "__dict__").update(state)
        else:
            _SLOTS["_StandIn__extra"].__set__(self, state)

    def __setitem__(self, key: object, value: object) -> None:
        items = _slot(self, "_StandIn__items")
        if items is None:
            items = {}
            _SLOTS["_StandIn__items"].__set__(self, items)
        items[key] = value

    def __getattr__(self, name: str) -> Any:
        """Only called when ``name`` is not an attribute: the item views of a ``dict``
        subclass, the list methods pickle uses to fill a ``list`` subclass, an Enum's
        ``value``."""
        items = _slot(self, "_StandIn__items")
        if items is not None and name in ("get", "keys", "values", "items", "copy"):
            return getattr(items, name)
        seq = _slot(self, "_StandIn__seq")
        if name in ("append", "extend") and items is None:
            if seq is None:
                seq = []
                _SLOTS["_StandIn__seq"].__set__(self, seq)
            return getattr(seq, name)
        if seq is not None and name in ("index", "count", "copy"):
            return getattr(seq, name)
        if name == "value" and _single(self):
            return _slot(self, "_StandIn__args")[0]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} (it stands in for an "
                             "object of the environment's classes: only its stored fields exist)")

    # -- the container protocol of dict/list/tuple subclasses -------------------------------
    def __getitem__(self, key: Any) -> Any:
        return _container(self)[key]

    def __len__(self) -> int:
        return len(_container(self))

    def __iter__(self) -> Any:
        return iter(_container(self))

    def __contains__(self, item: object) -> bool:
        return item in _container(self)

    def __bool__(self) -> bool:
        if _slot(self, "_StandIn__items") is not None or _slot(self, "_StandIn__seq") is not None:
            return len(self) > 0
        if _single(self):
            return bool(_slot(self, "_StandIn__args")[0])
        return True

    # -- comparison ------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, StandIn):
            if type(self)._standin_key != type(other)._standin_key:
                return False
            if self is other:
                return True
            pair = (id(self), id(other))
            if pair in _COMPARING:  # a cycle (a tree's parent links): equal unless shown otherwise
                return True
            _COMPARING.add(pair)
            try:
                return bool(_fields(self) == _fields(other))
            finally:
                _COMPARING.discard(pair)
        if _single(self):
            return bool(_slot(self, "_StandIn__args")[0] == other)
        return NotImplemented

    def __hash__(self) -> int:
        if _single(self):
            try:
                return hash(_slot(self, "_StandIn__args")[0])
            except TypeError:
                pass
        attrs = object.__getattribute__(self, "__dict__")
        return hash((type(self)._standin_key, tuple(sorted(attrs)), len(_slot(self, "_StandIn__args") or ())))

    def __lt__(self, other: object) -> Any:
        return _order(self, other, "__lt__")

    def __le__(self, other: object) -> Any:
        return _order(self, other, "__le__")

    def __gt__(self, other: object) -> Any:
        return _order(self, other, "__gt__")

    def __ge__(self, other: object) -> Any:
        return _order(self, other, "__ge__")

    # -- copies and text -------------------------------------------------------------------
    def __copy__(self) -> StandIn:
        """A shallow copy: containers of its own, holding the same values."""
        args, kwargs, attrs, items, seq, extra = _fields(self)
        twin = object.__new__(type(self))
        _fill(twin, (args, dict(kwargs) if kwargs else kwargs, attrs, dict(items) if items is not None else None,
                     list(seq) if seq is not None else None, extra))
        return twin

    def __deepcopy__(self, memo: dict[int, Any]) -> StandIn:
        import copy

        twin = object.__new__(type(self))
        memo[id(self)] = twin
        _fill(twin, copy.deepcopy(_fields(self), memo))
        return twin

    def __reduce_ex__(self, protocol: object) -> Any:
        raise TypeError(f"{type(self).__name__!r} stands in for an object of the environment's classes "
                        "and cannot be pickled")

    @reprlib.recursive_repr("...")
    def __repr__(self) -> str:
        args, kwargs, attrs, items, seq, extra = _fields(self)
        parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in (kwargs or {}).items()]
        parts += [f"{k}={v!r}" for k, v in attrs.items()]
        if items is not None:
            parts.append(f"items={items!r}")
        if seq is not None:
            parts.append(f"list={seq!r}")
        if extra is not None:
            parts.append(f"state={extra!r}")
        text = f"{type(self).__qualname__}({', '.join(parts)})"
        return text if len(text) <= REPR_CHARS else text[:REPR_CHARS] + "...)"

    __str__ = __repr__


_COMPARING: set[tuple[int, int]] = set()
"""Pairs of stand-ins being compared right now: a pair met again while comparing its own
fields is a cycle, and counts as equal (the comparison of everything else decides)."""

_SLOTS = {name: StandIn.__dict__[name] for name in StandIn.__slots__ if name.startswith("_StandIn__")}


def _container(obj: object) -> Any:
    """What a stand-in's ``len``/``in``/``[]``/iteration use: its dict items, its list
    items or its constructor arguments. Raises TypeError when it has none."""
    for name in ("_StandIn__items", "_StandIn__seq"):
        found = _slot(obj, name)
        if found is not None:
            return found
    args = _slot(obj, "_StandIn__args")
    if args:
        return args
    raise TypeError(f"{type(obj).__name__!r} object is not a container")


def _fields(obj: object) -> tuple[Any, ...]:
    """Everything a stand-in holds: ``(args, kwargs, __dict__, items, list items, opaque state)``."""
    return (_slot(obj, "_StandIn__args") or (), _slot(obj, "_StandIn__kwargs"),
            object.__getattribute__(obj, "__dict__"), _slot(obj, "_StandIn__items"),
            _slot(obj, "_StandIn__seq"), _slot(obj, "_StandIn__extra"))


def _order(obj: object, other: object, op: str) -> Any:
    """``<``, ``<=``, ``>``, ``>=`` of a one-argument stand-in: those of its value."""
    if not _single(obj):
        return NotImplemented
    mine = _slot(obj, "_StandIn__args")[0]
    if isinstance(other, StandIn) and _single(other):
        other = _slot(other, "_StandIn__args")[0]
    return getattr(mine, op)(other)


def _single(obj: object) -> bool:
    """An object built from one argument and nothing else (an Enum member, a value wrapper)."""
    args = _slot(obj, "_StandIn__args")
    return (args is not None and len(args) == 1 and _slot(obj, "_StandIn__kwargs") is None
            and not object.__getattribute__(obj, "__dict__") and _slot(obj, "_StandIn__items") is None
            and _slot(obj, "_StandIn__seq") is None and _slot(obj, "_StandIn__extra") is None)


def _fill(obj: StandIn, fields: tuple[Any, ...]) -> None:
    args, kwargs, attrs, items, seq, extra = fields
    for name, value in (("_StandIn__args", args), ("_StandIn__kwargs", kwargs), ("_StandIn__items", items),
                        ("_StandIn__seq", seq), ("_StandIn__extra", extra)):
        _SLOTS[name].__set__(obj, value)
    object.__getattribute__(obj, "__dict__").update(attrs)


class StandInFactory:
    """Stand-in classes of one unpickling pass, one per ``(module, qualname)``."""

    def __init__(self) -> None:
        self.classes: dict[tuple[str, str], type[StandIn]] = {}

    def get(self, module: str, qualname: str) -> type[StandIn]:
        """The stand-in class for ``module.qualname`` (names cut to NAME_CHARS)."""
        key = (str(module)[:NAME_CHARS], str(qualname)[:NAME_CHARS])
        cls = self.classes.get(key)
        if cls is None:
            name = key[1].rpartition(".")[2] or "StandIn"
            cls = type(name, (StandIn,), {"__slots__": (), "__module__": key[0], "__qualname__": key[1],
                                          "_standin_key": key})
            self.classes[key] = cls
        return cls


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, factory: StandInFactory) -> None:
        super().__init__(io.BytesIO(data))
        self._factory = factory

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE_GLOBALS:
            return super().find_class(module, name)
        return self._factory.get(module, name)

    def persistent_load(self, pid: object) -> Any:
        raise pickle.UnpicklingError("a state pickle may not hold persistent ids")


def loads(data: bytes, factory: StandInFactory | None = None) -> Any:
    """Unpickle ``data`` with stand-ins for every global outside :data:`SAFE_GLOBALS`
    (module docstring). Pass one ``factory`` for every attribute of a state pair so that
    ``initial_state`` and ``final_state`` share stand-in classes (``type(a) is type(b)``).
    Raises ``pickle.UnpicklingError``, ``EOFError``, or what a misused allowed
    constructor raises (``TypeError``, ``ValueError``...); ``MemoryError`` propagates."""
    return _RestrictedUnpickler(data, factory or StandInFactory()).load()
