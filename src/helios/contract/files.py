"""The two file forms `helios contract` commands read and write.

- Semantic JSON (`.json`): ``{"contract": {...}, "manifest": {...}}``, see json_form.py.
- Binary: one encoded `helios.contract.PreparedContractBundle` message (manifest.proto) whose
  `contract` and `manifest` fields hold the two wire encodings.

A file is JSON when its first non-whitespace byte is ``{``; a bundle can never start with that
byte (it would be field 15 with wire type 3, which the bundle does not define). Other JSON that is
not a bundle either (an array, a string) is refused as such, not as a corrupt bundle.
"""

from __future__ import annotations

import json
from pathlib import Path

from helios.contract.prepared import PreparedContract
from helios.contract.rules import fail
from helios.errors import ContractError

_WHITESPACE = b" \t\r\n"
_UTF8_BOM = b"\xef\xbb\xbf"


def is_json(data: bytes) -> bool:
    return data.lstrip(_WHITESPACE)[:1] == b"{"


def load_bytes(data: bytes) -> PreparedContract:
    """Decode either file form; raise `ContractError` on any defect."""
    if not data.strip(_WHITESPACE):  # an empty bundle would parse, then fail as a contract without a model
        fail("", "the file is empty (expected semantic JSON or a binary PreparedContractBundle)")
    if data.startswith(_UTF8_BOM):
        fail("", "the JSON starts with a UTF-8 byte order mark; save it without one")
    if is_json(data):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            fail("", f"JSON is not UTF-8: {error}")
        return PreparedContract.from_json(text)
    try:
        return PreparedContract.from_bundle(data)
    except ContractError:
        # JSON whose top level is not an object (`[]`, a string) is not a bundle either, but the
        # parser's "Wire format was corrupt" would send its author looking for a binary file.
        kind = _json_value_kind(data)
        if kind is None:
            raise
    fail("", f"the file is a JSON {kind}; a JSON contract file is one object: "
             '{"contract": {...}, "manifest": {...}}')


def _json_value_kind(data: bytes) -> str | None:
    """What JSON value `data`, no object (`is_json` takes those), holds: an array that does not
    parse is still an array; None when it is no JSON at all."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "array" if data.lstrip(_WHITESPACE)[:1] == b"[" else None
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def load_file(path: str | Path) -> PreparedContract:
    """Read and decode a contract file (OSError propagates to the caller)."""
    return load_bytes(Path(path).read_bytes())
