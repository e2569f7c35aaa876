"""Static policy for untrusted Python source: a filter and a synthesis signal, never the
security boundary (the sandbox container is). Host-only: the API (registration, validation,
scenarios) and synthesis check sources with it; no sandbox is involved.

The package face is :func:`check_source` and the names re-exported here. Inside:
``rules`` (rule ids, severity tables, :class:`Finding`, :class:`PolicyReport`,
:class:`Policy`), ``findings`` (bounded collection, parsing hostile text), ``ast_rules``
(the policy's own rules) and ``restricted`` (RestrictedPython, calibrated).

Nothing here executes the checked code. The host only calls :func:`ast.parse` and
RestrictedPython's ``compile_restricted_exec`` (which transforms and compiles the tree into
a code object that is thrown away, never run). :func:`check_source` returns a
:class:`PolicyReport`; it raises only for bad *arguments* (a non-``str`` source, an
unknown policy name), never because of what the source contains.

Rules and their severity per named policy (``get_policy(name)``)::

    rule                          strict   standard  audit    what
    syntax-error                  error    error     warning  does not parse or compile (incl. NUL, surrogates)
    too-large                     error    error     warning  source above MAX_SOURCE_BYTES (not parsed)
    too-complex                   error    error     warning  nesting too deep for the parser (Recursion/MemoryError)
    import-not-allowed            error    warning   warning  module outside the allow-list, relative import
    dunder-access                 error    error     warning  x.__globals__, f_back, gi_frame, "__builtins__" literal...
    dunder-dict                   error    warning   warning  x.__dict__
    dynamic-eval                  error    warning   warning  eval / exec / compile / breakpoint
    eval-globals                  warning  info      info     {"__builtins__": ...} in a dict display (a restricted
                                                            globals dict for eval/exec, e.g. tau-bench's calculate)
    dynamic-import                error    error     warning  __import__, importlib.import_module (but below)
    import-call                   error    warning   warning  __import__('m') / importlib.import_module('m'): one
                                                            constant name the allow-list allows
    open-call                     error    warning   warning  open(), io.open(), os.open(), codecs.open()
    dynamic-getattr               error    warning   warning  getattr/setattr/delattr/hasattr with a non-literal name
    builtins-write                error    error     warning  global <builtin>, builtins.x = ..., __builtins__[...] = ...
    restricted-python-error       error    error     warning  a RestrictedPython error not calibrated away (below)
    restricted-python-warning     warning  info      info     a RestrictedPython warning
    restricted-python-calibrated  info     info      info     RestrictedPython errors that are ordinary env code
    restricted-python-incomplete  error    warning   warning  RestrictedPython gave up (RecursionError, ~300 levels)
    python-warning                info     info      info     SyntaxWarning/DeprecationWarning from the parser/compiler
    too-many-findings             info     info      info     the report was cut at MAX_FINDINGS
    init-config-replaces-attribute warning warning   warning  (registration, from the sandbox, not the text) a
                                                            sample init_config key replaces an attribute
                                                            __init__ set to a value of another type

``audit`` is ``standard`` with every error lowered to a warning: it reports, it never fails.

``standard`` refuses only what cannot be legitimate in an environment class (escape chains
through introspection attributes, rebinding builtins, dynamic imports, code that does not
parse); what real third-party environments do (``eval``/``exec`` with restricted globals
in tau-bench's ``calculate``, ``open``, imports outside the allow-list) is a warning. The
code runs in the sandbox either way: the policy is a filter and a synthesis signal.

Decisions:

* Allow-list (:data:`DEFAULT_ALLOWED_IMPORTS`): the brief's pure-computation modules plus
  ``abc`` (LLM-written envs subclass ``ABC``) and ``typing_extensions`` (typing backports;
  whether the sandbox image has it is a separate matter). ``__future__`` is always allowed,
  even with a custom list: it is a compiler directive. A module is allowed when it, or a
  package it is inside, is listed (``collections`` allows ``collections.abc``).
* ``__import__("time")`` (and ``importlib.import_module("time")``) whose one argument is a
  string constant naming a module the allow-list allows, at level 0, is ``import-call`` (a
  warning in ``standard``): it imports what an ``import`` statement could (a released
  EnvScaler environment calls ``__import__('time').time()``). A computed name, a module
  outside the allow-list, a relative level, or a bare ``__import__`` that is not called stay
  ``dynamic-import``.
* ``__class__`` is not flagged: ``self.__class__.__name__`` is common and harmless; the
  escape chain ``().__class__.__bases__[0].__subclasses__()`` is caught on ``__bases__`` and
  ``__subclasses__``. Other dunders outside :data:`DANGEROUS_ATTRIBUTES` (``__name__``,
  ``__init__``, ``__doc__``...) are not flagged either. ``__dict__`` is its own rule
  (``dunder-dict``, a warning in ``standard``): env code uses ``vars(self)``/``__dict__``
  for state dumps, but a module's ``__dict__`` reaches its globals.
* A string constant *equal* to a dangerous name is ``dunder-access`` wherever it stands
  (``getattr(x, "__globals__")``, ``vars(m)["__builtins__"]``, ``attrgetter("f_back")``);
  longer strings such as docstrings that mention one are not.
* A bare ``eval``/``exec``/``compile``/``breakpoint``/``__import__`` is flagged even when it
  is not called (``run = eval``); attributes such as ``re.compile`` are not.
  ``x.import_module`` is ``dynamic-import`` whatever ``x`` is (aliases of ``importlib``).

RestrictedPython calibration. RestrictedPython was designed for Zope's through-the-web
scripts and rejects much ordinary Python; measured on EnvScaler-style classes and BFCL's
multi-turn tool modules it reports hundreds of "errors" per file. Each of these is kept as
one aggregated ``restricted-python-calibrated`` finding per kind (first line, count) instead
of an error, and does not stop RestrictedPython from compiling the rest:

* names and attributes starting with ``_`` (``_helper``, ``self._x``, ``__str__``): private
  helpers and state are ordinary; the dangerous dunders are ``dunder-access`` above;
* names ending in ``__roles__``: Zope security declarations, meaningless here;
* annotated assignments (dataclass fields, ``self.x: int = 0``), which RestrictedPython 9
  does not model at all;
* augmented assignment to attributes and items (``self.count += 1``, ``d[k] += 1``): plain
  state mutation, refused only because RestrictedPython's write guards do not cover it;
* ``match``, ``try/except*`` and ``nonlocal``: standard syntax RestrictedPython has no
  runtime guard for, harmless without that runtime;
* ``metaclass=`` keywords (``class Tool(metaclass=ABCMeta)``).

Not calibrated (they stay ``restricted-python-error``): async functions (a coroutine is
useless as an EnvScaler tool result), ``*`` imports, the reserved names ``print``,
``printed`` and ``builtins`` when bound or read (``import builtins``), and anything
RestrictedPython reports that is not listed above. RestrictedPython's own ``exec``/``eval``
and frame-attribute errors duplicate ``dynamic-eval``/``dunder-access`` and are dropped
when that rule already reported the same line. Its warnings (``print`` without reading
``printed``) are ``restricted-python-warning`` (info in ``standard``). Patterns of ``case``
clauses are left as written (RestrictedPython's rewrites would not compile there); the
policy's own rules still see them. RestrictedPython's compile step is what finds
compile-time-only errors (``return`` outside a function, a misplaced ``from __future__``),
so those show up as ``syntax-error`` only when no uncalibrated RestrictedPython error
stops it from compiling.

RestrictedPython's visitor is recursive and gives up around 300 nested levels (e.g. a
300-term ``a + b + ...``): that is ``restricted-python-incomplete``, a warning in
``standard`` because the policy's own rules are iterative and always cover the whole tree.

Bounds: sources above :data:`MAX_SOURCE_BYTES` (UTF-8) are not parsed; parser and
RestrictedPython failures on hostile input (``RecursionError``, ``MemoryError``, NUL
bytes, lone surrogates) become findings; at most :data:`MAX_FINDINGS` findings are listed
(errors first, then warnings, then info, each by position) plus one ``too-many-findings``.
Python warnings raised while parsing and compiling are captured under a process-wide lock
(the :mod:`warnings` filters are global state; the work is CPU-bound under the GIL anyway,
so checks running one at a time cost no throughput) and become ``python-warning`` findings.
Cost: roughly 3-5 s per MiB of source (ast + RestrictedPython), so 2 MiB stays under ~10 s.
"""

