"""Small helpers shared by the validators: raising `ContractError` at a field path, enum names.

Validators never return partial results: the first violated rule raises `ContractError(path,
message)`, where `path` walks the semantic JSON form, for example
``contract.model.graphs[3].bindings[2].source`` or ``manifest.buffers[1].shape[0]``.
"""

from __future__ import annotations

from typing import NoReturn

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.errors import ContractError

CONTRACT = "contract"
MODEL = "contract.model"
MANIFEST = "manifest"
GRAPHS = "contract.model.graphs"


def fail(path: str, message: str) -> NoReturn:
    """Raise the typed error for a violated rule at `path`."""
    raise ContractError(path, message)


def require(condition: bool, path: str, message: str) -> None:
    """Raise at `path` unless `condition` holds."""
    if not condition:
        fail(path, message)


def enum_label(enum_type, value: int) -> str:
    """The enum value's name without its type prefix (``GRAPH_OPERATION_DECODE`` -> ``DECODE``)."""
    try:
        name = enum_type.Name(value)
    except ValueError:
        return str(value)
    prefix = _prefix(enum_type)
    return name[len(prefix):] if name.startswith(prefix) else name


def _prefix(enum_type) -> str:
    zero = enum_type.DESCRIPTOR.values_by_number[0].name
    return zero[: -len("UNSPECIFIED")]


def op_label(value: int) -> str:
    return enum_label(spb.GraphOperation, value)


def source_label(value: int) -> str:
    return enum_label(spb.ValueSource, value)


def role_label(value: int) -> str:
    return enum_label(mpb.BufferRole, value)


def graph_path(index: int) -> str:
    return f"{GRAPHS}[{index}]"
