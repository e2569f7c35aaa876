"""Path-level deltas of large JSON attributes, found strictly (session child side).

Stdlib only; runs in the session process (``child_session.py``), also imported on the
host by unit tests. Nothing here executes environment code: it reads the instance's
attribute values after a call.

A JSON-native dict or list attribute whose marshal encoding is at least
``limits.TREE_MIN_BYTES`` is tracked by a :class:`Tree`: its children are grouped in
buckets (dict: by the key's hash; list: contiguous runs of indexes) and the tree keeps the
``marshal`` bytes of every bucket, plus a sub-tree for every child that is itself large.
After a call, :func:`check` re-marshals each bucket (one pass over the state in C, about
the cost of one ``marshal.dumps`` of the attribute) and compares bytes: equal bytes mean
equal content, exactly (marshal records the exact type of every scalar, ``1``, ``1.0``
and ``True`` differ, and dict insertion order). Only a bucket whose bytes differ is
looked into: its previous content is ``marshal.loads``-ed from the kept bytes and compared
child by child with :func:`diff`, a type-aware walk (``type(a) is type(b)``, key order,
``-0.0`` vs ``0.0``), which emits the changed paths as operations:

``["s", path, value]``   set: replace the node at ``path`` (or add a dict key, at the end)
``["d", path]``          delete a dict key
``["r", path, n, items]`` resize a list: keep its first ``n`` items, then append ``items``

``path`` is a list of dict keys (str) and list indexes (int) below the attribute. A node
whose type or key order changed is set whole; a list whose length changed gets element
operations for its common prefix plus one ``r``. Any value a ``s``/``r`` carries is
checked JSON-native (``wire.json_native``) at its depth, so the attribute
stays within ``JSON_NATIVE_MAX_DEPTH``; when it is not (a ``set`` or ``date`` appeared
deep inside, a cycle, a non-str key, a dict that reads like a ``$`` tag), :func:`check`
returns None and the caller re-encodes the attribute whole (pickle + rendering).

A write barrier spares most of that pass: with the ``state_watch`` module (C, built into
the sandbox image; absent on the host), every bucket also keeps a *watch*: the version
tag of each dict in it (CPython bumps a dict's tag on every write, PEP 509) and the items
of each list, with references that keep them alive. One ``state_watch.dirty`` call per
node says which buckets were written to (or no longer hold the same objects under their
keys); only those are marshalled, compared and walked, then get a new watch. Buckets are
then small (8 children; the square root without the module). On a multi-megabyte state
the barrier cuts a writing step's check several-fold against marshalling every bucket
(``benchmarks/deltas.py``). A bucket holding anything else than dicts, lists, tuples and immutable
scalars (a ``set``), or nested past 64 levels, gets no watch and is always compared by
marshal bytes.

Marshal bytes may also differ for equal content (marshal flags objects referenced more
than once, which depends on reference counts); the walk then finds nothing and only the
kept bytes are refreshed. Aliasing needs no care: every attribute and every key is
compared by content, so one object reachable under two names shows its change under
both. The operations are applied by ``protocol.apply_keyed`` (PID 1 and the host).
"""

from __future__ import annotations

import builtins
import marshal
import math

from .limits import JSON_NATIVE_MAX_DEPTH, MAX_PATH_OPS, TREE_MAX_DEPTH, TREE_MIN_BYTES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

try:
    from . import state_watch  # type: ignore[attr-defined]  # the image build compiles it into the package
except ImportError:  # the package on the host (unit tests): no compiled module
    state_watch = None

_SCALARS = (str, int, bool, type(None))


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def _marshal(value: Any) -> bytes:
    """``marshal.dumps(value)``; an unmarshallable object (not JSON: a ``date``, an
    instance) or a structure nested too deeply raises :class:`Abort`."""
    try:
        return marshal.dumps(value)
    except ValueError:
        raise Abort("not marshallable") from None


class Abort(Exception):
    """The attribute can no longer be sent as path operations (not JSON-native, too many
    operations): the caller encodes it whole."""


class Ops:
    """Operations gathered for one attribute, as JSON texts."""

    def __init__(self, dumps: Any, json_native: Any) -> None:
        self.dumps = dumps
        self.json_native = json_native
        self.texts: list[str] = []

    def _add(self, text: str) -> None:
        if len(self.texts) >= MAX_PATH_OPS:
            raise Abort("too many changes")
        self.texts.append(text)

    def set(self, path: list[Any], value: Any) -> None:
        if not self.json_native(value, len(path)):
            raise Abort("not JSON-native")
        self._add(f'["s",{self.dumps(path)},{self.dumps(value)}]')

    def delete(self, path: list[Any]) -> None:
        self._add(f'["d",{self.dumps(path)}]')

    def resize(self, path: list[Any], keep: int, items: list[Any]) -> None:
        if not self.json_native(items, len(path)):
            raise Abort("not JSON-native")
        self._add(f'["r",{self.dumps(path)},{keep},{self.dumps(items)}]')


