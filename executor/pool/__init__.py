"""Backend-neutral placement of sessions into sandboxes that a driver starts.

:class:`SandboxPool` (:mod:`.pool`) places sessions and one-shot jobs, keeps warm sets
(:mod:`.warm`), admits by measured memory (:mod:`.admission`) and recycles; it drives
sandboxes only through :class:`SandboxDriver` and :class:`SandboxHandle` (:mod:`.driver`).
Beside it: the host-side session handle (:mod:`.session`) and the placement protocol it
depends on (:mod:`.placement`), repeated configs and initial states (:mod:`.configs`),
one-shot jobs (:mod:`.oneshot`, their checks in :mod:`.jobs`) and the runner protocol's
host end, which drivers carry their requests with (:mod:`.channel`). Nothing here knows a
backend: a backend folder (``executor/docker``) imports this package, never the reverse.
"""

from .driver import SandboxDriver, SandboxHandle
from .pool import SandboxPool

__all__ = ["SandboxDriver", "SandboxHandle", "SandboxPool"]
