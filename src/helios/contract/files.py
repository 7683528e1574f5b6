"""The two file forms `helios contract` commands read and write.

- Semantic JSON (`.json`): ``{"contract": {...}, "manifest": {...}}``, see json_form.py.
- Binary: one encoded `helios.contract.PreparedContractBundle` message (manifest.proto) whose
  `contract` and `manifest` fields hold the two wire encodings.

A file is JSON when its first non-whitespace byte is ``{``; a bundle can never start with that
byte (it would be field 15 with wire type 3, which the bundle does not define).
"""

from __future__ import annotations

from pathlib import Path

from helios.contract.prepared import PreparedContract
from helios.contract.rules import fail

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
    return PreparedContract.from_bundle(data)


def load_file(path: str | Path) -> PreparedContract:
    """Read and decode a contract file (OSError propagates to the caller)."""
    return load_bytes(Path(path).read_bytes())
