"""Host side of one-shot jobs (scripts and check functions): argument checks before
anything is sent, and validation of what the sandbox answers (nothing it sends is
trusted: types, sizes and counts are checked here again).

Caps come from :mod:`sandpit.sandbox_images.runner.limits`, which the sandbox applies
too: ``MAX_CHECKS`` (256) checks per call, ``MAX_CHECK_SOURCE_BYTES`` (64 KiB) per
``check_func``, ``MAX_STATE_BYTES`` (16 MiB) per state; ``MAX_CODE_BYTES`` (4 MiB) per
script, ``MAX_STDIN_BYTES`` (4 MiB), ``MAX_FILES`` (64) files of at most
``MAX_FILE_BYTES`` (4 MiB), ``MAX_FILES_TOTAL_BYTES`` (8 MiB) in all, paths checked by
``limits.check_file_path``. The pool's methods (:meth:`SandboxPool.run_checks`,
:meth:`SandboxPool.execute`) use these; they raise :class:`ArgumentError` for bad arguments and
:class:`SessionError` for a malformed reply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from sandpit.sandbox_images.runner import limits, wire

from ..errors import ArgumentError, SessionError
from ..profiles import ResourceProfile
from ..results import STATUSES, CheckResult, ExecResult
from .state_text import state_text

if TYPE_CHECKING:
    from sandpit.sandbox_images.runner.protocol import ChecksReply, ExecReply, Reply

SNIPPET_KEYS = frozenset({"code", "stdin", "files", "timeout_s"})
BATCH_SLACK_S = limits.BATCH_SLACK_S + limits.STARTUP_S
"""A check batch may take its per-check timeout times the number of checks plus this
(process starts after timeouts and crashes, restoring the states)."""


@dataclass(frozen=True)
class ExecRequest:
    """A validated script run: the fields of the runner's ``exec`` request."""

    code: str
    stdin: str | None
    files: dict[str, str]
    timeout_s: float

    def fields(self) -> dict[str, Any]:
        return {"code": self.code, "stdin": self.stdin, "files": self.files, "time_limit_s": self.timeout_s}


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ArgumentError(f"{what} is not valid text (it contains a lone surrogate)") from None


def check_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not tenant or len(tenant) > limits.TENANT_MAX_CHARS:
        raise ArgumentError(f"tenant must be a non-empty string of at most {limits.TENANT_MAX_CHARS} characters")
    return tenant


def _timeout(value: object, profile: ResourceProfile, default: float, what: str) -> float:
    if value is None:
        return min(default, profile.call_timeout_s)
    if not (type(value) is int or type(value) is float) or not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"{what} must be a positive number of seconds")
    if value > profile.call_timeout_s:
        raise ArgumentError(f"{what}={value:g} is above the profile's call_timeout_s={profile.call_timeout_s:g}")
    return float(value)


def check_checks(checks: object, initial_state: object, final_state: object, profile: ResourceProfile,
                 per_check_timeout_s: object, source: object = None) -> tuple[float, bytes, bytes]:
    """Validate :meth:`SandboxPool.run_checks` arguments; returns the per-check timeout
    in seconds (default ``min(limits.DEFAULT_CHECK_TIMEOUT_S, call_timeout_s)``) and the
    JSON texts of the two states as the runner gets them (:func:`check_state`).

    Raises:
        ArgumentError: ``checks`` is not a list of at most ``MAX_CHECKS`` objects with a
            string ``check_item`` (at most ``MAX_CHECK_ITEM_CHARS``) and a string
            ``check_func`` (at most ``MAX_CHECK_SOURCE_BYTES`` UTF-8 bytes); a state is not
            an encoded state (:func:`check_state`) of at most ``MAX_STATE_BYTES``;
            ``source`` is neither None nor text of at most ``MAX_CODE_BYTES``; the
            timeout is not positive or above the profile's.
    """
    if not isinstance(checks, list):
        raise ArgumentError("checks must be a list of {check_item, check_func} objects")
    if len(checks) > limits.MAX_CHECKS:
        raise ArgumentError(f"at most {limits.MAX_CHECKS} checks may run in one call (got {len(checks)})")
    for index, check in enumerate(checks):
        if not isinstance(check, dict) or not set(check) <= {"check_item", "check_func"}:
            raise ArgumentError(f"checks[{index}] must be an object with keys check_item and check_func")
        item, check_source = check.get("check_item"), check.get("check_func")
        if not isinstance(item, str) or len(item) > limits.MAX_CHECK_ITEM_CHARS:
            raise ArgumentError(f"checks[{index}].check_item must be a string of at most "
                             f"{limits.MAX_CHECK_ITEM_CHARS} characters")
        _utf8_size(item, f"checks[{index}].check_item")
        if not isinstance(check_source, str):
            raise ArgumentError(f"checks[{index}].check_func must be a string of Python source")
        size = _utf8_size(check_source, f"checks[{index}].check_func")
        if size > limits.MAX_CHECK_SOURCE_BYTES:
            raise ArgumentError(f"checks[{index}].check_func has {size} bytes; at most "
                             f"{limits.MAX_CHECK_SOURCE_BYTES} are allowed")
    initial_text, final_text = check_state(initial_state, "initial_state"), check_state(final_state, "final_state")
    if source is not None:
        if not isinstance(source, str):
            raise ArgumentError("source must be the environment's Python source (a string) or None")
        if _utf8_size(source, "source") > limits.MAX_CODE_BYTES:
            raise ArgumentError(f"source is over {limits.MAX_CODE_BYTES} bytes")
    timeout_s = _timeout(per_check_timeout_s, profile, limits.DEFAULT_CHECK_TIMEOUT_S, "per_check_timeout_s")
    return timeout_s, initial_text, final_text


