"""Execution-side faults of the scheduling layer (all `ExecutionError`: HTTP 500, never a 503).

Admission rejections live in `helios.runtime.scheduling.admission`; these are the errors of a broken
executor or a broken scheduler, which the engine reports and the tests must never see.
"""

from __future__ import annotations

from helios.errors import ExecutionError


class InvariantViolation(ExecutionError):
    """`check_invariants()` found bookkeeping that contradicts itself (a scheduler bug)."""


class PageAccountingError(InvariantViolation):
    """A page retained while free, or released more often than it was held."""


class UnknownPlan(ExecutionError):
    """`complete` or `fail` named a plan that is not in flight."""


def require(condition: bool, message: str) -> None:
    """Raise `InvariantViolation(message)` unless `condition` holds."""
    if not condition:
        raise InvariantViolation(message)
