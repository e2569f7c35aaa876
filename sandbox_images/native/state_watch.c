/* state_watch: a write barrier for the delta scan of large JSON state (sandbox side).
 *
 * child_delta.py keeps, for every bucket of a large dict or list attribute, the marshal
 * bytes of its content and re-marshals the bucket after each tool call to find what
 * changed: a pass over the whole state (tau-bench airline, 2.8 MB: ~80% of the session
 * process's CPU per call). This module lets it skip the buckets nothing wrote to.
 *
 * watch(roots) records, for the containers reachable from the objects of the tuple or
 * list `roots`: every dict with its version tag (CPython bumps a dict's ma_version_tag on
 * every change of its keys, values or order: PEP 509; the tag is unique in the process,
 * and a new dict gets a fresh one), every list with a tuple of its items (no version
 * tag exists for lists), and holds a strong reference to each, so no recorded object
 * can be freed and its address reused. Tuples are immutable: only their items are
 * followed. str, int, float, bool, None, bytes and complex are immutable leaves. Any
 * other object (set, bytearray, an instance, a subclass of dict) cannot be watched:
 * watch() then returns None and the caller compares marshal bytes as before, as it
 * does when the structure nests deeper than MAX_DEPTH (a cycle, for one).
 *
 * unchanged(w, roots) is True only when `roots` holds the same objects as when `w` was
 * made, every recorded dict has its recorded tag and every recorded list the same items
 * (identity): then no container of the bucket was written to and its content is
 * exactly what it was (leaves are immutable and the references held keep them alive).
 * False means "maybe changed": the caller then re-marshals and walks the bucket.
 * dirty(watches, node, buckets) does what unchanged() does for every bucket of a node at
 * once, looking the buckets' values up in the node itself (str keys only: hashing any
 * other key may run Python code; such a bucket is reported dirty).
 * unchanged() and dirty() run no Python code. All three functions raise TypeError on
 * misuse, a forged watch included: the session's own code can import this module, so
 * every object read through a watch is type-checked first.
 *
 * Built for the sandbox image's interpreter by the image build (a builder stage with a
 * compiler; the sandbox itself has none). CPython 3.8 to 3.13 keep ma_version_tag.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX >= 0x030E0000
#error "state_watch needs ma_version_tag (CPython < 3.14)"
#endif

#define MAX_DEPTH 64

typedef struct {
    PyObject *dicts;     /* list of recorded dicts */
    uint64_t *tags;      /* one tag per recorded dict (PyMem buffer) */
    Py_ssize_t ntags, cap;
    PyObject *lists;     /* list of recorded lists */
    PyObject *snaps;     /* list of tuples: each recorded list's items */
} Collect;

static int is_leaf(PyTypeObject *t) {
    return t == &PyUnicode_Type || t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type
        || t == Py_TYPE(Py_None) || t == &PyBytes_Type || t == &PyComplex_Type;
}

static int collect_container(Collect *c, PyObject *obj, int depth);

/* 1: recorded; 0: not watchable; -1: error set. Holds a reference to `obj` while it is
 * followed: an allocation here may run the garbage collector, whose finalizers (the
 * session's own code) could drop the last other reference to it. */
static int collect(Collect *c, PyObject *obj, int depth) {
    if (is_leaf(Py_TYPE(obj))) return 1;
    Py_INCREF(obj);
    int ok = collect_container(c, obj, depth);
    Py_DECREF(obj);
    return ok;
}

