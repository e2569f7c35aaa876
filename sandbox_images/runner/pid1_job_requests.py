"""What PID 1's one-shot jobs (``pid1_jobs``) accept and report (stdlib only): the
fields of ``exec`` and ``checks`` requests forwarded to a job process, validated against
the caps of ``limits.py``; a check's result read from a job process's frame; the result
of a check PID 1 reports itself. Malformed requests raise ValueError (the runner answers
``fault``)."""

from __future__ import annotations

from .limits import MAX_CHECK_SOURCE_BYTES, MAX_CHECKS, MAX_CODE_BYTES, MAX_STDIN_BYTES, check_files
from .wire import check_result, is_encoded_entry

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


def checks_request(msg: ChecksRequest) -> dict[str, Any]:
    """The fields of a ``checks`` request forwarded to the job process, validated (the
    states' sizes were bounded by the host frame cap)."""
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
    initial, final, env_source = msg.get("initial_state"), msg.get("final_state"), msg.get("source")
    for name, state in (("initial_state", initial), ("final_state", final)):
        if not isinstance(state, dict) or not all(is_encoded_entry(entry) for entry in state.values()):
            raise ValueError(f"field {name!r} must be an encoded state ({{name: [kind, data]}})")
    if env_source is not None and (not isinstance(env_source, str)
                                   or len(env_source.encode("utf-8", "replace")) > MAX_CODE_BYTES):
        raise ValueError(f"field 'source' must be a string of at most {MAX_CODE_BYTES} bytes")
    return {"checks": sources, "initial_state": initial, "final_state": final, "source": env_source}


def check_result_at(msg: dict[str, Any], index: int) -> CheckFields | None:
    """The result of check ``index`` in a frame from the job process (``wire.check_result``);
    None when it is another check's or malformed (the process is then treated as crashed)."""
    return check_result(msg) if msg.get("index") == index else None


def failed(status: str, error: str, duration_ms: float, stdout: str = "", stderr: str = "") -> CheckResult:
    """The result of a check that PID 1 reports itself (it timed out, its process died)."""
    return {"status": status, "passed": False, "result": None, "error": error, "traceback": None,
            "duration_ms": duration_ms, "stdout": stdout, "stderr": stderr}
