"""What rank zero sends its peers before each step, and its encoding on the wire.

A `StepMessage` carries one `StepPlan` (the same immutable record the executor runs), the admission
values of requests the peers have not seen yet, the requests they may forget, and the grammar
masks of constrained rows: everything a peer's own `Packer` needs to pack exactly the inputs rank
zero packs. Nothing else crosses: peers hold no scheduler and no request state beyond that.

Encoding: UTF-8 JSON of the records' fields in declaration order, each record tagged with its class
name and decoded only into the classes listed in `_RECORDS` / `_ENUMS` (no pickling, no arbitrary
construction). A record class that gains a field changes `wire_signature()`, which every rank
compares at startup, so ranks of different versions refuse to form a group instead of
misreading each other. The bytes travel as a uint8 tensor over `torch.distributed` (see
`helios.runtime.ranks`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any, NamedTuple

from helios.errors import ExecutionError
from helios.runtime.capacities import LengthSource, Operation, ProgramVariant
from helios.runtime.packer import AdmissionValues
from helios.runtime.plan import CopyOp, Location, PlanRow, StepPlan, StorageKind

WIRE_VERSION = 2  # 2: TIMINGS messages (StepMessage.reset)


class MessageKind(enum.IntEnum):
    UNSPECIFIED = 0
    STEP = 1  # run `plan`
    STOP = 2  # leave the group: rank zero is shutting down
    KEEPALIVE = 3  # no plan: every rank answers one small all_reduce (an idle group stays checked)
    TIMINGS = 4  # no plan: every rank answers with its phase timers (one all_gather); `reset` zeroes them


class StepMessage(NamedTuple):
    kind: MessageKind
    plan: StepPlan | None = None
    admissions: tuple[tuple[str, AdmissionValues], ...] = ()  # (request id, values), new to the peers
    forgotten: tuple[str, ...] = ()  # request ids the peers may drop
    masks: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (request id, int32 grammar mask words)
    reset: bool = False  # TIMINGS: zero the timers after reporting them


class WireError(ExecutionError):
    """Bytes that do not decode into a `StepMessage` (a peer of another version or a broken link)."""


_RECORDS = {cls.__name__: cls for cls in (StepMessage, StepPlan, PlanRow, CopyOp, Location, ProgramVariant,
                                           AdmissionValues)}
_ENUMS = {cls.__name__: cls for cls in (MessageKind, Operation, StorageKind, LengthSource)}


def wire_signature() -> str:
    """Digest of the wire version and every record's field names: equal on compatible ranks."""
    fields = {name: _field_names(cls) for name, cls in sorted(_RECORDS.items())}
    members = {name: [m.name for m in cls] for name, cls in sorted(_ENUMS.items())}
    text = json.dumps([WIRE_VERSION, fields, members], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode_message(message: StepMessage) -> bytes:
    return json.dumps(_encode(message), separators=(",", ":")).encode("utf-8")


def decode_message(data: bytes) -> StepMessage:
    try:
        message = _decode(json.loads(data.decode("utf-8")))
    except (ValueError, KeyError, TypeError) as error:
        raise WireError(f"undecodable step message: {error}") from error
    if not isinstance(message, StepMessage):
        raise WireError(f"expected a StepMessage, got {type(message).__name__}")
    return message


def _field_names(cls) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls._fields)


# Each wire record's field names, resolved once: encoding a 64-row plan touches thousands of fields.
_FIELDS = {cls: tuple(_field_names(cls)) for cls in _RECORDS.values()}
_SCALARS = frozenset({bool, int, float, str, type(None)})


def _encode(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:  # most values: checked first
        return value
    fields = _FIELDS.get(kind)
    if fields is not None:
        return {"r": kind.__name__, "v": [_encode(getattr(value, field)) for field in fields]}
    if isinstance(value, enum.Enum):
        return {"e": kind.__name__, "v": value.name}
    if isinstance(value, tuple) and hasattr(value, "_fields") or dataclasses.is_dataclass(value):
        raise TypeError(f"{kind.__name__} is not a wire record")
    if isinstance(value, (tuple, list)):
        return [_encode(item) for item in value]
    if isinstance(value, (bool, int, float, str)):  # subclasses of the scalars
        return value
    raise TypeError(f"{kind.__name__} cannot cross the rank wire")


def _decode(value: Any) -> Any:
    kind = type(value)
    if kind is list:
        return tuple([_decode(item) if type(item) in _CONTAINERS else item for item in value])
    if kind is dict:
        if "e" in value:
            return _ENUMS[value["e"]][value["v"]]
        cls = _RECORDS[value["r"]]
        fields = [_decode(item) if type(item) in _CONTAINERS else item for item in value["v"]]
        if len(fields) != len(_FIELDS[cls]):
            raise ValueError(f"{cls.__name__} has {len(_FIELDS[cls])} fields, the message {len(fields)}")
        return cls(*fields)
    return value


_CONTAINERS = frozenset({list, dict})
