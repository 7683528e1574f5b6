"""Strict JSON text: what `json.loads` reads, less the values JSON has no room for and the objects
readers disagree on. Python's reader takes ``NaN``, ``Infinity`` and ``-Infinity`` literals, reads a
number beyond the float range (``1e999``) as infinity without asking `parse_constant`, and keeps the
last of an object's duplicate keys (``{"max_tokens": 1, "max_tokens": 2000}``), where other readers
keep the first or refuse it (RFC 8259 4: the names within an object SHOULD be unique), so a proxy or
validator in front of the server can read another request than the server serves; `strict_loads`
raises `NotStrictJSON` for each. The request body (`helios.server.body_guard`) and the tool-call
arguments a client sends back (`helios.frontend.preparation.messages`) are read with it; the
arguments may repeat a key (``unique_keys=False``): they are the model's own output, sent back
verbatim as history, which templates render as transformers does.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["NotStrictJSON", "strict_loads"]

MAX_KEY_ECHO_CHARS = 64  # a duplicate key is named in the error, clipped to this many characters


class NotStrictJSON(ValueError):
    """A ``NaN``/``Infinity`` literal, a number out of the float range, or a duplicate key."""


def strict_loads(text: str, *, unique_keys: bool = True) -> Any:
    """`json.loads(text)`, raising `NotStrictJSON` for the values of the module docstring (a repeated
    key only with `unique_keys`; and ValueError or RecursionError as `json.loads` does)."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float,
                      object_pairs_hook=_refuse_repeated_keys if unique_keys else None)


def _no_constant(name: str) -> Any:
    raise NotStrictJSON(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotStrictJSON(f"number out of range ({text[:40]}); numbers must be finite (at most about 1.8e308 "
                            "in magnitude)")
    return value


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) == len(pairs):
        return value
    seen: set[str] = set()
    duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
    shown = duplicate if len(duplicate) <= MAX_KEY_ECHO_CHARS else duplicate[:MAX_KEY_ECHO_CHARS] + "..."
    raise NotStrictJSON(f"the key {json.dumps(shown)} appears twice in one object; send each key once")
