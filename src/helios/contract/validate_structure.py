"""Schema-level rules applied to every decoded message, before any semantic rule.

- No unknown fields: a field number this schema does not define is rejected (the document was
  written for a newer or different schema, and a runtime must not serve what it cannot read).
- Every enum field of a present message holds a value the schema defines, and never the
  UNSPECIFIED zero, which selects nothing. Fields with explicit presence (proto3 `optional`,
  oneof members) are checked only when set.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from helios.contract.rules import fail


def check_structure(message: Message, path: str) -> None:
    """Raise `ContractError` at the first unknown field or unknown/unspecified enum value."""
    unknown = UnknownFieldSet(message)
    if len(unknown):
        fail(path, f"unknown field number {unknown[0].field_number} (not in this schema)")
    for field in message.DESCRIPTOR.fields:
        field_path = f"{path}.{field.name}"
        if field.is_repeated:
            _check_repeated(field, getattr(message, field.name), field_path)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if message.HasField(field.name):
                check_structure(getattr(message, field.name), field_path)
        elif field.type == FieldDescriptor.TYPE_ENUM:
            if field.has_presence and not message.HasField(field.name):
                continue
            _check_enum(field, getattr(message, field.name), field_path)


def _check_repeated(field: FieldDescriptor, values, path: str) -> None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        for i, value in enumerate(values):
            check_structure(value, f"{path}[{i}]")
    elif field.type == FieldDescriptor.TYPE_ENUM:
        for i, value in enumerate(values):
            _check_enum(field, value, f"{path}[{i}]")


def _check_enum(field: FieldDescriptor, value: int, path: str) -> None:
    enum = field.enum_type
    if value == 0:
        fail(path, f"{enum.values_by_number[0].name} selects nothing; choose a {enum.name} value")
    if value not in enum.values_by_number:
        fail(path, f"unknown {enum.name} value {value}")
