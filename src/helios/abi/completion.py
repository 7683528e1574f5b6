"""Completion records: what a program reports per submitted row, and the host's validation of it.

A program ends by writing one int64 record row per submitted row, in submission order, with
``helios::completion_record``; rows past the submitted lanes are padding and are not read. Columns
(`CompletionLayout`, the ABI):

| column | meaning |
|---|---|
| slot, generation | the lane's request slot and its generation, echoed from the packed inputs |
| submission | the transport's submission sequence, echoed (detects a stale frame) |
| token | last token emitted this round (the new pending token), or -1 when none was emitted |
| offered | target positions the lane used this round, the pending token included (its query length) |
| accepted | draft tokens accepted (0 when none were offered) |
| emitted | tokens emitted this round: accepted + 1 for a generating lane, 0 or 1 for prefill |
| consumed_end | consumed-token endpoint: tokens whose state is committed after the round |
| draft_cursor | max(consumed_end - lag, 0) for a program with a draft cursor of lag `lag`, else -1 |
| reserved | reserved model field, always -1 |

``helios::completion_record(slots, generations, submission, tokens, offered, accepted, emitted,
consumed_end, draft_lag)`` builds the record from int64 [R] tensors (submission: int64 [] or [1];
draft_lag: None for no draft cursor, else >= 0); it mutates nothing, a program copies the result into
its persistent record buffer if it has one.

`validate_completion(record, expected)` is the scheduler's independent check before any lane is
retired (spec: "Complete speculative generation", "Attention histories and cache policy"). It
returns one `LaneCompletion` per lane or raises a `CompletionError` subclass naming row and field.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor
from helios.errors import ExecutionError

COMPLETION_RECORD_SCHEMA = (
    "(Tensor slots, Tensor generations, Tensor submission, Tensor tokens, Tensor offered, "
    "Tensor accepted, Tensor emitted, Tensor consumed_end, int? draft_lag) -> Tensor"
)
NO_DRAFT_CURSOR = -1
RESERVED_VALUE = -1
_OP = "helios::completion_record"


@dataclass(frozen=True)
class CompletionLayout:
    """Column index of each field of an int64 completion record row."""

    slot: int = 0
    generation: int = 1
    submission: int = 2
    token: int = 3
    offered: int = 4
    accepted: int = 5
    emitted: int = 6
    consumed_end: int = 7
    draft_cursor: int = 8
    reserved: int = 9
    num_fields: int = 10


LAYOUT = CompletionLayout()
NUM_FIELDS = LAYOUT.num_fields


class CompletionError(ExecutionError):
    """A completion record that fails validation; `row` and `field` locate it."""

    def __init__(self, row: int | None, field: str, message: str):
        self.row = row
        self.field = field
        where = f"row {row} {field}" if row is not None else field
        super().__init__(f"completion record {where}: {message}")


class CompletionLayoutError(CompletionError):
    """The record tensor has the wrong dtype or shape."""


class CompletionOrderError(CompletionError):
    """A row reports another slot than the one submitted at that row (submission order)."""


class StaleCompletionError(CompletionError):
    """A row reports another generation or submission sequence than the one submitted."""


class CompletionCountError(CompletionError):
    """Offered, accepted or emitted counts break a lane or aggregate limit."""


class CompletionEndpointError(CompletionError):
    """The consumed-token endpoint or the draft cursor disagrees with the counts."""


class SampledTokenError(CompletionError):
    """The reported token is outside the vocabulary (or present where none was emitted)."""


class ReservedFieldError(CompletionError):
    """The reserved model field is not -1."""


class LaneKind(enum.Enum):
    """What a lane did this round; decides the count and endpoint rules."""

    PREFILL = 1  # consumed exactly the offered prompt tokens; emitted nothing
    FINAL_PREFILL = 2  # consumed the last prompt chunk exactly and emitted the first token
    GENERATE = 3  # consumed the pending token and the accepted drafts; emitted accepted + 1


class LaneOutcome(enum.Enum):
    """How a lane that passed validation ended its round."""

    OK = 1
    NO_ALLOWED_TOKEN = 2  # a grammar-constrained lane whose mask allowed no token (token -1)


class LaneExpectation(NamedTuple):
    """What the host submitted for one lane. `offer_ceiling` is the lane's reserved width (the
    exact query length for prefill kinds); `consumed_start` the endpoint before the round."""

    slot: int
    generation: int
    kind: LaneKind
    consumed_start: int
    offer_ceiling: int
    constrained: bool = False


@dataclass(frozen=True)
class CompletionExpectation:
    """One submission: its sequence, vocabulary size, aggregate target capacity P, the program's
    draft-cursor lag (None when it has no draft cursor) and its lanes in submission order."""

    submission: int
    vocab_size: int
    packed_capacity: int
    draft_lag: int | None
    lanes: tuple[LaneExpectation, ...]


class LaneCompletion(NamedTuple):
    """A validated lane result. `token` is -1 exactly when nothing was emitted or the outcome is
    NO_ALLOWED_TOKEN."""

    slot: int
    generation: int
    token: int
    offered: int
    accepted: int
    emitted: int
    consumed_end: int
    draft_cursor: int
    outcome: LaneOutcome


def _check_record_args(slots: torch.Tensor, others: dict[str, torch.Tensor],
                       submission: torch.Tensor, draft_lag: int | None) -> int:
    check_tensor(_OP, "slots", slots, torch.int64, (None,))
    num_rows = slots.shape[0]
    for name, tensor in others.items():
        check_tensor(_OP, name, tensor, torch.int64, (num_rows,))
    shape = (1,) if submission.dim() == 1 else ()
    check_tensor(_OP, "submission", submission, torch.int64, shape)
    check_same_device(_OP, {"slots": slots, "submission": submission, **others})
    if draft_lag is not None and draft_lag < 0:
        raise AbiArgumentError(f"{_OP}: draft_lag must be None or >= 0, got {draft_lag}")
    return num_rows


@abi_op(_OP, mutates_args=(), schema=COMPLETION_RECORD_SCHEMA)
def completion_record(slots: torch.Tensor, generations: torch.Tensor, submission: torch.Tensor,
                      tokens: torch.Tensor, offered: torch.Tensor, accepted: torch.Tensor,
                      emitted: torch.Tensor, consumed_end: torch.Tensor,
                      draft_lag: int | None) -> torch.Tensor:
    """int64 [R, NUM_FIELDS] completion record in `LAYOUT` order."""
    others = dict(generations=generations, tokens=tokens, offered=offered, accepted=accepted,
                  emitted=emitted, consumed_end=consumed_end)
    _check_record_args(slots, others, submission, draft_lag)
    return record_columns(slots, generations, submission, tokens, offered, accepted, emitted,
                          consumed_end, draft_lag)


def record_columns(slots: torch.Tensor, generations: torch.Tensor, submission: torch.Tensor,
                   tokens: torch.Tensor, offered: torch.Tensor, accepted: torch.Tensor,
                   emitted: torch.Tensor, consumed_end: torch.Tensor,
                   draft_lag: int | None) -> torch.Tensor:
    """``helios::completion_record`` on validated inputs: stacks on the inputs' device, no host
    read and no host tensor (a program may call it inside a captured CUDA graph)."""
    if draft_lag is None:
        cursor = torch.full_like(consumed_end, NO_DRAFT_CURSOR)
    else:
        cursor = (consumed_end - draft_lag).clamp(min=0)
    columns = [slots, generations, submission.reshape(1).expand_as(slots), tokens, offered,
               accepted, emitted, consumed_end, cursor, torch.full_like(slots, RESERVED_VALUE)]
    return torch.stack(columns, dim=-1)


@completion_record.register_fake
def _completion_record_fake(slots: torch.Tensor, generations: torch.Tensor,
                            submission: torch.Tensor, tokens: torch.Tensor,
                            offered: torch.Tensor, accepted: torch.Tensor,
                            emitted: torch.Tensor, consumed_end: torch.Tensor,
                            draft_lag: int | None) -> torch.Tensor:
    others = dict(generations=generations, tokens=tokens, offered=offered, accepted=accepted,
                  emitted=emitted, consumed_end=consumed_end)
    num_rows = _check_record_args(slots, others, submission, draft_lag)
    return slots.new_empty((num_rows, NUM_FIELDS))


def validate_completion(record: torch.Tensor, expected: CompletionExpectation
                        ) -> list[LaneCompletion]:
    """Validate `record` (int64 [>= lanes, NUM_FIELDS]) against the submission; see module doc."""
    rows = _record_rows(record, len(expected.lanes))
    results = _passing_lanes(rows, expected)
    if results is None:  # some lane breaks a rule: the checks below name the first one
        results = [_validate_lane(index, row, lane, expected)
                   for index, (row, lane) in enumerate(zip(rows, expected.lanes))]
    total = sum(result.offered for result in results)
    if total > expected.packed_capacity:
        raise CompletionCountError(None, "offered", f"lanes offered {total} target positions, "
                                   f"more than the packed capacity {expected.packed_capacity}")
    return results


def _record_rows(record: torch.Tensor, num_lanes: int) -> list[list[int]]:
    if not isinstance(record, torch.Tensor) or record.dtype != torch.int64 or record.dim() != 2:
        raise CompletionLayoutError(None, "record", "must be an int64 tensor [rows, fields]")
    if record.shape[1] != NUM_FIELDS or record.shape[0] < num_lanes:
        raise CompletionLayoutError(None, "record", f"shape {list(record.shape)} cannot hold "
                                    f"{num_lanes} lanes of {NUM_FIELDS} fields")
    return record[:num_lanes].tolist()


def _passing_lanes(rows: list[list[int]], expected: CompletionExpectation) -> list[LaneCompletion] | None:
    """Every lane's `LaneCompletion` when every lane passes every per-lane rule of
    `_validate_lane` (the same rules, checked in one pass without building an error), else None.
    The usual record passes: this is the per-step cost, and `_validate_lane` names a failure."""
    submission, lag, vocab = expected.submission, expected.draft_lag, expected.vocab_size
    generate, final, ok, no_token = LaneKind.GENERATE, LaneKind.FINAL_PREFILL, LaneOutcome.OK, LaneOutcome.NO_ALLOWED_TOKEN
    results = []
    for row, lane in zip(rows, expected.lanes):
        slot, generation, reported, token, offered, accepted, emitted, end, cursor, reserved = row  # LAYOUT order
        if slot != lane.slot or generation != lane.generation or reported != submission or reserved != RESERVED_VALUE:
            return None
        if lane.kind is generate:
            if not (1 <= offered <= lane.offer_ceiling and 0 <= accepted <= offered - 1 and emitted == accepted + 1):
                return None
            consumed = accepted + 1
        else:
            if offered != lane.offer_ceiling or offered < 1 or accepted != 0 or emitted != (lane.kind is final):
                return None
            consumed = offered
        if end != lane.consumed_start + consumed:
            return None
        if cursor != (NO_DRAFT_CURSOR if lag is None else max(end - lag, 0)):
            return None
        if emitted == 0:
            if token != -1:
                return None
            outcome = ok
        elif 0 <= token < vocab:
            outcome = ok
        elif token == -1 and lane.constrained:
            outcome = no_token
        else:
            return None
        results.append(LaneCompletion(slot, generation, token, offered, accepted, emitted, end, cursor, outcome))
    return results


def _validate_lane(index: int, row: Sequence[int], lane: LaneExpectation,
                   expected: CompletionExpectation) -> LaneCompletion:
    _check_identity(index, row, lane, expected.submission)
    if row[LAYOUT.reserved] != RESERVED_VALUE:
        raise ReservedFieldError(index, "reserved", f"must be -1, got {row[LAYOUT.reserved]}")
    _check_counts(index, row, lane)
    _check_endpoints(index, row, lane, expected.draft_lag)
    outcome = _check_token(index, row, lane, expected.vocab_size)
    return LaneCompletion(
        slot=row[LAYOUT.slot], generation=row[LAYOUT.generation], token=row[LAYOUT.token],
        offered=row[LAYOUT.offered], accepted=row[LAYOUT.accepted],
        emitted=row[LAYOUT.emitted], consumed_end=row[LAYOUT.consumed_end],
        draft_cursor=row[LAYOUT.draft_cursor], outcome=outcome)


def _check_identity(index: int, row: Sequence[int], lane: LaneExpectation,
                    submission: int) -> None:
    if row[LAYOUT.slot] != lane.slot:
        raise CompletionOrderError(index, "slot", f"reports slot {row[LAYOUT.slot]}, "
                                   f"slot {lane.slot} was submitted at this row")
    if row[LAYOUT.generation] != lane.generation:
        raise StaleCompletionError(index, "generation", f"reports {row[LAYOUT.generation]}, "
                                   f"slot {lane.slot} has generation {lane.generation}")
    if row[LAYOUT.submission] != submission:
        raise StaleCompletionError(index, "submission", f"reports {row[LAYOUT.submission]}, "
                                   f"expected submission {submission}")


def _check_counts(index: int, row: Sequence[int], lane: LaneExpectation) -> None:
    offered, accepted, emitted = (row[LAYOUT.offered], row[LAYOUT.accepted],
                                  row[LAYOUT.emitted])
    if lane.kind is LaneKind.GENERATE:
        if not 1 <= offered <= lane.offer_ceiling:
            raise CompletionCountError(index, "offered", f"{offered} outside [1, "
                                       f"{lane.offer_ceiling}] (the lane's reserved ceiling)")
        if not 0 <= accepted <= offered - 1:
            raise CompletionCountError(index, "accepted", f"{accepted} outside [0, "
                                       f"{offered - 1}] drafts offered")
        wanted_emitted = accepted + 1
    else:
        if offered != lane.offer_ceiling or offered < 1:
            raise CompletionCountError(index, "offered", f"{offered}, the prefill submitted "
                                       f"{lane.offer_ceiling} tokens")
        if accepted != 0:
            raise CompletionCountError(index, "accepted", f"{accepted}, prefill has no drafts")
        wanted_emitted = 1 if lane.kind is LaneKind.FINAL_PREFILL else 0
    if emitted != wanted_emitted:
        raise CompletionCountError(index, "emitted", f"{emitted}, expected {wanted_emitted}")


def _check_endpoints(index: int, row: Sequence[int], lane: LaneExpectation,
                     draft_lag: int | None) -> None:
    consumed = row[LAYOUT.offered]
    if lane.kind is LaneKind.GENERATE:
        consumed = row[LAYOUT.accepted] + 1
    wanted_end = lane.consumed_start + consumed
    if row[LAYOUT.consumed_end] != wanted_end:
        raise CompletionEndpointError(index, "consumed_end", f"{row[LAYOUT.consumed_end]}, "
                                      f"expected {lane.consumed_start} + {consumed}")
    wanted_cursor = NO_DRAFT_CURSOR if draft_lag is None else max(wanted_end - draft_lag, 0)
    if row[LAYOUT.draft_cursor] != wanted_cursor:
        raise CompletionEndpointError(index, "draft_cursor", f"{row[LAYOUT.draft_cursor]}, "
                                      f"expected {wanted_cursor}")


def _check_token(index: int, row: Sequence[int], lane: LaneExpectation,
                 vocab_size: int) -> LaneOutcome:
    token = row[LAYOUT.token]
    if row[LAYOUT.emitted] == 0:
        if token != -1:
            raise SampledTokenError(index, "token", f"{token} reported, but nothing emitted")
        return LaneOutcome.OK
    if 0 <= token < vocab_size:
        return LaneOutcome.OK
    if token == -1 and lane.constrained:
        return LaneOutcome.NO_ALLOWED_TOKEN
    raise SampledTokenError(index, "token", f"{token} outside the vocabulary [0, {vocab_size})")