from __future__ import annotations

import warnings

from .ast_rules import AstChecker
from .findings import WARNINGS_LOCK, Sink, parse, utf8_size
from .restricted import restricted_python
from .rules import (
    DANGEROUS_ATTRIBUTES,
    DEFAULT_ALLOWED_IMPORTS,
    MAX_FINDINGS,
    MAX_MESSAGE_CHARS,
    MAX_SOURCE_BYTES,
    POLICY_NAMES,
    RULES,
    SEVERITIES,
    Finding,
    Policy,
    PolicyReport,
    Severity,
    get_policy,
)

__all__ = ["DANGEROUS_ATTRIBUTES", "DEFAULT_ALLOWED_IMPORTS", "MAX_FINDINGS", "MAX_MESSAGE_CHARS", "MAX_SOURCE_BYTES",
           "POLICY_NAMES", "RULES", "SEVERITIES", "Finding", "Policy", "PolicyReport", "Severity", "check_source",
           "get_policy"]


def check_source(source: str, policy: str | Policy = "standard", *, filename: str = "<environment>") -> PolicyReport:
    """Check untrusted Python ``source`` statically (it is parsed, never executed).

    Args:
        source: the module text.
        policy: a policy name (see :func:`get_policy`) or a :class:`Policy`.
        filename: shown in RestrictedPython's compile and in captured warnings only.

    Returns:
        A :class:`PolicyReport`; ``passed`` is False when any finding is an error.
        Hostile input (oversized, too deeply nested, NUL bytes, lone surrogates, floods of
        findings) yields findings, never an exception.

    Raises:
        TypeError: ``source`` is not a ``str`` or ``policy`` is neither a name nor a Policy.
        ValueError: ``policy`` names no known policy.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be str, not {type(source).__name__}")
    if isinstance(policy, str):
        policy = get_policy(policy)
    elif not isinstance(policy, Policy):
        raise TypeError(f"policy must be a name or a Policy, not {type(policy).__name__}")
    sink = Sink(policy, source)
    size = utf8_size(source)
    if size > MAX_SOURCE_BYTES:
        sink.add("too-large", None, None, f"source is {size} bytes or more, over the {MAX_SOURCE_BYTES}-byte limit; not parsed")
        return sink.report()
    with WARNINGS_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = parse(source, filename, sink)
        if tree is not None:
            AstChecker(policy, sink).check(tree)
            restricted_python(tree, filename, sink)
    for warning in caught:
        if warning.filename == filename and issubclass(warning.category, (SyntaxWarning, DeprecationWarning)):
            sink.add("python-warning", warning.lineno, None, f"{warning.category.__name__}: {warning.message}")
        else:  # another thread's warning caught in our window: hand it back
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return sink.report()