static int collect_container(Collect *c, PyObject *obj, int depth) {
    PyTypeObject *t = Py_TYPE(obj);
    if (is_leaf(t)) return 1;
    if (depth >= MAX_DEPTH) return 0;
    if (t == &PyDict_Type) {
        uint64_t tag;
        _Pragma("GCC diagnostic push")
        _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
        tag = ((PyDictObject *)obj)->ma_version_tag;
        _Pragma("GCC diagnostic pop")
        if (PyList_Append(c->dicts, obj) < 0) return -1;
        if (c->ntags == c->cap) {
            Py_ssize_t cap = c->cap ? 2 * c->cap : 256;
            uint64_t *grown = PyMem_Realloc(c->tags, (size_t)cap * sizeof *grown);
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            c->tags = grown;
            c->cap = cap;
        }
        c->tags[c->ntags++] = tag;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(obj, &pos, &key, &value)) {
            /* keys are hashable; a str key is a leaf, anything else is followed. Both
               held: following the key may allocate (see collect). */
            Py_INCREF(key);
            Py_INCREF(value);
            int ok = collect(c, key, depth + 1);
            if (ok > 0) ok = collect(c, value, depth + 1);
            Py_DECREF(key);
            Py_DECREF(value);
            if (ok <= 0) return ok;
        }
        return 1;
    }
    if (t == &PyList_Type) {
        PyObject *snap = PyList_AsTuple(obj);
        if (snap == NULL) return -1;
        if (PyList_Append(c->lists, obj) < 0 || PyList_Append(c->snaps, snap) < 0) {
            Py_DECREF(snap);
            return -1;
        }
        Py_DECREF(snap);
        /* follow the snapshot's items: the list itself may not change while we do (no
           Python code runs here), but the snapshot is what unchanged() compares. */
        Py_ssize_t n = PyTuple_GET_SIZE(snap);
        for (Py_ssize_t i = 0; i < n; i++) {
            int ok = collect(c, PyTuple_GET_ITEM(snap, i), depth + 1);
            if (ok <= 0) return ok;
        }
        return 1;
    }
    if (t == &PyTuple_Type) {
        Py_ssize_t n = PyTuple_GET_SIZE(obj);
        for (Py_ssize_t i = 0; i < n; i++) {
            int ok = collect(c, PyTuple_GET_ITEM(obj, i), depth + 1);
            if (ok <= 0) return ok;
        }
        return 1;
    }
    return 0;
}

static PyObject *roots_tuple(PyObject *roots) {
    if (PyTuple_CheckExact(roots)) {
        Py_INCREF(roots);
        return roots;
    }
    if (PyList_CheckExact(roots)) return PyList_AsTuple(roots);
    PyErr_SetString(PyExc_TypeError, "roots must be a tuple or a list");
    return NULL;
}

PyDoc_STRVAR(watch_doc,
"watch(roots) -> watch | None\n\n"
"Record the containers reachable from the items of ``roots`` (a tuple or a list) for\n"
":func:`unchanged`; None when something there cannot be watched (a type other than\n"
"dict, list, tuple and immutable scalars, or nesting deeper than 64). The result is\n"
"opaque; it holds references to everything it recorded.");

