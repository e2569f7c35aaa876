"""Import of the BFCL multi-turn benchmark (``multi_turn_base``) as Sandpit environments.

The Berkeley Function Calling Leaderboard ships its multi-turn tools as Python classes
(``GorillaFileSystem``, ``TradingBot``, ...) inside the ``bfcl-eval`` wheel, next to the
dataset (user turns, initial configuration per class) and the ground truth (one list of
call strings such as ``"cd(folder='document')"`` per turn). This package turns that wheel
into what Sandpit runs, in steps that each have a module:

* :mod:`.wheel`: fetch the wheel (``sandpit bfcl fetch``; sha256-pinned, cached in
  ``~/.cache/sandpit/bfcl``) and read its members as text;
* :mod:`.codegen`: one :class:`BfclEnvironment` per distinct combination of involved
  classes: a single module (``source_code``) defining ``BfclEnv``, which holds one instance
  of each class as a public attribute named after it (the state) and forwards every public
  method of those classes (the tools);
* :mod:`.calls`: ground-truth call strings parsed (``ast``, literal arguments only) into
  :class:`ToolCall` objects;
* :mod:`.suite`: :func:`load_suite`, one :class:`BfclEpisode` per dataset entry: its
  ``init_config`` (``{"_bfcl": {class name: scenario}}``: the scenarios sit under a
  private key because EnvScaler's instantiation ``setattr``s every config key, and a key
  named after a class would replace that class's instance) and its ground-truth turns;
* :mod:`.replay`: register the environments and replay the ground truth through the API;
* :mod:`.scenarios`: one scenario per episode whose checks compare the final state with
  the ground truth's (BFCL's state checker).

Trust: BFCL's Python source is untrusted. Here it is only read from the wheel as text and
parsed with :func:`ast.parse` (which executes nothing); the generated ``source_code``
embeds it as string literals and runs only inside a sandbox. Every failure of reading or
building is a :class:`BfclImportError` (naming the file, episode id and/or call string).
"""

from .calls import MAX_CALL_CHARS, ToolCall, parse_call
from .codegen import (
    BACKEND_PACKAGE,
    CLASS_NAME,
    CONFIG_KEY,
    ENV_PREFIX,
    STAND_INS,
    BfclEnvironment,
    build_environment,
    embedded_modules,
    environment_name,
)
from .errors import BfclImportError
from .suite import BfclEpisode, BfclSuite, load_suite
from .wheel import (
    ANSWER_MEMBER,
    BACKEND_CONFIG_MEMBER,
    BFCL_VERSION,
    CACHE_ENV,
    DATASET_MEMBER,
    MAX_MEMBER_BYTES,
    WHEEL_FILENAME,
    WHEEL_SHA256,
    cached_wheel,
    default_cache_dir,
    fetch_wheel,
)

__all__ = [
    "ANSWER_MEMBER",
    "BACKEND_CONFIG_MEMBER",
    "BACKEND_PACKAGE",
    "BFCL_VERSION",
    "CACHE_ENV",
    "CLASS_NAME",
    "CONFIG_KEY",
    "DATASET_MEMBER",
    "ENV_PREFIX",
    "MAX_CALL_CHARS",
    "MAX_MEMBER_BYTES",
    "STAND_INS",
    "WHEEL_FILENAME",
    "WHEEL_SHA256",
    "BfclEnvironment",
    "BfclEpisode",
    "BfclImportError",
    "BfclSuite",
    "ToolCall",
    "build_environment",
    "cached_wheel",
    "default_cache_dir",
    "embedded_modules",
    "environment_name",
    "fetch_wheel",
    "load_suite",
    "parse_call",
]
