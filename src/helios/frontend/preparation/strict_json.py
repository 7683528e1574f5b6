"""Strict JSON text: what `json.loads` reads, less the values JSON has no room for. Python's reader
takes ``NaN``, ``Infinity`` and ``-Infinity`` literals, and reads a number beyond the float range
(``1e999``) as infinity without asking `parse_constant`; `strict_loads` raises `NotStrictJSON` for
each. The request body (`helios.server.body_guard`) and the tool-call arguments a client sends back
(`helios.frontend.preparation.messages`) are read with it.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["NotStrictJSON", "strict_loads"]


class NotStrictJSON(ValueError):
    """A ``NaN``/``Infinity`` literal, or a number out of the float range."""


def strict_loads(text: str) -> Any:
    """`json.loads(text)`, raising `NotStrictJSON` for the values of the module docstring (and
    ValueError or RecursionError as `json.loads` does)."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def _no_constant(name: str) -> Any:
    raise NotStrictJSON(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotStrictJSON(f"number out of range ({text[:40]}); numbers must be finite (at most about 1.8e308 "
                            "in magnitude)")
    return value