def _kind(value: Any) -> type:
    """``type(value)`` (a call, so that a comparison does not narrow ``value`` for mypy)."""
    return type(value)


def _bucket_count(children: int) -> int:
    """Buckets of a node with ``children`` small children. Without the write barrier every
    bucket is marshalled on every check, and about the square root balances that pass
    against the walk of a changed bucket; with it only the dirty buckets are, so they are
    small: about 8 children each (``benchmarks/deltas.py`` compares the two on the
    tau-bench-shaped airline)."""
    if state_watch is None:
        return max(1, min(1024, int(math.sqrt(children))))
    return max(1, min(8192, children // 8))


def _check_keys(path: list[Any], keys: list[Any], ops: Ops) -> None:
    """A dict's keys must be str and must not read like a ``child_render`` tag."""
    if len(keys) == 1 and type(keys[0]) is str and keys[0].startswith("$"):
        raise Abort("reads like a tag")
    for key in keys:
        if type(key) is not str:
            raise Abort("non-str key")


class Tree:
    """Marshal bytes of a large JSON container, bucket by bucket (see the module docstring)."""

    __slots__ = ("kind", "keys", "members", "blobs", "watches", "subs", "span")

    def __init__(self, value: Any, depth: int) -> None:
        self.kind: type = type(value)
        self.subs: dict[Any, Tree] = {}
        if self.kind is dict:
            self.keys: list[Any] = list(value)
            small = []
            for key in self.keys:
                child = value[key]
                if type(child) in (dict, list) and depth + 1 < TREE_MAX_DEPTH \
                        and len(marshal.dumps(child)) >= TREE_MIN_BYTES:
                    self.subs[key] = Tree(child, depth + 1)
                else:
                    small.append(key)
            count = _bucket_count(len(small))
            self.members: list[list[Any]] = [[] for _ in range(count)]
            for key in small:
                self.members[hash(key) % count].append(key)
            self.span = 0
        else:
            self.keys = []
            self.span = max(1, -(-len(value) // _bucket_count(len(value))))
            self.members = [list(range(start, min(start + self.span, len(value))))
                            for start in range(0, len(value), self.span)]
        self.blobs: list[bytes] = []
        self.watches: list[Any] = []
        for members in self.members:
            roots = self.roots(value, members)
            self.blobs.append(_marshal(roots))
            self.watches.append(_watch(roots))

    def roots(self, value: Any, members: list[Any]) -> Any:
        """One bucket's children: a list slice, or a tuple of a dict's values."""
        if self.kind is list:
            return value[members[0]:members[-1] + 1] if members else []
        return tuple(map(value.__getitem__, members))


def _watch(roots: Any) -> Any:
    """A ``state_watch`` watch of a bucket's children, or None (no module, or something
    in the bucket it cannot watch)."""
    return None if state_watch is None else state_watch.watch(roots)


def check(tree: Tree, value: Any, path: list[Any], ops: Ops, depth: int) -> Tree:
    """Add to ``ops`` what changed in ``value`` since ``tree`` was made (or last checked);
    returns the tree to keep (``tree`` updated, or a new one). ``value`` must be a dict or
    a list. Raises :class:`Abort` when the attribute must be encoded whole;
    ``MemoryError`` propagates."""
    if _kind(value) is not tree.kind:
        ops.set(path, value)
        return Tree(value, depth)
    if tree.kind is list:
        return _check_list(tree, value, path, ops, depth)
    keys = list(value)
    old_members = tree.members
    members = old_members
    if keys != tree.keys:
        present = value.keys()
        kept = [key for key in tree.keys if key in present]
        if keys[:len(kept)] != kept:  # reordered: set the node whole
            ops.set(path, value)
            return Tree(value, depth)
        _check_keys(path, keys, ops)
        members = [list(bucket) for bucket in old_members]
        gone = set(tree.keys).difference(kept)
        for key in tree.keys:
            if key in gone:
                ops.delete([*path, key])
                if tree.subs.pop(key, None) is None:
                    members[hash(key) % len(members)].remove(key)
        for key in keys[len(kept):]:
            ops.set([*path, key], value[key])
            members[hash(key) % len(members)].append(key)
        tree.keys = keys
    for key, sub in list(tree.subs.items()):
        child = value[key]
        if type(child) is sub.kind:
            tree.subs[key] = check(sub, child, [*path, key], ops, depth + 1)
            continue
        ops.set([*path, key], child)  # a large node became something else: a small child now
        del tree.subs[key]
        if members is old_members:
            members = [list(bucket) for bucket in old_members]
        members[hash(key) % len(members)].append(key)
    watches = tree.watches
    if state_watch is None:
        todo: Any = range(len(members))
    else:  # the buckets written to, and those whose keys changed
        todo = state_watch.dirty(watches, value, members)
        if members is not old_members:
            todo = sorted(set(todo).union(
                index for index, bucket in enumerate(members) if bucket != old_members[index]))
    for index in todo:
        bucket = members[index]
        old_bucket = old_members[index]
        if not bucket and not old_bucket:
            continue
        roots = tree.roots(value, bucket)
        blob = _marshal(roots)
        watches[index] = _watch(roots)
        if blob == tree.blobs[index] and bucket == old_bucket:
            continue
        before = dict(zip(old_bucket, marshal.loads(tree.blobs[index]), strict=True))  # noqa: S302 - bytes this process made of its own state
        for key in bucket:
            old, new = before.get(key, _MISSING), value[key]
            if old is not _MISSING and not _same_node(old, new):
                diff(old, new, [*path, key], ops, depth + 1)
        tree.blobs[index] = blob
    tree.members = members
    if _bucket_count(len(tree.keys)) > 4 * len(members):  # grown far past its layout
        return Tree(value, depth)
    return tree


_MISSING = object()


def _check_list(tree: Tree, value: list[Any], path: list[Any], ops: Ops, depth: int) -> Tree:
    """:func:`check` of a list node: element operations for the common prefix, one
    resize when the length changed (the tree is then re-bucketed)."""
    length = sum(len(bucket) for bucket in tree.members)
    common = min(length, len(value))
    todo: Any = range(len(tree.members)) if state_watch is None \
        else state_watch.dirty(tree.watches, value, tree.members)
    for index in todo:
        bucket = tree.members[index]
        if not bucket or bucket[0] >= common:
            continue
        end = min(bucket[-1] + 1, common)
        roots = value[bucket[0]:end]
        whole = end == bucket[-1] + 1
        blob = _marshal(roots)
        if whole:
            tree.watches[index] = _watch(roots)
        if whole and blob == tree.blobs[index]:
            continue
        before = marshal.loads(tree.blobs[index])  # noqa: S302 - bytes this process made of its own state
        for position in range(bucket[0], end):
            old, new = before[position - bucket[0]], value[position]
            if not _same_node(old, new):
                diff(old, new, [*path, position], ops, depth + 1)
        tree.blobs[index] = blob
    if len(value) != length:
        ops.resize(path, common, value[common:])
        return Tree(value, depth)
    return tree


def _same_float(a: float, b: float) -> bool:
    return a == b and (a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))


def diff(old: Any, new: Any, path: list[Any], ops: Ops, depth: int) -> None:
    """Add to ``ops`` the changes from ``old`` (a private copy) to ``new``, strictly:
    types, key order and the sign of zero count. Raises :class:`Abort` (not JSON-native,
    too deep, too many operations)."""
    kind = type(new)
    if type(old) is not kind:
        ops.set(path, new)
        return
    if kind in _SCALARS:
        if old != new:
            ops.set(path, new)
        return
    if kind is float:
        if not _same_float(old, new):
            ops.set(path, new)
        return
    if depth >= JSON_NATIVE_MAX_DEPTH:
        raise Abort("too deep")
    if kind is dict:
        keys = list(new)
        old_keys = list(old)
        if keys != old_keys:
            kept = [key for key in old_keys if key in new]
            if keys[:len(kept)] != kept:
                ops.set(path, new)
                return
            _check_keys(path, keys, ops)
            for key in old_keys:
                if key not in new:
                    ops.delete([*path, key])
            for key in keys[len(kept):]:
                ops.set([*path, key], new[key])
            keys = kept
        for key in keys:
            a, b = old[key], new[key]
            if not _same_node(a, b):
                diff(a, b, [*path, key], ops, depth + 1)
        return
    if kind is list:
        common = min(len(old), len(new))
        for index in range(common):
            a, b = old[index], new[index]
            if not _same_node(a, b):
                diff(a, b, [*path, index], ops, depth + 1)
        if len(new) != len(old):
            ops.resize(path, common, new[common:])
        return
    raise Abort("not JSON-native")


def _same_node(a: Any, b: Any) -> bool:
    """True only when ``a`` and ``b`` are equal exactly and need no walk: the same scalar
    object, or two dicts or two lists with equal :func:`_marshal_equal` bytes."""
    if a is b and type(a) in _SCALARS:
        return True
    return type(a) in (dict, list) and type(b) is type(a) and _marshal_equal(a, b)


def _marshal_equal(a: Any, b: Any) -> bool:
    """True only when ``a`` and ``b`` are equal exactly (equal marshal bytes); False may
    also mean "equal, marshalled differently" (the caller then walks them).

    Marshal version 0: it writes no back-references and no interning marks, so equal
    content gives equal bytes whatever the objects' reference counts. The default
    version flags every object referenced more than once, and one side here is always
    fresh from ``marshal.loads`` (each string referenced once) while the other is the live
    state (keys shared by every record): nearly every comparison came out unequal and the
    walk went on down to the scalars (hundreds of ``diff`` calls per step on a
    tau-bench-sized state). Version 0 stays exact: ``True``/``1``/``1.0``,
    ``-0.0``/``0.0``, list/tuple, key order and dict subclasses (unmarshallable) differ."""
    try:
        return marshal.dumps(a, 0) == marshal.dumps(b, 0)
    except ValueError:  # unmarshallable (not JSON) or too deep: walk it
        return False
