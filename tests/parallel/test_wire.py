"""The step messages rank zero sends its peers survive the wire exactly (int64 words, request ids
interned as handles), and nothing but well-formed words of this version decodes."""

from __future__ import annotations

import dataclasses
import hashlib
import struct

import pytest

from helios.runtime.records.capacities import Operation, ProgramVariant
from helios.runtime.execution.packer import AdmissionValues
from helios.runtime.records.plan import CopyOp, Location, PlanRow, StepPlan, StorageKind
from helios.runtime.parallel.rank_wire import (
    _RECORDS,
    RECORD_FIELDS,
    MessageKind,
    StepMessage,
    WireDecoder,
    WireEncoder,
    WireError,
    record_fields,
)


def values(prompt=(1, 2, 3)) -> AdmissionValues:
    return AdmissionValues(prompt, 2**40 + 7, (0.7, 50.0, 0.9, 0.0, 1.1, 0.25, float("inf")), 32, (2,))


def message() -> StepMessage:
    variant = ProgramVariant("decode.r2t2", Operation.DECODE, 2, 2, device_pending=False)
    row = PlanRow("req-1", 1, 4, (17,), False, 9, 1, 2, (5, 6), True, 3, 1, False, True, (-1, 7))
    copy = CopyOp(Location(StorageKind.PAGE, 3), Location(StorageKind.HOST, 0), 16)
    plan = StepPlan(12, 1, Operation.DECODE, variant, (row,), (copy,), 1)
    return StepMessage(MessageKind.LAUNCH, plan, (("req-1", values()),), (), (("req-1", (-1, 0, 2**31 - 1)),))


def test_step_messages_round_trip_exactly_and_ids_cross_once():
    encoder, decoder = WireEncoder(), WireDecoder()
    first = message()
    assert decoder.decode(encoder.encode(first)) == first
    variant = ProgramVariant("spec.r2w3t6", Operation.SPECULATIVE, 2, 6, 2, 3, draft_lag_tokens=1)
    row = PlanRow("req-1", 1, 4, (), True, 10, 3, 3, (), True, 4, 3, False, False)
    later = StepMessage(MessageKind.STEP, StepPlan(13, 0, Operation.SPECULATIVE, variant, (row,), (), 3),
                        (("réq-2", values((9,) * 40)),), ())
    words = encoder.encode(later)
    assert "req-1".encode() not in struct.pack(f"<{len(words)}q", *words)  # a handle, not the id
    decoded = decoder.decode(words)
    assert decoded == later and decoded.plan.variant.draft_lag_tokens == 1
    assert type(decoded.plan.variant) is ProgramVariant and decoded.plan.operation is Operation.SPECULATIVE
    # Forgotten, then admitted again under the same id in one message.
    again = StepMessage(MessageKind.STEP, None, (("req-1", values()),), ("req-1", "réq-2"))
    assert decoder.decode(encoder.encode(again)) == again
    finish = StepMessage(MessageKind.FINISH, sequence=13)
    assert decoder.decode(encoder.encode(finish)) == finish


def test_only_well_formed_words_decode():
    encoder = WireEncoder()
    words = encoder.encode(message())
    for broken in (words[:-1], words + [0], [0] + words[1:], words[:1] + [99] + words[2:]):
        with pytest.raises(WireError):
            WireDecoder().decode(broken)
    flag = list(words)
    flag[3] = 2  # the reset flag
    with pytest.raises(WireError, match="flag"):
        WireDecoder().decode(flag)
    decoder = WireDecoder()
    decoder.decode(words)
    with pytest.raises(WireError, match="twice"):
        decoder.decode(words)  # the same handle admitted again
    unknown = WireEncoder()
    unknown._handles["ghost"] = 77
    ghost = unknown.encode(StepMessage(MessageKind.STEP, None, (), ("ghost",)))
    with pytest.raises(WireError, match="no admitted request"):
        WireDecoder().decode(ghost)


def test_ids_never_admitted_are_refused_by_the_encoder():
    with pytest.raises(WireError, match="never admitted"):
        WireEncoder().encode(StepMessage(MessageKind.STEP, masks=(("req", (1,)),)))


def test_the_codec_layout_matches_every_record():
    """A record that gains or reorders a field must change the codec (and WIRE_VERSION) too."""
    for cls in _RECORDS:
        assert RECORD_FIELDS[cls.__name__] == record_fields(cls), cls.__name__
    assert all(dataclasses.is_dataclass(cls) or hasattr(cls, "_fields") for cls in _RECORDS)


def test_the_encoding_is_pinned():
    """Ranks compare `wire_signature()` (record fields), not words: a change of the encoding itself
    must bump WIRE_VERSION. This digest is of the words `message()` encodes to."""
    words = WireEncoder().encode(message())
    digest = hashlib.sha256(struct.pack(f"<{len(words)}q", *words)).hexdigest()
    assert digest == "5ee5eb47e7533e72d0d0b72c131af9a4b4aee0f5dc9b43fdd881d9586196b469"
