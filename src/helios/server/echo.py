"""Client text echoed back in error messages and written to the access log, bounded.

An error that names what the client sent (a field name, a path, a number) helps the client; one
that repeats a 60 KB path or a 4,300-digit number back to it (and into the log) helps nobody and
costs bytes on every refusal. `clipped` keeps the first `MAX_ECHO_CHARS` characters of such a text
and says how long it was; `clipped_runs` does the same inside a message for each unbroken run of
non-space characters (an echoed value), leaving the words around it whole.
"""

from __future__ import annotations

import re

MAX_ECHO_CHARS = 200
MAX_MESSAGE_CHARS = 2000  # a whole error message: several echoed values and their sentences
_LONG_RUN = re.compile(r"\S{%d,}" % (MAX_ECHO_CHARS + 1))


def clipped(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`text`, or its first `limit` characters, an ellipsis and its length when it is longer."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def clipped_runs(message: str) -> str:
    """`message` with every run of non-space characters longer than `MAX_ECHO_CHARS` clipped, and
    the whole at most about `MAX_MESSAGE_CHARS`."""
    if len(message) > MAX_ECHO_CHARS:
        message = _LONG_RUN.sub(lambda match: clipped(match.group()), message)
    return clipped(message, MAX_MESSAGE_CHARS)
