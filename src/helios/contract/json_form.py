"""The semantic JSON form: ``{"contract": <ServingContract>, "manifest": <ExecutionManifest>}``.

Field names are the .proto names (snake_case), enums are written by name, 64-bit integers as
decimal strings (protobuf's canonical JSON mapping). Reading is strict: an unknown field, a
value of the wrong JSON type, an unknown enum name or an out-of-range integer is rejected
with the path of the offending field, before protobuf's own parser sees the document. The
text itself must be standard JSON: a key repeated in one object (where Python's json module
would keep the last silently) and the bare constants ``NaN``, ``Infinity`` and ``-Infinity``
are rejected with their path (a double's special values are written as the strings "NaN",
"Infinity" and "-Infinity", as protobuf's JSON mapping has them).
"""

from __future__ import annotations

import json
import math

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.rules import fail, require

F = FieldDescriptor
TOP_LEVEL = ("contract", "manifest")
_INT_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
_SPECIAL_FLOATS = ("NaN", "Infinity", "-Infinity")


def to_json(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> str:
    """Canonical semantic JSON of both documents (stable key order, two-space indent)."""
    document = {
        "contract": json_format.MessageToDict(contract, preserving_proto_field_name=True),
        "manifest": json_format.MessageToDict(manifest, preserving_proto_field_name=True),
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def from_json(text: str) -> tuple[spb.ServingContract, mpb.ExecutionManifest]:
    """Parse the semantic JSON form into the two messages; raise `ContractError` on any defect."""
    try:
        document = json.loads(text, object_pairs_hook=_Object, parse_constant=_Constant)
    except (ValueError, RecursionError) as error:
        fail("", f"not valid JSON: {error}")
    _check_standard(document)
    require(isinstance(document, dict), "", "the document is a JSON object with 'contract' and 'manifest'")
    for key in document:
        require(key in TOP_LEVEL, str(key), "unknown field (expected 'contract' and 'manifest')")
    for key in TOP_LEVEL:
        require(key in document, key, "required")
    contract = _parse(document["contract"], spb.ServingContract(), "contract")
    manifest = _parse(document["manifest"], mpb.ExecutionManifest(), "manifest")
    return contract, manifest


class _Object(dict):
    """A JSON object as read, remembering the first key its text repeats (if any)."""

    duplicate: str | None = None

    def __init__(self, pairs):
        super().__init__()
        for key, value in pairs:
            if key in self and self.duplicate is None:
                self.duplicate = key
            self[key] = value


class _Constant:
    """Stands in for a bare NaN, Infinity or -Infinity until its path is known."""

    def __init__(self, name: str):
        self.name = name


def _check_standard(document) -> None:
    """Reject a repeated key or a non-standard constant, naming its path (outer objects first)."""
    stack = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Constant):
            fail(path, f"{value.name} is not a JSON value (write a double's special values as the string "
                       f"\"{value.name}\")")
        if isinstance(value, dict):
            if value.duplicate is not None:
                fail(_join(path, value.duplicate), "duplicate key (each field may appear once per object)")
            stack.extend((_join(path, key), item) for key, item in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _parse(value, message: Message, path: str):
    check_json_message(value, message.DESCRIPTOR, path)
    try:
        json_format.ParseDict(value, message, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as error:
        fail(path, f"invalid JSON value: {error}")
    return message


def check_json_message(value, descriptor: Descriptor, path: str) -> None:
    """Check one JSON object against a message descriptor, recursively."""
    require(isinstance(value, dict), path, f"expected a JSON object for {descriptor.name}")
    oneofs: dict[str, str] = {}
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            fail(f"{path}.{key}", f"unknown field of {descriptor.name}")
        if field.containing_oneof is not None:
            group = field.containing_oneof.name
            require(group not in oneofs, f"{path}.{key}", f"only one of oneof '{group}' may be set ({oneofs.get(group)})")
            oneofs[group] = key
        field_path = f"{path}.{key}"
        if field.is_repeated:
            require(isinstance(item, list), field_path, "expected a JSON array")
            for i, element in enumerate(item):
                _check_value(element, field, f"{field_path}[{i}]")
        else:
            _check_value(item, field, field_path)


def _check_value(value, field: FieldDescriptor, path: str) -> None:
    kind = field.type
    require(value is not None, path, "null is not a value; omit the field instead")
    if kind == F.TYPE_MESSAGE:
        check_json_message(value, field.message_type, path)
    elif kind == F.TYPE_ENUM:
        _check_enum(value, field, path)
    elif kind == F.TYPE_BOOL:
        require(isinstance(value, bool), path, "expected true or false")
    elif kind in (F.TYPE_STRING, F.TYPE_BYTES):
        require(isinstance(value, str), path, "expected a JSON string")
    elif kind in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in _SPECIAL_FLOATS
        require(ok, path, "expected a number")
        if isinstance(value, float):
            require(not math.isinf(value), path, "number out of range")
    else:
        _check_integer(value, kind, path)


def _check_enum(value, field: FieldDescriptor, path: str) -> None:
    enum = field.enum_type
    if isinstance(value, str):
        require(value in enum.values_by_name, path, f"unknown {enum.name} name {value!r}")
    else:
        require(isinstance(value, int) and not isinstance(value, bool), path, f"expected a {enum.name} name")
        require(-(2**31) <= value < 2**31, path, f"{enum.name} value out of range")


def _check_integer(value, kind: int, path: str) -> None:
    if isinstance(value, str):
        text = value[1:] if value.startswith("-") else value
        require(text.isdigit() and text.isascii(), path, "expected an integer")
        require(len(text) <= 20, path, "integer out of range")
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    require(isinstance(value, int) and not isinstance(value, bool), path, "expected an integer")
    low, high = _INT_RANGES[kind]
    require(low <= value <= high, path, f"integer {value} is out of range [{low}, {high}]")
