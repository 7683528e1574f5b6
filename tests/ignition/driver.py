"""A small host-side test driver for captured programs: page allocation, packing, greedy generation.

It packs every input by the names in the program's ProgramSpec (so it also checks that the spec is
enough to call a program). Pages are handed out in a shuffled order, so sequences own non-contiguous
pages. This is test scaffolding; the production packer and scheduler live in helios.runtime.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from helios.abi.completion import LAYOUT as COMPLETION
from helios.abi.sampling import NEUTRAL_SAMPLING_PARAMETERS
from helios.ignition.program_spec import InputRole, Operation, ProgramSpec

_DTYPES = {"int64": torch.int64, "int32": torch.int32, "bool": torch.bool, "float32": torch.float32}


@dataclass
class Sequence:
    """One request: its tokens so far, how many are in the cache, its pages and its state slot."""

    slot: int
    token_ids: list[int]
    pages: list[int] = field(default_factory=list)
    window_pages: list[int] = field(default_factory=list)  # ids in the sliding layers' own region, if any
    num_cached: int = 0
    generated: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # float32 [V] behind each generated token


@dataclass(frozen=True)
class RowWork:
    """One row of a step: `tokens` at positions start.., sampling a token after the last if `sample`."""

    sequence: Sequence
    tokens: tuple[int, ...]
    start: int
    sample: bool
    targets: tuple[int, ...] = ()


class PagedModel:
    """Owns the cache storage and persistent state; calls loaded programs with packed inputs."""

    def __init__(self, weights, programs, *, num_pages=160, max_pages=24, num_slots=6, seed=0, device="cpu"):
        self.device = torch.device(device)
        self.weights = [weight.to(self.device) for weight in weights]
        self.programs = programs  # {Operation: (ProgramSpec, module)}
        spec = next(iter(programs.values()))[0]
        self.page_tokens, self.max_pages = spec.page_tokens, max_pages
        state = {s.name: s for s in spec.inputs}
        extents = {"pages": num_pages, "slots": num_slots, "request_rows": num_slots, "max_pages": max_pages,
                   "window_pages": num_pages}
        planes = tuple(s.name for s in spec.inputs if s.role is InputRole.CACHE_STORAGE)
        self.state = {
            name: torch.zeros(_shape(state[name], extents), dtype=_dtype(state[name]), device=self.device)
            for name in (*planes, "prompt_counts", "output_counts", "page_table", "window_page_table", *BIAS_INPUTS)
            if name in state
        }
        if "logit_bias_ids" in self.state:
            self.state["logit_bias_ids"].fill_(-1)  # no request of the driver has a logit bias
        self.operations_run: list[Operation] = []
        self.free_pages = list(range(num_pages))
        random.Random(seed).shuffle(self.free_pages)
        self.free_window_pages = list(range(num_pages))  # a page-id space of its own, another order
        random.Random(seed + 1).shuffle(self.free_window_pages)

    def ensure_pages(self, sequence: Sequence, num_tokens: int) -> None:
        while len(sequence.pages) * self.page_tokens < num_tokens:
            sequence.pages.append(self.free_pages.pop())
        while "window_page_table" in self.state and len(sequence.window_pages) < len(sequence.pages):
            sequence.window_pages.append(self.free_window_pages.pop())

    def admit(self, sequence: Sequence, prompt_len: int) -> None:
        """Admission: the prompt histogram of the slot is set once and its output histogram zeroed."""
        counts = torch.bincount(torch.tensor(sequence.token_ids[:prompt_len]), minlength=self.vocab_size)
        self.state["prompt_counts"][sequence.slot] = counts.to(torch.int32)
        self.state["output_counts"][sequence.slot] = 0

    @property
    def vocab_size(self) -> int:
        return self.state["prompt_counts"].shape[1]

    def choose(self, rows: list[RowWork]) -> Operation:
        """DECODE for single-token rows, PREFILL when no row has generated yet, else MIXED (and MIXED
        for any step whose DECODE or PREFILL program is not among `programs`)."""
        is_decode = all(len(r.tokens) == 1 for r in rows)
        is_prefill = not any(r.sequence.generated for r in rows)
        for operation, allowed in ((Operation.DECODE, is_decode), (Operation.PREFILL, is_prefill),
                                   (Operation.MIXED, True)):
            if operation not in self.programs:
                continue
            capacity = self.programs[operation][0].capacity
            fits = len(rows) <= capacity.batch_capacity and \
                sum(len(r.tokens) for r in rows) <= capacity.packed_token_capacity
            if allowed and fits:
                return operation
        raise AssertionError("no program variant fits the step")

    def variant(self, operation: Operation) -> Operation:
        """`operation` if its program is among `programs`, else MIXED (which runs any step)."""
        return operation if operation in self.programs else Operation.MIXED

    def run(self, operation: Operation, rows: list[RowWork]) -> dict[str, torch.Tensor]:
        self.operations_run.append(operation)
        spec, module = self.programs[operation]
        for row in rows:
            self.ensure_pages(row.sequence, row.start + len(row.tokens))
            pages = torch.tensor(row.sequence.pages, dtype=torch.int32)
            self.state["page_table"][row.sequence.slot, : len(pages)] = pages.to(self.device)
            if "window_page_table" in self.state:
                window = torch.tensor(row.sequence.window_pages, dtype=torch.int32)
                self.state["window_page_table"][row.sequence.slot, : len(window)] = window.to(self.device)
        values = {name: value.to(self.device)
                  for name, value in pack_step(spec, rows, self.max_pages, self.vocab_size).items()}
        args = [self.weights] + [self.state.get(s.name, values.get(s.name)) for s in spec.inputs[1:]]
        outputs = module(*args)
        for row in rows:
            row.sequence.num_cached = max(row.sequence.num_cached, row.start + len(row.tokens))
        named = {name: output.cpu() for name, output in zip(spec.output_names, outputs)}
        named["sampled_ids"] = named["completion"][:, COMPLETION.token]
        return named


BIAS_INPUTS = ("logit_bias_ids", "logit_bias_values")  # per slot, like prompt_counts


def pack_step(spec: ProgramSpec, rows: list[RowWork], max_pages: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """Every per-step input of `spec`, by name; inactive rows and padding tokens filled harmlessly."""
    num_rows, num_tokens = spec.capacity.batch_capacity, spec.capacity.packed_token_capacity
    assert len(rows) <= num_rows and sum(len(r.tokens) for r in rows) <= num_tokens
    tokens, positions, targets = [], [], []
    for row in rows:
        tokens += row.tokens
        positions += range(row.start, row.start + len(row.tokens))
        targets += row.targets or (0,) * len(row.tokens)
    pad_rows = num_rows - len(rows)
    values = {
        "token_ids": _padded(tokens, num_tokens, torch.int64),
        "positions": _padded(positions, num_tokens, torch.int64),
        "target_ids": _padded(targets, num_tokens, torch.int64),
        "query_lens": torch.tensor([len(r.tokens) for r in rows] + [0] * pad_rows, dtype=torch.int32),
        "request_slots": torch.tensor([r.sequence.slot for r in rows] + [-1] * pad_rows, dtype=torch.int64),
        "generations": torch.tensor([1] * len(rows) + [-1] * pad_rows, dtype=torch.int64),
        "sample_rows": torch.tensor([r.sample for r in rows] + [False] * pad_rows),
        "pending_ids": torch.full((num_rows,), -1, dtype=torch.int64),  # tokens are packed directly
        "submission": torch.zeros(1, dtype=torch.int64),
    }
    values.update(greedy_controls(num_rows, vocab_size))
    return values


def greedy_controls(num_rows: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """Sampling inputs that select the most likely token: temperature 0, no filters, no penalties."""
    return {
        "seeds": torch.zeros(num_rows, dtype=torch.int64),
        "counters": torch.zeros(num_rows, dtype=torch.int64),
        "sampling_params": torch.tensor([NEUTRAL_SAMPLING_PARAMETERS] * num_rows, dtype=torch.float32),
        "grammar_mask": torch.full((num_rows, -(-vocab_size // 32)), -1, dtype=torch.int32),
    }


def generate(model: PagedModel, sequences: list[Sequence], max_new: int, *, chunk: int, arrivals=None):
    """Greedy continuous batching: each step packs one decode token per running sequence and a
    prompt chunk of at most `chunk` tokens per prefilling one; sequence i joins at step arrivals[i].
    Each step runs the first of DECODE, PREFILL, MIXED that can take it (`PagedModel.choose`)."""
    arrivals = arrivals or [0] * len(sequences)
    step = 0
    while any(len(s.generated) < max_new for s in sequences):
        for sequence, arrival in zip(sequences, arrivals):
            if arrival == step:
                model.admit(sequence, len(sequence.token_ids))
        live = [s for s, a in zip(sequences, arrivals) if a <= step and len(s.generated) < max_new]
        rows = [_next_row(s, chunk) for s in live]
        if rows:
            outputs = model.run(model.choose(rows), rows)
            _record(rows, outputs["sampled_ids"], outputs["logits"])
        step += 1
    return [s.generated for s in sequences]


def _next_row(sequence: Sequence, chunk: int) -> RowWork:
    pending = sequence.token_ids[sequence.num_cached:]
    tokens = tuple(pending[:chunk])
    return RowWork(sequence, tokens, sequence.num_cached, sample=len(tokens) == len(pending))


def _record(rows: list[RowWork], sampled: torch.Tensor, logits: torch.Tensor) -> None:
    for row, token, row_logits in zip(rows, sampled.tolist(), logits):
        if row.sample:
            assert token >= 0
            row.sequence.generated.append(token)
            row.sequence.logits.append(row_logits.clone())
            row.sequence.token_ids.append(token)
        else:
            assert token == -1


def _padded(values: list[int], length: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values + [0] * (length - len(values)), dtype=dtype)


def _shape(spec, extents) -> tuple[int, ...]:
    return tuple(extents[d] if isinstance(d, str) else d for d in spec.shape)


def _dtype(spec) -> torch.dtype:
    return {**_DTYPES, "bfloat16": torch.bfloat16, "float16": torch.float16}[spec.dtype]