static PyObject *watch(PyObject *Py_UNUSED(self), PyObject *roots) {
    PyObject *snap = roots_tuple(roots);
    if (snap == NULL) return NULL;
    Collect c = {PyList_New(0), NULL, 0, 0, PyList_New(0), PyList_New(0)};
    PyObject *result = NULL;
    if (c.dicts == NULL || c.lists == NULL || c.snaps == NULL) goto done;
    int ok = 1;
    for (Py_ssize_t i = 0; ok > 0 && i < PyTuple_GET_SIZE(snap); i++)
        ok = collect(&c, PyTuple_GET_ITEM(snap, i), 0);
    if (ok < 0) goto done;
    if (ok == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *dicts = PyList_AsTuple(c.dicts), *lists = PyList_AsTuple(c.lists),
             *snaps = PyList_AsTuple(c.snaps),
             *tags = PyBytes_FromStringAndSize((const char *)c.tags, c.ntags * (Py_ssize_t)sizeof(uint64_t));
    if (dicts && lists && snaps && tags) result = PyTuple_Pack(5, snap, dicts, tags, lists, snaps);
    Py_XDECREF(dicts);
    Py_XDECREF(lists);
    Py_XDECREF(snaps);
    Py_XDECREF(tags);
done:
    Py_DECREF(snap);
    Py_XDECREF(c.dicts);
    PyMem_Free(c.tags);
    Py_XDECREF(c.lists);
    Py_XDECREF(c.snaps);
    return result;
}

static int same_items(PyObject **a, Py_ssize_t na, PyObject **b, Py_ssize_t nb) {
    if (na != nb) return 0;
    for (Py_ssize_t i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* The recorded roots of a watch (a tuple), or NULL with TypeError when `w` is not a
 * well-formed result of watch(). */
static PyObject *watch_roots(PyObject *w) {
    if (!PyTuple_CheckExact(w) || PyTuple_GET_SIZE(w) != 5) goto bad;
    PyObject *snap = PyTuple_GET_ITEM(w, 0), *dicts = PyTuple_GET_ITEM(w, 1),
             *tags = PyTuple_GET_ITEM(w, 2), *lists = PyTuple_GET_ITEM(w, 3),
             *snaps = PyTuple_GET_ITEM(w, 4);
    if (!PyTuple_CheckExact(snap) || !PyTuple_CheckExact(dicts) || !PyBytes_CheckExact(tags)
            || !PyTuple_CheckExact(lists) || !PyTuple_CheckExact(snaps)
            || PyBytes_GET_SIZE(tags) != PyTuple_GET_SIZE(dicts) * (Py_ssize_t)sizeof(uint64_t)
            || PyTuple_GET_SIZE(lists) != PyTuple_GET_SIZE(snaps))
        goto bad;
    return snap;
bad:
    PyErr_SetString(PyExc_TypeError, "not a result of watch()");
    return NULL;
}

/* 1: some recorded dict or list was written to; 0: none; -1: forged watch (TypeError).
 * `w` passed watch_roots(). */
static int written(PyObject *w) {
    PyObject *dicts = PyTuple_GET_ITEM(w, 1), *tags = PyTuple_GET_ITEM(w, 2),
             *lists = PyTuple_GET_ITEM(w, 3), *snaps = PyTuple_GET_ITEM(w, 4);
    const char *tag_bytes = PyBytes_AS_STRING(tags);
    Py_ssize_t n = PyTuple_GET_SIZE(dicts);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyTuple_GET_ITEM(dicts, i);
        uint64_t was, tag;
        if (!PyDict_CheckExact(d)) goto bad;  /* a forged watch: never read past an object */
        memcpy(&was, tag_bytes + i * (Py_ssize_t)sizeof was, sizeof was);
        _Pragma("GCC diagnostic push")
        _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
        tag = ((PyDictObject *)d)->ma_version_tag;
        _Pragma("GCC diagnostic pop")
        if (tag != was) return 1;
    }
    n = PyTuple_GET_SIZE(lists);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *l = PyTuple_GET_ITEM(lists, i), *s = PyTuple_GET_ITEM(snaps, i);
        if (!PyList_CheckExact(l) || !PyTuple_CheckExact(s)) goto bad;
        if (!same_items(((PyListObject *)l)->ob_item, PyList_GET_SIZE(l),
                        ((PyTupleObject *)s)->ob_item, PyTuple_GET_SIZE(s)))
            return 1;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_TypeError, "not a result of watch()");
    return -1;
}

PyDoc_STRVAR(unchanged_doc,
"unchanged(w, roots) -> bool\n\n"
"True only when ``roots`` holds the same objects as when ``w = watch(roots)`` was made\n"
"and none of the dicts and lists recorded in ``w`` was changed since (so the content\n"
"is exactly the same); False means it may have changed. Raises TypeError when ``w`` is\n"
"not a result of :func:`watch` or ``roots`` is not a tuple or a list.");

static PyObject *unchanged(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "unchanged(w, roots) takes two arguments");
        return NULL;
    }
    PyObject *snap = watch_roots(args[0]), *roots = args[1];
    if (snap == NULL) return NULL;
    PyObject **now;
    Py_ssize_t count;
    if (PyTuple_CheckExact(roots)) {
        now = ((PyTupleObject *)roots)->ob_item;
        count = PyTuple_GET_SIZE(roots);
    } else if (PyList_CheckExact(roots)) {
        now = ((PyListObject *)roots)->ob_item;
        count = PyList_GET_SIZE(roots);
    } else {
        PyErr_SetString(PyExc_TypeError, "roots must be a tuple or a list");
        return NULL;
    }
    if (!same_items(now, count, ((PyTupleObject *)snap)->ob_item, PyTuple_GET_SIZE(snap)))
        Py_RETURN_FALSE;
    int changed = written(args[0]);
    if (changed < 0) return NULL;
    return PyBool_FromLong(!changed);
}

