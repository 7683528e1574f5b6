"""The llguidance JSON options (``x-guidance``) a client's schema may set.

llguidance reads the ``x-guidance`` object at the top level of a JSON schema (a ``response_format``
``json_schema``, a ``%json`` schema inside a request's Lark grammar, a tool's ``parameters``; never
deeper) as options of that schema's compile. Some of them decide what is written between and inside
JSON tokens, so a client setting them got output the server promises never to write: a
``whitespace_pattern`` of ``[a-z]+`` wrote letters between the tokens of a ``json_schema`` answer
(no JSON), and a tool's ``whitespace_pattern`` (or ``item_separator``, ``key_separator``) spelled
the JSON-call block closer ``</tool_call>`` inside the arguments, where the parser ends the call.
``json_allowed_escapes`` and ``json_allow_general_unicode_escapes`` change how strings are written
(the latter writes escapes past a string's ``pattern``).

Policy: a client may set only `CLIENT_OPTIONS`, each true or false, which keep every output JSON
the parsers read: ``coerce_one_of`` (``oneOf`` read as ``anyOf``), ``lenient`` (keywords llguidance
does not implement are ignored) and ``whitespace_flexible`` (JSON whitespace between tokens). Any
other option, a value that is not a boolean, or an ``x-guidance`` that is not an object is a 400
naming it (`option_error`), rather than dropped, so a client learns that its option does not hold.
Where the server sets an option itself it wins over the schema's (tool arguments are always
``lenient``); the server's ``json_defaults`` are defaults a schema's allowed options may change.
"""

from __future__ import annotations

from typing import Any, Mapping

from helios.frontend.structured.grammar_lark_depth import embedded_schemas

OPTIONS_KEY = "x-guidance"
CLIENT_OPTIONS = ("coerce_one_of", "lenient", "whitespace_flexible")


def option_error(schema: Any) -> str:
    """Why a client's JSON `schema` sets an llguidance option it may not (its error for a client,
    naming the option), or "" when its ``x-guidance`` is absent, null or within `CLIENT_OPTIONS`."""
    options = schema.get(OPTIONS_KEY) if isinstance(schema, Mapping) else None
    if options is None:
        return ""
    if not isinstance(options, Mapping):
        return f"{OPTIONS_KEY} must be an object of llguidance options"
    for name, value in options.items():
        if name not in CLIENT_OPTIONS:
            return (f"{OPTIONS_KEY} option {str(name)[:80]!r} cannot be set by a request (it can make the output "
                    f"something other than JSON): only {', '.join(CLIENT_OPTIONS)} may be, each true or false")
        if not isinstance(value, bool):
            return f"{OPTIONS_KEY} option {name!r} must be true or false"
    return ""


def lark_option_error(source: str) -> str:
    """`option_error` of the first ``%json`` schema inside the Lark grammar `source` (nested
    ``%lark`` grammars included) that has one, or ""."""
    for schema in embedded_schemas(source):
        error = option_error(schema)
        if error:
            return f"its %json schema: {error}"
    return ""


def client_options(schema: Any) -> dict:
    """The options of `schema`'s ``x-guidance`` a client may set (the others, which `option_error`
    refuses before a grammar is built, left out), for merging under the server's own."""
    options = schema.get(OPTIONS_KEY) if isinstance(schema, Mapping) else None
    if not isinstance(options, Mapping):
        return {}
    return {name: value for name, value in options.items() if name in CLIENT_OPTIONS and isinstance(value, bool)}
