"""What rank zero sends its peers before each step, and its encoding on the wire.

A `StepMessage` carries one `StepPlan` (the same immutable record the executor runs), the admission
values of requests the peers have not seen yet, the requests they may forget, and the grammar
masks of constrained rows: everything a peer's own `Packer` needs to pack exactly the inputs rank
zero packs. Nothing else crosses: peers hold no scheduler and no request state beyond that.

Encoding: a flat sequence of int64 words, each record's fields in declaration order at fixed
positions (no JSON, no pickling, no arbitrary construction). A request crosses by its id once, in
its admission, which also gives it a small integer handle; rows, masks and forgotten requests
then carry only the handle (`WireEncoder` on rank zero and `WireDecoder` on each peer keep the two
tables in step; a forgotten handle is dropped on both sides). Floats travel as their IEEE-754 bits,
strings as a byte length and UTF-8 bytes packed eight to a word. Decoding checks every count,
enum value, flag and handle and raises `WireError` on anything else.

The codec lists each record's fields by name (`RECORD_FIELDS`); a record class that gains a field
no longer matches it (tests/parallel/test_wire.py) and changes `wire_signature()`, which every
rank compares at startup, so ranks of different versions refuse to form a group instead of
misreading each other. The words travel in a preallocated int64 tensor (`helios.runtime.parallel.rank_channel`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import struct
from typing import NamedTuple, Sequence

from helios.errors import ExecutionError
from helios.runtime.records.capacities import LengthSource, Operation, ProgramVariant
from helios.runtime.execution.packer import AdmissionValues
from helios.runtime.records.plan import CopyOp, Location, PlanRow, StepPlan, StorageKind

# 2: TIMINGS; 3: int64 words with request handles, LAUNCH / FINISH; 4: admission top_logprobs, logit_bias;
# 5: ProgramVariant.admits_slots; 6: plan rows carry the window region's new table entries
WIRE_VERSION = 6
MAGIC = 0x48454C494F53_0000 + WIRE_VERSION  # "HELIOS" and the version: the first word of every message


class MessageKind(enum.IntEnum):
    UNSPECIFIED = 0
    STEP = 1  # run `plan` (launch and finish it)
    STOP = 2  # leave the group: rank zero is shutting down
    KEEPALIVE = 3  # no plan: every rank answers one small all_reduce (an idle group stays checked)
    TIMINGS = 4  # no plan: every rank answers with its phase timers (one all_gather); `reset` zeroes them
    LAUNCH = 5  # launch `plan` (its first execution frame); a later FINISH completes it
    FINISH = 6  # finish the oldest launched plan (its `sequence`) and agree on its completion


class StepMessage(NamedTuple):
    kind: MessageKind
    plan: StepPlan | None = None
    admissions: tuple[tuple[str, AdmissionValues], ...] = ()  # (request id, values), new to the peers
    forgotten: tuple[str, ...] = ()  # request ids the peers may drop
    masks: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (request id, int32 grammar mask words)
    reset: bool = False  # TIMINGS: zero the timers after reporting them
    sequence: int = 0  # FINISH: the submission finished


class WireError(ExecutionError):
    """Words that do not decode into a `StepMessage` (a peer of another version or a broken link)."""


RECORD_FIELDS = {  # the codec's positional layout of every record (checked against the classes)
    "StepMessage": ("kind", "plan", "admissions", "forgotten", "masks", "reset", "sequence"),
    "StepPlan": ("sequence", "frame", "operation", "variant", "rows", "copies", "num_tokens"),
    "PlanRow": ("request_id", "slot", "generation", "token_ids", "pending_on_device", "start_pos", "query_len",
                "page_table_start", "new_page_ids", "samples", "sample_index", "token_ceiling", "admits",
                "constrained", "new_window_ids"),
    "CopyOp": ("src", "dst", "num_tokens"),
    "Location": ("kind", "index"),
    "ProgramVariant": ("name", "operation", "batch_capacity", "packed_token_capacity", "draft_tokens",
                       "verify_tokens", "length_source", "device_pending", "draft_lag_tokens", "admits_slots"),
    "AdmissionValues": ("prompt_ids", "seed", "sampling", "output_limit", "eos_ids", "top_logprobs", "logit_bias"),
}
_RECORDS = (StepMessage, StepPlan, PlanRow, CopyOp, Location, ProgramVariant, AdmissionValues)
_ENUMS = (MessageKind, Operation, StorageKind, LengthSource)


def record_fields(cls) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return tuple(cls._fields)


def wire_signature() -> str:
    """Digest of the wire version and every record's field names: equal on compatible ranks."""
    fields = {cls.__name__: list(record_fields(cls)) for cls in _RECORDS}
    members = {cls.__name__: [m.name for m in cls] for cls in _ENUMS}
    text = json.dumps([WIRE_VERSION, fields, members], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class WireEncoder:
    """Rank zero's side: StepMessage -> words, interning request ids as handles."""

    def __init__(self) -> None:
        self._handles: dict[str, int] = {}
        self._next = 1

    def encode(self, message: StepMessage) -> list[int]:
        out = [MAGIC, int(message.kind), int(message.sequence), int(bool(message.reset)),
               len(message.admissions), len(message.forgotten), len(message.masks), int(message.plan is not None)]
        for request_id in message.forgotten:  # first: a request id may be forgotten and admitted again
            out.append(self._handle(request_id))
            del self._handles[request_id]
        for request_id, values in message.admissions:
            if request_id in self._handles:
                raise WireError(f"request {request_id!r} was already admitted on the wire")
            self._handles[request_id] = handle = self._next
            self._next += 1
            out.append(handle)
            _put_str(out, request_id)
            _put_admission(out, values)
        for request_id, mask in message.masks:
            out += (self._handle(request_id), len(mask), *mask)
        if message.plan is not None:
            self._put_plan(out, message.plan)
        return out

    def _handle(self, request_id: str) -> int:
        handle = self._handles.get(request_id)
        if handle is None:
            raise WireError(f"request {request_id!r} was never admitted on the wire")
        return handle

    def _put_plan(self, out: list[int], plan: StepPlan) -> None:
        out += (plan.sequence, plan.frame, int(plan.operation), plan.num_tokens, len(plan.rows), len(plan.copies),
                int(plan.variant is not None))
        if plan.variant is not None:
            _put_variant(out, plan.variant)
        for row in plan.rows:
            out += (self._handle(row.request_id), row.slot, row.generation, int(row.pending_on_device), row.start_pos,
                    row.query_len, row.page_table_start, int(row.samples), row.sample_index, row.token_ceiling,
                    int(row.admits), int(row.constrained), len(row.token_ids), *row.token_ids,
                    len(row.new_page_ids), *row.new_page_ids, len(row.new_window_ids), *row.new_window_ids)
        for copy in plan.copies:
            out += (int(copy.src.kind), copy.src.index, int(copy.dst.kind), copy.dst.index, copy.num_tokens)


class WireDecoder:
    """A peer's side: words -> StepMessage, resolving handles to the ids admitted with them."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def decode(self, words: Sequence[int]) -> StepMessage:
        try:
            return self._decode(_Reader(words))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, struct.error) as error:
            raise WireError(f"undecodable step message: {error}") from error

    def _decode(self, read: "_Reader") -> StepMessage:
        if read.one() != MAGIC:
            raise WireError("not a step message of this wire version")
        kind, sequence, reset = MessageKind(read.one()), read.one(), read.flag()
        admitted, forgotten, masked, has_plan = read.count(), read.count(), read.count(), read.flag()
        dropped = tuple(self._names.pop(read.one(), None) for _ in range(forgotten))
        if None in dropped:
            raise WireError("a forgotten handle names no admitted request")
        admissions = []
        for _ in range(admitted):
            handle, request_id = read.one(), _get_str(read)
            if handle in self._names:
                raise WireError(f"handle {handle} admitted twice")
            self._names[handle] = request_id
            admissions.append((request_id, _get_admission(read)))
        masks = tuple((self._name(read.one()), read.many(read.count())) for _ in range(masked))
        plan = self._plan(read) if has_plan else None
        if read.left():
            raise WireError(f"{read.left()} words after the message")
        return StepMessage(kind, plan, tuple(admissions), dropped, masks, reset, sequence)

    def _name(self, handle: int) -> str:
        name = self._names.get(handle)
        if name is None:
            raise WireError(f"handle {handle} names no admitted request")
        return name

    def _plan(self, read: "_Reader") -> StepPlan:
        sequence, frame, operation, num_tokens = read.one(), read.one(), Operation(read.one()), read.one()
        rows, copies, has_variant = read.count(), read.count(), read.flag()
        variant = _get_variant(read) if has_variant else None
        plan_rows = tuple(self._row(read) for _ in range(rows))
        plan_copies = tuple(CopyOp(Location(StorageKind(read.one()), read.one()),
                                   Location(StorageKind(read.one()), read.one()), read.one()) for _ in range(copies))
        return StepPlan(sequence, frame, operation, variant, plan_rows, plan_copies, num_tokens)

    def _row(self, read: "_Reader") -> PlanRow:
        request_id, slot, generation, pending = self._name(read.one()), read.one(), read.one(), read.flag()
        start_pos, query_len, page_table_start, samples = read.one(), read.one(), read.one(), read.flag()
        sample_index, token_ceiling, admits, constrained = read.one(), read.one(), read.flag(), read.flag()
        token_ids = read.many(read.count())
        new_page_ids = read.many(read.count())
        return PlanRow(request_id, slot, generation, token_ids, pending, start_pos, query_len, page_table_start,
                       new_page_ids, samples, sample_index, token_ceiling, admits, constrained, read.many(read.count()))


class _Reader:
    def __init__(self, words: Sequence[int]):
        self._words, self._at = words, 0

    def one(self) -> int:
        if self._at >= len(self._words):
            raise WireError("the message ends early")
        self._at += 1
        return self._words[self._at - 1]

    def many(self, count: int) -> tuple[int, ...]:
        if self._at + count > len(self._words):
            raise WireError("the message ends early")
        self._at += count
        return tuple(self._words[self._at - count:self._at])

    def count(self) -> int:
        value = self.one()
        if not 0 <= value <= len(self._words):
            raise WireError(f"count {value} out of range")
        return value

    def flag(self) -> bool:
        value = self.one()
        if value not in (0, 1):
            raise WireError(f"flag {value} is neither 0 nor 1")
        return bool(value)

    def left(self) -> int:
        return len(self._words) - self._at


def _put_str(out: list[int], text: str) -> None:
    data = text.encode("utf-8")
    words = -(-len(data) // 8)
    out.append(len(data))
    out += struct.unpack(f"<{words}q", data.ljust(8 * words, b"\0"))


def _get_str(read: _Reader) -> str:
    size = read.count()
    words = read.many(-(-size // 8))
    return struct.pack(f"<{len(words)}q", *words)[:size].decode("utf-8")


def _put_floats(out: list[int], values: Sequence[float]) -> None:
    out.append(len(values))
    out += struct.unpack(f"<{len(values)}q", struct.pack(f"<{len(values)}d", *values))


def _get_floats(read: _Reader) -> tuple[float, ...]:
    words = read.many(read.count())
    return struct.unpack(f"<{len(words)}d", struct.pack(f"<{len(words)}q", *words))


def _put_admission(out: list[int], values: AdmissionValues) -> None:
    out += (len(values.prompt_ids), *values.prompt_ids, values.seed)
    _put_floats(out, values.sampling)
    out += (values.output_limit, len(values.eos_ids), *values.eos_ids)
    top = values.top_logprobs
    out += (int(top is not None), top if top is not None else 0)
    out += (len(values.logit_bias), *(token for token, _ in values.logit_bias))
    _put_floats(out, [bias for _, bias in values.logit_bias])


def _get_admission(read: _Reader) -> AdmissionValues:
    prompt_ids, seed, sampling = read.many(read.count()), read.one(), _get_floats(read)
    output_limit, eos_ids = read.one(), read.many(read.count())
    has_top, top = read.flag(), read.one()
    bias_ids, biases = read.many(read.count()), _get_floats(read)
    return AdmissionValues(prompt_ids, seed, sampling, output_limit, eos_ids, top if has_top else None,
                           tuple(zip(bias_ids, biases)))


def _put_variant(out: list[int], variant: ProgramVariant) -> None:
    _put_str(out, variant.name)
    lag = variant.draft_lag_tokens
    out += (int(variant.operation), variant.batch_capacity, variant.packed_token_capacity, variant.draft_tokens,
            variant.verify_tokens, int(variant.length_source), int(variant.device_pending), int(lag is not None),
            lag if lag is not None else 0, int(variant.admits_slots))


def _get_variant(read: _Reader) -> ProgramVariant:
    name, operation, batch, packed = _get_str(read), Operation(read.one()), read.one(), read.one()
    draft, verify, source, pending = read.one(), read.one(), LengthSource(read.one()), read.flag()
    has_lag, lag, admits = read.flag(), read.one(), read.flag()
    return ProgramVariant(name, operation, batch, packed, draft, verify, source, pending, lag if has_lag else None,
                          admits)
