"""The static policy as the API uses it (``sandpit.executor.policy``, through the
adapter): check code and summarize a report in one line for error messages."""

from __future__ import annotations

from ..sandboxes import PolicyReport, check_source

__all__ = ["check_source", "policy_summary"]


def policy_summary(report: PolicyReport, limit: int = 5) -> str:
    """``"2 error(s): line 3:4 dunder-access: ...; ..."`` (first ``limit`` errors)."""
    errors = [f for f in report.findings if f.severity == "error"]
    parts = [f"line {f.line}:{f.col} {f.rule}: {f.message}" for f in errors[:limit]]
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return f"{len(errors)} error(s): " + "; ".join(parts) + more
