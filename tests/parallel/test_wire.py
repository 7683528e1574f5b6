"""The step messages rank zero sends its peers survive the wire exactly (int64 words, request ids
interned as handles), and nothing but well-formed words of this version decodes."""

from __future__ import annotations

import dataclasses
import hashlib
import struct

import pytest
import torch

from helios.runtime.records.capacities import Operation, ProgramVariant
from helios.runtime.records.plan import CopyOp, Location, PlanRow, StepPlan, StorageKind
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
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


def spec(request_id="req-1", prompt=(1, 2, 3)) -> RequestSpec:
    sampling = SamplingParams(0.7, 0.9, 50, 0.0, 1.1, 0.25, float("inf"), -(2**40) - 7)
    return RequestSpec(request_id, prompt, 32, frozenset({2}), priority=1, constrained=True, stop_strings=("é",),
                       stop_token_sequences=((4, 5),), cache_salt=b"salt", top_logprobs=0, sampling=sampling,
                       logit_bias=((7, -1.5),), pinned_seed=True, token_keys=((0, 99),))


def same(left: StepMessage, right: StepMessage) -> bool:
    """Equal messages (grammar masks are tensors: compared by value)."""
    if left.plan is None or right.plan is None:
        return left == right
    masks = {k: v.tolist() for k, v in left.plan.masks.items()} == {k: v.tolist() for k, v in right.plan.masks.items()}
    return masks and left._replace(plan=left.plan._replace(masks={})) == right._replace(plan=right.plan._replace(masks={}))


def message() -> StepMessage:
    variant = ProgramVariant("decode.r2t2", Operation.DECODE, 2, 2, device_pending=False)
    row = PlanRow("req-1", 1, 4, (17,), False, 9, 1, 2, (5, 6), True, 3, 1, False, True, (-1, 7))
    copy = CopyOp(Location(StorageKind.PAGE, 3), Location(StorageKind.HOST, 0), 16)
    plan = StepPlan(12, 1, Operation.DECODE, variant, (row,), (copy,), 1, (spec(),), ())
    plan = plan.with_masks({"req-1": torch.tensor([-1, 0, 2**31 - 1], dtype=torch.int32)})
    return StepMessage(MessageKind.LAUNCH, plan)


def test_step_messages_round_trip_exactly_and_ids_cross_once():
    encoder, decoder = WireEncoder(), WireDecoder()
    first = message()
    decoded = decoder.decode(encoder.encode(first))
    assert same(decoded, first) and decoded.plan.admitted[0] == spec() and decoded.plan.masks["req-1"].dtype == torch.int32
    variant = ProgramVariant("spec.r2w3t6", Operation.SPECULATIVE, 2, 6, 2, 3, draft_lag_tokens=1)
    row = PlanRow("req-1", 1, 4, (), True, 10, 3, 3, (), True, 4, 3, False, False)
    later = StepMessage(MessageKind.STEP, StepPlan(13, 0, Operation.SPECULATIVE, variant, (row,), (), 3,
                                                   (spec("réq-2", (9,) * 40),)))
    words = encoder.encode(later)
    assert "req-1".encode() not in struct.pack(f"<{len(words)}q", *words)  # a handle, not the id
    decoded = decoder.decode(words)
    assert same(decoded, later) and decoded.plan.variant.draft_lag_tokens == 1
    assert type(decoded.plan.variant) is ProgramVariant and decoded.plan.operation is Operation.SPECULATIVE
    # Finished, then admitted again under the same id in one plan (a copy-only plan).
    again = StepMessage(MessageKind.STEP, StepPlan(14, 0, Operation.DECODE, None, (), (), 0, (spec(),),
                                                   ("req-1", "réq-2")))
    assert same(decoder.decode(encoder.encode(again)), again)
    finish = StepMessage(MessageKind.FINISH, sequence=13)
    assert decoder.decode(encoder.encode(finish)) == finish


