"""How a session's instance was made, as PID 1 tells the host in the ``open`` reply
(``construction``). Stdlib only; runs in the runner and never executes environment code.

``{"path": "template"}``: forked from its config's ready template (``pid1_templates``),
no construction. ``{"path": "constructed", "reason": <class>, "detail": <text>}``: the
instance was made by executing the source and calling the constructor; ``reason`` is one
of REASONS (a bounded set: fit for a metric label), ``detail`` the runner's text behind it
(at most ``limits.CONSTRUCTION_DETAIL_MAX_CHARS``; it may quote the template's own report, which environment code
can write: it is shown to the tenant, never used as a label or a decision).

The classes, in the order :func:`verdict` tests them:

==================== ==================================================================
``restored``          opened on top of a snapshot (a restore, fork or re-attach): no template applies
``templates_off``     the sandbox keeps no templates (one session per sandbox, or templates disabled)
``seeded``            a ``seed`` is given: ``random`` is seeded before the constructor runs
``no_config``         no config sent by hash (empty, or not exactly JSON: see ``executor/pool/configs.py``)
``source_unsuitable`` the source breaks a template rule (``child_template.unsuitable``: imports,
                      import-time calls, names such as ``open``/``exec``, ``global``)
``import_effects``    executing the module left threads or descriptors, or it raised
``nondeterministic``  two constructions from the same config gave different states (clock, random, ids)
``module_state``      construction changed module-level state (instance counters, registries)
``construction_failed`` the template's construction raised
``no_verdict``        the second construction did not report (died, out of memory or time)
``leaves_process``    construction left a thread, descriptor or child process
``template_failed``   a template died, answered late or wrong, or a fork from it failed
``first_open``        the config's first open in this sandbox (a template is built at the second)
``building``          its template is being built (or is built by this very open)
``no_room``           no room for one more config template (count or memory); evicted ones are rebuilt
==================== ==================================================================
"""

from __future__ import annotations

from .limits import CONSTRUCTION_DETAIL_MAX_CHARS
from .pid1_templates import config_template_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

    from .pid1_templates import Templates

REASONS = ("restored", "templates_off", "seeded", "no_config", "source_unsuitable", "import_effects",
           "nondeterministic", "module_state", "construction_failed", "no_verdict", "leaves_process",
           "template_failed", "first_open", "building", "no_room")
"""Every ``reason`` a ``constructed`` verdict may carry (the host maps anything else to ``other``)."""

_SOURCE_RULES = ("unsuitable: imports", "unsuitable: names", "unsuitable: rebinds", "unsuitable: decorator",
                 "unsuitable: calls", "unsuitable: a metaclass", "unsuitable: a class hook",
                 "unsuitable: source")
_BY_PREFIX = (
    ("unsuitable: two constructions differ", "nondeterministic"),
    ("unsuitable: construction changed module-level state", "module_state"),
    ("unsuitable: module state cannot be fingerprinted", "module_state"),
    ("unsuitable: construction failed", "construction_failed"),
    ("unsuitable: the second construction did not report", "no_verdict"),
    ("unsuitable: construction left", "leaves_process"),
)


def classify(failure: str, config: bool) -> str:
    """The class of a template's failure reason (``Templates.failed`` values): of a config
    template when ``config``, else of an environment's template."""
    for prefix, reason in _BY_PREFIX:
        if failure.startswith(prefix):
            return reason
    if failure.startswith(_SOURCE_RULES) and not config:
        return "source_unsuitable"
    if failure.startswith("unsuitable: ") and ("after import" in failure or "import failed" in failure):
        return "leaves_process" if config else "import_effects"
    return "template_failed"


def constructed(reason: str, detail: str = "") -> dict[str, Any]:
    """A ``constructed`` verdict (``detail`` capped at CONSTRUCTION_DETAIL_MAX_CHARS)."""
    verdict: dict[str, Any] = {"path": "constructed", "reason": reason}
    if detail:
        verdict["detail"] = detail[:CONSTRUCTION_DETAIL_MAX_CHARS]
    return verdict


def verdict(templates: Templates, key: str, config_hash: str | None, spec: dict[str, Any],
            fresh: bool) -> dict[str, Any]:
    """Why a session of environment ``key`` with config ``config_hash`` (None: not sent by
    hash) is constructed rather than forked from a config template, asked when its process
    is chosen (``fresh``: a new open without a snapshot; ``spec`` holds ``seed``). Never
    raises."""
    if not fresh:
        return constructed("restored")
    if not templates.enabled():
        return constructed("templates_off")
    if spec.get("seed") is not None:
        return constructed("seeded")
    if config_hash is None:
        return constructed("no_config")
    failed = templates.failed.get(key)
    if failed is not None:
        return constructed(classify(failed, config=False), failed)
    ckey = config_template_key(key, config_hash)
    failed = templates.failed.get(ckey)
    if failed is not None:
        return constructed(classify(failed, config=True), failed)
    if ckey in templates.no_room:
        return constructed("no_room")
    if ckey in templates.by_key or ckey in templates.config_opens:
        return constructed("building")
    return constructed("first_open")