def encode_json_state(state: dict[str, Any]) -> dict[str, list[Any]]:
    """A plain JSON state (attribute name -> JSON value, e.g. a validation case written
    by hand) as an encoded state: every attribute ``["j", value]``. Tags of the state
    rendering in it (``{"$set": [...]}``, ``{"$date": ...}``) become real objects in the
    check's process (``child_restore.unrender``)."""
    return {name: ["j", value] for name, value in state.items()}


@dataclass(frozen=True)
class PreparedState:
    """A state for check batches, validated and encoded once (:func:`prepare_state`): its
    JSON text as the runner gets it (:func:`check_state`). A caller that sends one state
    with many batches passes this instead of the encoded state, and the encoding is not
    done again per batch: an episode's initial state is the same for every evaluation of
    every episode started from one config (``sandpit.api.services.checks`` keeps them by
    state root). Constructing one checks the text's size cap and outer braces; only
    :func:`prepare_state` checks the rest.

    Raises:
        ArgumentError: ``text`` is not bytes of a JSON object's text on its face (``{``
            to ``}``) of at most ``MAX_STATE_BYTES``.
    """

    text: bytes

    def __post_init__(self) -> None:
        if (type(self.text) is not bytes or len(self.text) > limits.MAX_STATE_BYTES
                or not self.text.startswith(b"{") or not self.text.endswith(b"}")):
            raise ArgumentError(f"a prepared state is the JSON text of an object of at most "
                                f"{limits.MAX_STATE_BYTES} bytes")

    def encoded(self) -> dict[str, Any]:
        """The encoded state again (attribute name -> ``[kind, data]``, pickles without
        their renderings): what an executor that does not send texts takes (the Ray
        backend's link, the fake executor). Raises ArgumentError (not JSON)."""
        try:
            value = orjson.loads(self.text)
        except orjson.JSONDecodeError as exc:
            raise ArgumentError(f"a prepared state is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ArgumentError("a prepared state must be a JSON object")
        return value


def unprepared(state: Any) -> Any:
    """``state`` as given, or a :class:`PreparedState`'s encoded state again (its text
    parsed): for an executor that takes JSON values, not texts (the Ray backend's link,
    the fake executor). Raises ArgumentError as :meth:`PreparedState.encoded`."""
    return state.encoded() if isinstance(state, PreparedState) else state


def prepare_state(state: object, name: str = "state") -> PreparedState:
    """``state`` (an encoded state, as :func:`check_state` takes) validated and encoded
    for any number of check batches. Raises ArgumentError as :func:`check_state`."""
    return PreparedState(check_state(state, name))


def check_state(state: object, name: str) -> bytes:
    """A state for the checks: an *encoded* state (attribute name -> ``["j", value]`` |
    ``["p", base64]`` | ``["u", rendering]``, the executor's state encoding, see
    :mod:`sandpit.executor.results`) that encodes as JSON (finite numbers, text encodable
    as UTF-8) in at most ``MAX_STATE_BYTES``. Returns that JSON text as the runner gets it
    (compact UTF-8, without the renderings of pickled values: the check's process
    restores the pickle itself, and the rendering would only add to the frame). Pickles
    are restored to real objects in the check's process; a :class:`PreparedState` gives
    its text as it is. Raises ArgumentError."""
    if type(state) is PreparedState:
        return state.text
    if not isinstance(state, dict):
        raise ArgumentError(f"{name} must be an object (attribute name -> encoded value)")
    for key, entry in state.items():
        if not isinstance(key, str) or not wire.is_encoded_entry(entry):
            raise ArgumentError(f"{name}[{str(key)[:64]!r}] is not an encoded value ([kind, data])")
    bare = {key: entry[:2] if entry[0] == "p" else entry for key, entry in state.items()}
    try:
        text = state_text(bare)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ArgumentError(f"{name} is not JSON-encodable: {str(exc)[:200]}") from None
    if len(text) > limits.MAX_STATE_BYTES:
        raise ArgumentError(f"{name} has {len(text)} bytes of JSON; at most {limits.MAX_STATE_BYTES} are allowed")
    return text


def check_exec(code: object, stdin: object, files: object, timeout_s: object,
               profile: ResourceProfile) -> ExecRequest:
    """Validate :meth:`SandboxPool.execute` arguments.

    Raises:
        ArgumentError: ``code`` not a string of at most ``MAX_CODE_BYTES``; ``stdin`` not
            None or a string of at most ``MAX_STDIN_BYTES``; ``files`` not None or an
            object of relative paths (``check_file_path``: no absolute paths, no ``..``)
            to text within the file caps, or bigger than the profile's work tmpfs;
            ``timeout_s`` not positive or above the profile's ``call_timeout_s``.
    """
    if not isinstance(code, str):
        raise ArgumentError("code must be a string of Python source")
    if _utf8_size(code, "code") > limits.MAX_CODE_BYTES:
        raise ArgumentError(f"code has more than {limits.MAX_CODE_BYTES} bytes")
    if stdin is not None:
        if not isinstance(stdin, str):
            raise ArgumentError("stdin must be a string or None")
        if _utf8_size(stdin, "stdin") > limits.MAX_STDIN_BYTES:
            raise ArgumentError(f"stdin has more than {limits.MAX_STDIN_BYTES} bytes")
    try:
        files = limits.check_files({} if files is None else files)
    except ValueError as exc:  # the runner's own rule for paths and sizes
        raise ArgumentError(str(exc)) from None
    total = sum(len(text.encode("utf-8")) for text in files.values())
    if total > profile.tmpfs_mib * 1024 * 1024 // 2:
        raise ArgumentError(f"files total {total} bytes; the profile's work space holds at most "
                         f"{profile.tmpfs_mib * 1024 * 1024 // 2}")
    return ExecRequest(code=code, stdin=stdin, files=files,
                       timeout_s=_timeout(timeout_s, profile, profile.call_timeout_s, "timeout_s"))


def check_snippets(snippets: object, concurrency: object, profile: ResourceProfile) -> list[ExecRequest]:
    """Validate :meth:`SandboxPool.execute_many` arguments: a list of at most
    ``MAX_SNIPPETS`` objects with ``code`` and optional ``stdin``, ``files``,
    ``timeout_s`` (each as in :func:`check_exec`); ``concurrency`` an int in 1..
    ``MAX_EXEC_CONCURRENCY``. Raises ArgumentError naming the snippet."""
    if type(concurrency) is not int or not 1 <= concurrency <= limits.MAX_EXEC_CONCURRENCY:
        raise ArgumentError(f"concurrency must be an integer from 1 to {limits.MAX_EXEC_CONCURRENCY}")
    if not isinstance(snippets, list) or len(snippets) > limits.MAX_SNIPPETS:
        raise ArgumentError(f"snippets must be a list of at most {limits.MAX_SNIPPETS} objects")
    requests = []
    for index, snippet in enumerate(snippets):
        if not isinstance(snippet, dict) or "code" not in snippet or not set(snippet) <= SNIPPET_KEYS:
            raise ArgumentError(f"snippets[{index}] must be an object with 'code' and optional "
                             "'stdin', 'files', 'timeout_s'")
        try:
            requests.append(check_exec(snippet["code"], snippet.get("stdin"), snippet.get("files"),
                                       snippet.get("timeout_s"), profile))
        except ArgumentError as exc:
            raise ArgumentError(f"snippets[{index}]: {exc}") from None
    return requests


# -- replies -----------------------------------------------------------------------------
def _text(value: object, cap: int, what: str) -> str:
    if not isinstance(value, str) or len(value) > cap:
        raise SessionError(f"sandbox sent a malformed {what}")
    return value


def _optional_text(value: object, cap: int, what: str) -> str | None:
    return None if value is None else _text(value, cap, what)


def _duration(value: object, what: str) -> float:
    if not (type(value) is int or type(value) is float) or not 0 <= value < 1e9:
        raise SessionError(f"sandbox sent a malformed {what}")
    return float(value)


def _status(reply: Reply | dict[str, Any], what: str) -> str:
    status = reply.get("status")
    if status == "fault":
        raise SessionError(f"sandbox refused the {what}: {str(reply.get('message'))[:500]}")
    if status not in STATUSES:
        raise SessionError(f"sandbox sent a malformed {what} status")
    return str(status)


def parse_check_results(reply: ChecksReply, checks: list[dict[str, Any]]) -> tuple[list[CheckResult], int]:
    """The runner's ``checks`` reply as one :class:`CheckResult` per check (in order),
    and how many fresh processes the batch needed beyond the first.

    Raises:
        SessionError: the runner refused the request (``fault``), or the reply is not
            ``len(checks)`` well-formed results within the caps.
    """
    _status(reply, "check batch")
    results: object = reply.get("results")
    restarts: object = reply.get("restarts")
    if not isinstance(results, list) or len(results) != len(checks) or type(restarts) is not int:
        raise SessionError("sandbox sent a malformed check batch reply")
    out = []
    output_cap = limits.CHECK_OUTPUT_CAP_BYTES + 64
    for check, raw in zip(checks, results, strict=True):
        if not isinstance(raw, dict):
            raise SessionError("sandbox sent a malformed check result")
        status = _status(raw, "check result")
        passed = raw.get("passed")
        if type(passed) is not bool:
            raise SessionError("sandbox sent a malformed check result")
        out.append(CheckResult(
            check_item=check["check_item"], passed=passed and status == "ok", status=status,  # type: ignore[arg-type]
            result=_optional_text(raw.get("result"), limits.CHECK_RESULT_TEXT_CAPS["result"], "check result"),
            error=_optional_text(raw.get("error"), limits.CHECK_RESULT_TEXT_CAPS["error"], "check error"),
            traceback=_optional_text(raw.get("traceback"), limits.CHECK_RESULT_TEXT_CAPS["traceback"], "check traceback"),
            stdout=_text(raw.get("stdout", ""), output_cap, "check stdout"),
            stderr=_text(raw.get("stderr", ""), output_cap, "check stderr"),
            duration_ms=_duration(raw.get("duration_ms"), "check duration")))
    return out, restarts


def parse_exec_result(reply: ExecReply, profile: ResourceProfile, duration_ms: float) -> ExecResult:
    """The runner's ``exec`` reply as an :class:`ExecResult` (``duration_ms``: the host's
    round trip). Raises SessionError: refused (``fault``) or malformed (types, output
    over the profile's ``output_cap_bytes``)."""
    status = _status(reply, "script run")
    exit_code: object = reply.get("exit_code")
    if exit_code is not None and (type(exit_code) is not int or not -128 <= exit_code <= 255):
        raise SessionError("sandbox sent a malformed exit code")
    stdout_truncated: object = reply.get("stdout_truncated")
    stderr_truncated: object = reply.get("stderr_truncated")
    if type(stdout_truncated) is not bool or type(stderr_truncated) is not bool:
        raise SessionError("sandbox sent malformed truncation flags")
    cap = profile.output_cap_bytes
    return ExecResult(
        status=status, exit_code=exit_code,  # type: ignore[arg-type]
        stdout=_text(reply.get("stdout"), cap, "stdout"), stderr=_text(reply.get("stderr"), cap, "stderr"),
        stdout_truncated=stdout_truncated, stderr_truncated=stderr_truncated, duration_ms=duration_ms,
        error=_optional_text(reply.get("error"), limits.EXEC_ERROR_CHARS, "error"))


def lost_checks(checks: list[dict[str, Any]], status: str, message: str) -> list[CheckResult]:
    """Every check of a batch whose sandbox died (``status`` from :class:`SandboxLost`)."""
    return [CheckResult(check_item=c["check_item"], passed=False, status=status,  # type: ignore[arg-type]
                        error=message, duration_ms=0.0) for c in checks]


def lost_exec(status: str, message: str, duration_ms: float) -> ExecResult:
    """A script run whose sandbox died (``status`` from :class:`SandboxLost`)."""
    return ExecResult(status=status, exit_code=None, duration_ms=duration_ms, error=message)  # type: ignore[arg-type]
