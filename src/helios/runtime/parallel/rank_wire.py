"""What rank zero sends its peers before each step, and its encoding on the wire.

A `StepMessage` carries one `StepPlan`, the same immutable record the executor runs. A plan is
self-contained (`helios.runtime.records.plan`): the `RequestSpec` of each request it names for the first
time (`admitted`), the ids of requests released since the previous plan (`finished`), only what
changed per lane, and the grammar masks of its constrained rows. A peer's `Packer` applies the
plans in order exactly as rank zero's does, so both hold the same request records; peers hold
no scheduler and no other request state.

Encoding: a flat sequence of int64 words, each record's fields in declaration order at fixed
positions (no JSON, no pickling, no arbitrary construction). A request crosses by its id once, in
its admission, which also gives it a small integer handle; rows, masks and finished requests then
carry only the handle (`WireEncoder` on rank zero and `WireDecoder` on each peer keep the two
tables in step; a finished handle is dropped on both sides, and an id rank zero never sent - a
request whose admitting plan never reached the wire - is left out of `finished`). Floats travel as
their IEEE-754 bits, strings and bytes as a byte length and the bytes packed eight to a word.
Decoding checks every count, enum value, flag and handle, that a message's kind and its plan go
together (STEP and LAUNCH carry one, no other kind does), that mask words fit int32 and that no
float is NaN, and raises `WireError` on anything else: never another exception, and no count
is trusted beyond the words that remain.

The codec lists each record's fields by name (`RECORD_FIELDS`); a record class that gains a field
no longer matches it (tests/parallel/test_wire.py) and changes `wire_signature()`, which every
rank compares at startup (it also covers the timer phases, whose count sizes the TIMINGS exchange), so ranks of different versions refuse to form a group instead of
misreading each other. The words travel in a preallocated int64 tensor (`helios.runtime.parallel.rank_channel`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import struct
from typing import NamedTuple, Sequence

from helios.errors import ExecutionError
import torch

from helios.runtime.parallel import rank_timing
from helios.runtime.records.capacities import LengthSource, Operation, ProgramVariant
from helios.runtime.records.plan import CopyOp, Location, PlanRow, StepPlan, StorageKind
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams

# 2: TIMINGS; 3: int64 words with request handles, LAUNCH / FINISH; 4: admission top_logprobs, logit_bias;
# 5: ProgramVariant.admits_slots; 6: plan rows carry the window region's new table entries;
# 7: self-contained plans (request specs, finished ids and grammar masks inside the plan)
# 8: RequestSpec.pinned_seed (a sampled request with a chosen seed runs single-token lanes)
WIRE_VERSION = 8
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
    plan: StepPlan | None = None  # STEP and LAUNCH: the plan, with its admissions and finished ids
    reset: bool = False  # TIMINGS: zero the timers after reporting them
    sequence: int = 0  # FINISH: the submission finished


class WireError(ExecutionError):
    """Words that do not decode into a `StepMessage` (a peer of another version or a broken link)."""


_PLAN_KINDS = frozenset({MessageKind.STEP, MessageKind.LAUNCH})  # the kinds that carry a plan (and must)
_INT32 = (-(2**31), 2**31 - 1)  # grammar mask words


RECORD_FIELDS = {  # the codec's positional layout of every record (checked against the classes)
    "StepMessage": ("kind", "plan", "reset", "sequence"),
    "StepPlan": ("sequence", "frame", "operation", "variant", "rows", "copies", "num_tokens", "admitted", "finished",
                 "masks"),
    "PlanRow": ("request_id", "slot", "generation", "token_ids", "pending_on_device", "start_pos", "query_len",
                "page_table_start", "new_page_ids", "samples", "sample_index", "token_ceiling", "admits",
                "constrained", "new_window_ids"),
    "CopyOp": ("src", "dst", "num_tokens"),
    "Location": ("kind", "index"),
    "ProgramVariant": ("name", "operation", "batch_capacity", "packed_token_capacity", "draft_tokens",
                       "verify_tokens", "length_source", "device_pending", "draft_lag_tokens", "admits_slots"),
    "RequestSpec": ("request_id", "prompt_ids", "max_output_tokens", "eos_ids", "priority", "constrained",
                    "stop_strings", "stop_token_sequences", "observe", "publish_snapshot", "score_prompt", "cache_salt",
                    "top_logprobs", "sampling", "logit_bias", "stable_prefix_len", "pinned_seed", "token_keys", "images"),
    "SamplingParams": ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                       "frequency_penalty", "seed"),
}
_RECORDS = (StepMessage, StepPlan, PlanRow, CopyOp, Location, ProgramVariant, RequestSpec, SamplingParams)
_ENUMS = (MessageKind, Operation, StorageKind, LengthSource)


def record_fields(cls) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return tuple(cls._fields)


def wire_signature() -> str:
    """Digest of the wire version, every record's field names and the timer phases a TIMINGS
    exchange gathers (its tensor's width): equal on compatible ranks."""
    fields = {cls.__name__: list(record_fields(cls)) for cls in _RECORDS}
    members = {cls.__name__: [m.name for m in cls] for cls in _ENUMS}
    text = json.dumps([WIRE_VERSION, fields, members, list(rank_timing.PHASES)], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class WireEncoder:
    """Rank zero's side: StepMessage -> words, interning request ids as handles."""

    def __init__(self) -> None:
        self._handles: dict[str, int] = {}
        self._next = 1

    def encode(self, message: StepMessage, max_words: int | None = None) -> list[int]:
        """The message's words; a message that cannot be encoded (`WireError`), or that is longer
        than `max_words`, changes nothing, so the handle tables of rank zero and its peers stay in step."""
        out = [MAGIC, int(message.kind), int(message.sequence), int(bool(message.reset)), int(message.plan is not None)]
        if message.plan is not None:
            handles, next_handle = dict(self._handles), self._next
            try:
                self._put_plan(out, message.plan)
                if max_words is not None and len(out) > max_words:
                    raise WireError(f"a step message of {len(out)} words is longer than the channel's {max_words}")
            except BaseException:
                self._handles, self._next = handles, next_handle
                raise
        return out

    def _handle(self, request_id: str) -> int:
        handle = self._handles.get(request_id)
        if handle is None:
            raise WireError(f"request {request_id!r} was never admitted on the wire")
        return handle

    def _put_plan(self, out: list[int], plan: StepPlan) -> None:
        finished = [request_id for request_id in plan.finished if request_id in self._handles]
        out += (plan.sequence, plan.frame, int(plan.operation), plan.num_tokens, len(plan.rows), len(plan.copies),
                int(plan.variant is not None), len(finished), len(plan.admitted), len(plan.masks))
        for request_id in finished:  # first: an id may be finished and admitted again
            out.append(self._handles.pop(request_id))
        for spec in plan.admitted:
            if spec.request_id in self._handles:
                raise WireError(f"request {spec.request_id!r} was already admitted on the wire")
            self._handles[spec.request_id] = handle = self._next
            self._next += 1
            out.append(handle)
            _put_spec(out, spec)
        if plan.variant is not None:
            _put_variant(out, plan.variant)
        for row in plan.rows:
            out += (self._handle(row.request_id), row.slot, row.generation, int(row.pending_on_device), row.start_pos,
                    row.query_len, row.page_table_start, int(row.samples), row.sample_index, row.token_ceiling,
                    int(row.admits), int(row.constrained), len(row.token_ids), *row.token_ids,
                    len(row.new_page_ids), *row.new_page_ids, len(row.new_window_ids), *row.new_window_ids)
        for copy in plan.copies:
            out += (int(copy.src.kind), copy.src.index, int(copy.dst.kind), copy.dst.index, copy.num_tokens)
        for request_id, mask in plan.masks.items():
            words = mask.tolist()
            out += (self._handle(request_id), len(words), *words)


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
        kind, sequence, reset, has_plan = MessageKind(read.one()), read.one(), read.flag(), read.flag()
        if kind is MessageKind.UNSPECIFIED:
            raise WireError("a message of no kind")
        if has_plan != (kind in _PLAN_KINDS):
            raise WireError(f"a {kind.name} message {'with' if has_plan else 'without'} a plan")
        plan = self._plan(read) if has_plan else None
        if read.left():
            raise WireError(f"{read.left()} words after the message")
        return StepMessage(kind, plan, reset, sequence)

    def _name(self, handle: int) -> str:
        name = self._names.get(handle)
        if name is None:
            raise WireError(f"handle {handle} names no admitted request")
        return name

    def _plan(self, read: "_Reader") -> StepPlan:
        sequence, frame, operation, num_tokens = read.one(), read.one(), Operation(read.one()), read.one()
        rows, copies, has_variant = read.count(), read.count(), read.flag()
        finished, admitted, masked = read.count(), read.count(), read.count()
        dropped = tuple(self._names.pop(read.one(), None) for _ in range(finished))
        if None in dropped:
            raise WireError("a finished handle names no admitted request")
        specs = []
        for _ in range(admitted):
            handle, spec = read.one(), _get_spec(read)
            if handle in self._names:
                raise WireError(f"handle {handle} admitted twice")
            self._names[handle] = spec.request_id
            specs.append(spec)
        variant = _get_variant(read) if has_variant else None
        plan_rows = tuple(self._row(read) for _ in range(rows))
        plan_copies = tuple(CopyOp(Location(StorageKind(read.one()), read.one()),
                                   Location(StorageKind(read.one()), read.one()), read.one()) for _ in range(copies))
        masks = {self._name(read.one()): _mask(read.many(read.count())) for _ in range(masked)}
        return StepPlan(sequence, frame, operation, variant, plan_rows, plan_copies, num_tokens, tuple(specs),
                        dropped).with_masks(masks)

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


def _mask(words: tuple[int, ...]) -> torch.Tensor:
    if words and not (_INT32[0] <= min(words) and max(words) <= _INT32[1]):
        raise WireError("a grammar mask word does not fit int32")
    return torch.tensor(words, dtype=torch.int32)


def _put_str(out: list[int], text: str) -> None:
    _put_bytes(out, text.encode("utf-8"))


def _get_str(read: _Reader) -> str:
    return _get_bytes(read).decode("utf-8")


def _put_floats(out: list[int], values: Sequence[float]) -> None:
    out.append(len(values))
    out += struct.unpack(f"<{len(values)}q", struct.pack(f"<{len(values)}d", *values))


def _get_floats(read: _Reader) -> tuple[float, ...]:
    words = read.many(read.count())
    values = struct.unpack(f"<{len(words)}d", struct.pack(f"<{len(words)}q", *words))
    if any(math.isnan(value) for value in values):
        raise WireError("a float is NaN")
    return values


def _put_bytes(out: list[int], data: bytes) -> None:
    words = -(-len(data) // 8)
    out.append(len(data))
    out += struct.unpack(f"<{words}q", data.ljust(8 * words, b"\0"))


def _get_bytes(read: _Reader) -> bytes:
    size = read.count()
    words = read.many(-(-size // 8))
    return struct.pack(f"<{len(words)}q", *words)[:size]


def _put_optional(out: list[int], value: int | None) -> None:
    out += (int(value is not None), value if value is not None else 0)


def _get_optional(read: _Reader) -> int | None:
    present, value = read.flag(), read.one()
    return value if present else None


def _put_sampling(out: list[int], sampling: SamplingParams) -> None:
    _put_floats(out, (sampling.temperature, sampling.top_p, sampling.min_p, sampling.repetition_penalty,
                      sampling.presence_penalty, sampling.frequency_penalty))
    out += (sampling.top_k, sampling.seed)


def _get_sampling(read: _Reader) -> SamplingParams:
    floats = _get_floats(read)
    if len(floats) != 6:
        raise WireError(f"{len(floats)} sampling floats; expected 6")
    temperature, top_p, min_p, repetition, presence, frequency = floats
    return SamplingParams(temperature, top_p, read.one(), min_p, repetition, presence, frequency, read.one())


def _put_spec(out: list[int], spec: RequestSpec) -> None:
    """Every field of `spec` (a request with images is refused: its images stay on rank zero)."""
    if spec.images is not None:
        raise WireError(f"request {spec.request_id!r}: image inputs are not served by tensor-parallel ranks")
    _put_str(out, spec.request_id)
    out += (len(spec.prompt_ids), *spec.prompt_ids, spec.max_output_tokens)
    eos = sorted(spec.eos_ids)
    out += (len(eos), *eos, spec.priority, int(spec.constrained), len(spec.stop_strings))
    for text in spec.stop_strings:
        _put_str(out, text)
    out.append(len(spec.stop_token_sequences))
    for sequence in spec.stop_token_sequences:
        out += (len(sequence), *sequence)
    out += (int(spec.observe), int(spec.publish_snapshot), int(spec.score_prompt))
    _put_bytes(out, spec.cache_salt)
    _put_optional(out, spec.top_logprobs)
    _put_sampling(out, spec.sampling)
    out += (len(spec.logit_bias), *(token for token, _ in spec.logit_bias))
    _put_floats(out, [bias for _, bias in spec.logit_bias])
    out += (spec.stable_prefix_len, len(spec.token_keys), *(word for pair in spec.token_keys for word in pair))
    out.append(int(spec.pinned_seed))


def _get_spec(read: _Reader) -> RequestSpec:
    request_id, prompt_ids, max_output = _get_str(read), read.many(read.count()), read.one()
    eos_ids, priority, constrained = frozenset(read.many(read.count())), read.one(), read.flag()
    stop_strings = tuple(_get_str(read) for _ in range(read.count()))
    stop_sequences = tuple(read.many(read.count()) for _ in range(read.count()))
    observe, publish, score = read.flag(), read.flag(), read.flag()
    salt, top, sampling = _get_bytes(read), _get_optional(read), _get_sampling(read)
    bias_ids, biases = read.many(read.count()), _get_floats(read)
    if len(bias_ids) != len(biases):
        raise WireError(f"{len(bias_ids)} logit-bias ids with {len(biases)} values")
    stable_prefix_len, keys, pinned_seed = read.one(), read.many(2 * read.count()), read.flag()
    return RequestSpec(request_id, prompt_ids, max_output, eos_ids, priority, constrained, stop_strings, stop_sequences,
                       observe, publish, score, salt, top, sampling, tuple(zip(bias_ids, biases)), stable_prefix_len,
                       pinned_seed, tuple(zip(keys[::2], keys[1::2])))


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