/* 1 when bucket `keys` of `node` no longer holds the objects `snap` recorded, 0 when it
 * does, -1 on error. A dict node's bucket is a list of keys; a list node's, a list of
 * consecutive indexes. */
static int moved(PyObject *node, PyObject *keys, PyObject *snap) {
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "a bucket must be a list");
        return -1;
    }
    Py_ssize_t count = PyList_GET_SIZE(keys);
    if (count != PyTuple_GET_SIZE(snap)) return 1;
    if (count == 0) return 0;
    if (PyDict_CheckExact(node)) {
        for (Py_ssize_t j = 0; j < count; j++) {
            PyObject *key = PyList_GET_ITEM(keys, j);
            if (!PyUnicode_CheckExact(key)) return 1;  /* hashing anything else may run code */
            PyObject *value = PyDict_GetItemWithError(node, key);
            if (value == NULL) return PyErr_Occurred() ? -1 : 1;
            if (value != PyTuple_GET_ITEM(snap, j)) return 1;
        }
        return 0;
    }
    Py_ssize_t first = PyLong_AsSsize_t(PyList_GET_ITEM(keys, 0));
    if (first == -1 && PyErr_Occurred()) return -1;
    if (first < 0 || first > PyList_GET_SIZE(node) - count) return 1;
    return !same_items(((PyListObject *)node)->ob_item + first, count,
                       ((PyTupleObject *)snap)->ob_item, count);
}

PyDoc_STRVAR(dirty_doc,
"dirty(watches, node, buckets) -> list[int]\n\n"
"The indexes of the buckets of ``node`` that may have changed: ``node`` is a dict (each\n"
"bucket a list of its keys) or a list (each bucket a list of consecutive indexes),\n"
"``watches[i]`` the watch of bucket ``buckets[i]``'s values, or None (always dirty).\n"
"A bucket is clean when its keys still hold the recorded objects and nothing recorded\n"
"was written to: :func:`unchanged` for every bucket in one call. Raises TypeError on\n"
"arguments of other types or lengths, or a forged watch.");

static PyObject *dirty(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "dirty(watches, node, buckets) takes three arguments");
        return NULL;
    }
    PyObject *watches = args[0], *node = args[1], *buckets = args[2];
    if (!PyList_CheckExact(watches) || !PyList_CheckExact(buckets)
            || PyList_GET_SIZE(watches) != PyList_GET_SIZE(buckets)
            || !(PyDict_CheckExact(node) || PyList_CheckExact(node))) {
        PyErr_SetString(PyExc_TypeError, "dirty() needs a list of watches, a dict or a list, "
                                         "and a list of as many buckets");
        return NULL;
    }
    PyObject *result = PyList_New(0);
    if (result == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(watches); i++) {
        PyObject *w = PyList_GET_ITEM(watches, i);
        int changed = 1;
        if (w != Py_None) {
            PyObject *snap = watch_roots(w);
            changed = snap == NULL ? -1 : moved(node, PyList_GET_ITEM(buckets, i), snap);
            if (changed == 0) changed = written(w);
        }
        if (changed < 0) {
            Py_DECREF(result);
            return NULL;
        }
        if (changed) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(result, index) < 0) {
                Py_XDECREF(index);
                Py_DECREF(result);
                return NULL;
            }
            Py_DECREF(index);
        }
    }
    return result;
}

static PyMethodDef methods[] = {
    {"watch", watch, METH_O, watch_doc},
    {"unchanged", (PyCFunction)(void (*)(void))unchanged, METH_FASTCALL, unchanged_doc},
    {"dirty", (PyCFunction)(void (*)(void))dirty, METH_FASTCALL, dirty_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "state_watch",
    "Write barrier for child_delta's bucket scan: dict version tags and list item identity.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_state_watch(void) { return PyModule_Create(&module); }
