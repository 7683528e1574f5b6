"""The step message rank zero sends its peers survives the wire exactly, and nothing but the
known records decodes."""

from __future__ import annotations

import hashlib
import json

import pytest

from helios.runtime.capacities import Operation, ProgramVariant
from helios.runtime.packer import AdmissionValues
from helios.runtime.plan import CopyOp, Location, PlanRow, StepPlan, StorageKind
from helios.runtime.rank_wire import MessageKind, StepMessage, WireError, decode_message, encode_message


def message() -> StepMessage:
    variant = ProgramVariant("decode.r2t2", Operation.DECODE, 2, 2, device_pending=False)
    row = PlanRow("req-1", 1, 4, (17,), False, 9, 1, 2, (5, 6), True, 3, 1, False, True)
    copy = CopyOp(Location(StorageKind.PAGE, 3), Location(StorageKind.HOST, 0), 16)
    plan = StepPlan(12, 1, Operation.DECODE, variant, (row,), (copy,), 1)
    values = AdmissionValues((1, 2, 3), 2**40 + 7, (0.7, 50.0, 0.9, 0.0, 1.1, 0.25, float("inf")), 32, (2,))
    return StepMessage(MessageKind.STEP, plan, (("req-1", values),), ("req-0",), (("req-1", (-1, 0, 2**31 - 1)),))


def test_a_step_message_round_trips_exactly():
    original = message()
    decoded = decode_message(encode_message(original))
    assert decoded == original
    assert type(decoded.plan.variant) is ProgramVariant and decoded.plan.operation is Operation.DECODE


def test_only_known_records_decode():
    forged = json.dumps({"r": "Popen", "v": ["rm -rf /"]}).encode()
    with pytest.raises(WireError):
        decode_message(forged)
    with pytest.raises(WireError):
        decode_message(b"\xff not json")
    short = json.loads(encode_message(StepMessage(MessageKind.STOP)))
    short["v"] = short["v"][:2]
    with pytest.raises(WireError, match="fields"):
        decode_message(json.dumps(short).encode())


def test_values_that_are_not_wire_records_are_refused():
    with pytest.raises(TypeError, match="cannot cross"):
        encode_message(StepMessage(MessageKind.STEP, masks=(("req", {1, 2}),)))


def test_the_encoding_is_pinned():
    """Ranks compare `wire_signature()` (record fields), not bytes: a change of the encoding itself
    must bump WIRE_VERSION. This digest is of the bytes `message()` encodes to."""
    digest = hashlib.sha256(encode_message(message())).hexdigest()
    assert digest == "74e56f81defc562d513091268eca24f47c83cd01becbe00ac4bdc4ffd1612928"
