"""What PID 1's one-shot jobs (``pid1_jobs``) accept and report (stdlib only): the
fields of ``exec`` and ``checks`` requests forwarded to a job process, validated against
the caps of ``limits.py``; a check's result read from a job process's frame; the result
of a check PID 1 reports itself. Malformed requests raise ValueError (the runner answers
``fault``).

A ``checks`` request carries its two states' JSON texts as the two attachments of its
frame (``attached.py``; or as base64, ``initial_state_b64`` and ``final_state_b64``),
which PID 1 forwards to the zygote as those bytes, spliced into its frame
(``protocol.encode_raw``) without parsing them: a 1.5 MB state costs PID 1 neither a
depth check, a parse and an encode nor (attached) a base64 decode. The zygote parses
them and checks their shape (``child_restore.decode_state``).
PID 1 also names the states whose text holds no rendering's tag (no string that begins
with ``$``: neither ``"$`` nor the escape ``\\u0024`` occurs in it), whose values the
zygote then takes as parsed instead of walking them for tags (``untagged``).
"""

from __future__ import annotations

from .limits import MAX_CHECK_SOURCE_BYTES, MAX_CHECKS, MAX_CODE_BYTES, MAX_STDIN_BYTES, check_files
from .wire import check_result, state_text_field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

    from .protocol import CheckResult, ChecksRequest, ExecRequest
    from .wire import CheckFields


def exec_request(msg: ExecRequest) -> dict[str, Any]:
    """The fields of an ``exec`` request forwarded to the job process, validated."""
    code, stdin, files = msg.get("code"), msg.get("stdin"), msg.get("files")
    if not isinstance(code, str) or len(code.encode("utf-8", "replace")) > MAX_CODE_BYTES:
        raise ValueError(f"field 'code' must be a string of at most {MAX_CODE_BYTES} bytes")
    if stdin is not None and (not isinstance(stdin, str)
                              or len(stdin.encode("utf-8", "replace")) > MAX_STDIN_BYTES):
        raise ValueError(f"field 'stdin' must be a string of at most {MAX_STDIN_BYTES} bytes")
    files = check_files({} if files is None else files)
    return {"code": code, "stdin": stdin or "", "files": files}


def checks_request(msg: ChecksRequest) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The fields of a ``checks`` request forwarded to the job process, validated, and its
    states' JSON texts (``initial_state``, ``final_state``: bytes forwarded unparsed;
    their sizes were bounded by the host frame cap), each ``wire.state_text_field``.
    ``untagged`` names the states no string of which can begin with ``$`` (module
    docstring)."""
    checks = msg.get("checks")
    if not isinstance(checks, list) or not 1 <= len(checks) <= MAX_CHECKS:
        raise ValueError(f"field 'checks' must be a list of 1 to {MAX_CHECKS} checks")
    sources = []
    for index, check in enumerate(checks):
        source = check.get("check_func") if isinstance(check, dict) else None
        if not isinstance(source, str) or len(source.encode("utf-8", "replace")) > MAX_CHECK_SOURCE_BYTES:
            raise ValueError(f"checks[{index}].check_func must be a string of at most "
                             f"{MAX_CHECK_SOURCE_BYTES} bytes")
        sources.append(source)
    states = _states(msg)
    env_source = msg.get("source")
    if env_source is not None and (not isinstance(env_source, str)
                                   or len(env_source.encode("utf-8", "replace")) > MAX_CODE_BYTES):
        raise ValueError(f"field 'source' must be a string of at most {MAX_CODE_BYTES} bytes")
    untagged = [name for name, data in states.items() if _untagged(data)]
    return {"checks": sources, "source": env_source, "untagged": untagged}, states


def _states(msg: ChecksRequest) -> dict[str, bytes]:
    """The two states' JSON texts: the frame's two attachments (``attached.py``), each a
    JSON object's text on its face (``{`` to ``}``), else ``initial_state_b64`` and
    ``final_state_b64`` (``wire.state_text_field``). Raises ValueError."""
    attached = msg.get("attached")
    if attached is None:
        return {name: state_text_field(msg, f"{name}_b64") for name in ("initial_state", "final_state")}
    if (type(attached) is not list or len(attached) != 2
            or not all(type(text) is bytes and text.startswith(b"{") and text.endswith(b"}") for text in attached)):
        raise ValueError("a checks request's attachments must be the JSON texts of its two states")
    return {"initial_state": attached[0], "final_state": attached[1]}


def _untagged(data: bytes) -> bool:
    """Whether no string in the JSON text ``data`` can begin with ``$`` (neither ``"$``
    nor the escape ``\\u0024`` occurs): one-byte scans first, which find most texts free
    of ``$`` and of escapes at once, then the two searches only when they are needed."""
    return ((b"$" not in data or b'"$' not in data)
            and (b"\\" not in data or b"\\u0024" not in data))


def check_result_at(msg: dict[str, Any], index: int) -> CheckFields | None:
    """The result of check ``index`` in a frame from the job process (``wire.check_result``);
    None when it is another check's or malformed (the process is then treated as crashed)."""
    return check_result(msg) if msg.get("index") == index else None


def failed(status: str, error: str, duration_ms: float, stdout: str = "", stderr: str = "") -> CheckResult:
    """The result of a check that PID 1 reports itself (it timed out, its process died)."""
    return {"status": status, "passed": False, "result": None, "error": error, "traceback": None,
            "duration_ms": duration_ms, "stdout": stdout, "stderr": stderr}