def test_an_id_never_sent_is_left_out_of_finished():
    """A request whose admitting plan never reached the wire (its launch failed first)."""
    encoder, decoder = WireEncoder(), WireDecoder()
    decoder.decode(encoder.encode(message()))
    plan = StepPlan(13, 0, Operation.DECODE, None, (), (), 0, (), ("never-sent", "req-1"))
    assert decoder.decode(encoder.encode(StepMessage(MessageKind.STEP, plan))).plan.finished == ("req-1",)


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
    ghost = unknown.encode(StepMessage(MessageKind.STEP, StepPlan(1, 1, Operation.DECODE, None, (), (), 0, (),
                                                                  ("ghost",))))
    with pytest.raises(WireError, match="no admitted request"):
        WireDecoder().decode(ghost)


def test_ids_never_admitted_are_refused_by_the_encoder():
    plan = StepPlan(1, 1, Operation.DECODE, None, (), (), 0).with_masks({"req": torch.ones(1, dtype=torch.int32)})
    with pytest.raises(WireError, match="never admitted"):
        WireEncoder().encode(StepMessage(MessageKind.STEP, plan))


def test_requests_with_images_do_not_cross():
    encoder, decoder = WireEncoder(), WireDecoder()
    plan = StepPlan(1, 1, Operation.DECODE, None, (), (), 0,
                    (spec("text"), dataclasses.replace(spec("image"), images=object())))
    with pytest.raises(WireError, match="image inputs"):
        encoder.encode(StepMessage(MessageKind.STEP, plan))
    later = message()  # the failed message left no handle behind: the words of a fresh encoder
    words = encoder.encode(later)
    assert words == WireEncoder().encode(later) and same(decoder.decode(words), later)


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
    assert digest == "58205d4cc6903ce51861c40ed82946abb4dd6118717819ceffcd861bb591c4fe"


def _replace(words: list[int], at: int, value: int) -> list[int]:
    broken = list(words)
    broken[at] = value
    return broken


@pytest.mark.parametrize("kind, has_plan", [(MessageKind.UNSPECIFIED, 0), (MessageKind.STEP, 0),
                                            (MessageKind.LAUNCH, 0), (MessageKind.KEEPALIVE, 1),
                                            (MessageKind.STOP, 1)])
def test_a_kind_and_its_plan_must_go_together(kind, has_plan):
    """A peer runs a STEP or LAUNCH message's plan: one without a plan (or a message of no kind)
    would end it with an AttributeError instead of a WireError."""
    words = WireEncoder().encode(message() if has_plan else StepMessage(MessageKind.KEEPALIVE))
    with pytest.raises(WireError, match="plan|no kind"):
        WireDecoder().decode(_replace(words, 1, int(kind)))


def test_mask_words_beyond_int32_and_nan_floats_are_wire_errors():
    words = WireEncoder().encode(message())
    with pytest.raises(WireError, match="int32"):
        WireDecoder().decode(_replace(words, len(words) - 1, 2**40))  # the last grammar mask word
    nan = struct.unpack("<q", struct.pack("<d", float("nan")))[0]
    temperature = struct.unpack("<q", struct.pack("<d", 0.7))[0]
    with pytest.raises(WireError, match="NaN"):
        WireDecoder().decode(_replace(words, words.index(temperature), nan))


def test_counts_past_the_words_left_are_wire_errors():
    """Every count, a huge or negative one included, is checked against the words that remain
    before anything is read or built for it."""
    words = WireEncoder().encode(message())
    for at in range(5, len(words)):
        for value in (-1, -(2**63), 2**62, len(words)):
            try:
                WireDecoder().decode(_replace(words, at, value))
            except WireError:
                pass


def test_the_signature_covers_the_timer_phases(monkeypatch):
    """A TIMINGS exchange gathers one tensor per rank whose width is the phase count: ranks whose
    phases differ must refuse to form a group, as for a record's fields."""
    from helios.runtime.parallel import rank_timing
    from helios.runtime.parallel.rank_wire import wire_signature

    before = wire_signature()
    monkeypatch.setattr(rank_timing, "PHASES", rank_timing.PHASES + ("run.new_operation",))
    assert wire_signature() != before
