"""The calling convention of captured programs: `ProgramSpec`, emitted beside every exported program.

A program is called positionally as ``module(weights, *tensors)`` in the order of `ProgramSpec.inputs`
(the first entry is the weight list). Every program shares one convention:

* R = batch_capacity rows, T = packed_token_capacity tokens (DECODE: T == R). Row r owns the next
  ``query_lens[r]`` packed tokens (rows are packed in order); rows past the live ones have length 0
  and ``request_slots`` -1; tokens past the sum of the lengths are padding (any id, position 0).
  Symbolic dims: ``pages`` (physical cache pages), ``slots`` (request slots of the persistent state),
  ``request_rows`` (rows of the host-written per-slot inputs), ``max_pages`` (page-table width).
* Per-slot inputs written by the host, not per step: ``page_table[slot]`` (entries uploaded when
  pages are assigned) and ``prompt_counts[slot]`` (the full prompt histogram, set at admission).
  Programs read them through ``request_slots``.
* Cache storage and persistent state are mutated in place, never copied: the caches receive this
  step's keys/values; ``output_counts[request_slots[r], token]`` grows by one for each row with
  ``sample_rows[r]`` that emits a token (the host zeroes a slot's counts at admission).
* ``sampling_params`` [R, 7] packs (temperature, top_k, top_p, min_p, repetition, presence,
  frequency) as in `helios.abi.sampling`; ``grammar_mask`` is all ones for unconstrained rows.
  MIXED adds ``pending_ids`` [R]: where >= 0 it replaces the row's first packed token.
* Outputs: ``completion`` [R, fields], the `helios.abi.completion` record of each row (the sampled
  token in its ``token`` column, -1 where ``sample_rows[r]`` is false), and ``logits`` [R, V], the
  float32 logits of each row's last packed token. SCORED_PREFILL adds ``target_ids`` [T] (the token
  each packed token should predict) and ``target_logprobs`` [T], that target's log-probability
  after each packed token (0 for padding tokens).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from helios.abi.completion import NUM_FIELDS as COMPLETION_FIELDS
from helios.abi.sampling import NUM_SAMPLING_PARAMETERS
from helios.ignition.architecture import Architecture, CheckpointError, WeightSlot, weight_layout

Dim = int | str


class Operation(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"
    SCORED_PREFILL = "scored_prefill"


class InputRole(enum.Enum):
    WEIGHTS = "weights"  # the lifted weight list, shared by every program of a core
    CACHE_STORAGE = "cache_storage"  # paged key/value planes [layers, pages, page_tokens, Hkv, D]
    PERSISTENT_STATE = "persistent_state"  # per-request-slot device state that outlives a step
    STEP_INPUT = "step_input"  # values packed by the host for this step only


class Access(enum.Enum):
    READ = "read"
    READ_WRITE = "read_write"


@dataclass(frozen=True)
class Capacity:
    """A captured variant: R request rows over T packed tokens."""

    batch_capacity: int
    packed_token_capacity: int

    def __post_init__(self) -> None:
        if not 0 < self.batch_capacity <= self.packed_token_capacity:
            raise CheckpointError(f"capacity needs 0 < batch_capacity <= packed_token_capacity, got {self}")


@dataclass(frozen=True)
class TensorSpec:
    """One named program input or output; shape entries are ints or symbolic dim names."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]
    role: InputRole = InputRole.STEP_INPUT
    access: Access = Access.READ


@dataclass(frozen=True)
class OutputSpec:
    """One named program output, in return order."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]


@dataclass(frozen=True)
class ProgramSpec:
    """Everything a packer needs to call one captured program; see the module docstring."""

    operation: Operation
    capacity: Capacity
    page_tokens: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[OutputSpec, ...]
    weights: tuple[WeightSlot, ...]
    # (qualified name, schema string) of every helios op the exported graph calls, by name
    abi_ops: tuple[tuple[str, str], ...] = ()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.outputs)


def program_spec(arch: Architecture, operation: Operation, capacity: Capacity, page_tokens: int) -> ProgramSpec:
    """The spec of the program for (`operation`, `capacity`); abi_ops is filled in by capture."""
    if operation is Operation.DECODE and capacity.packed_token_capacity != capacity.batch_capacity:
        raise CheckpointError(f"a DECODE variant needs T == R, got {capacity}")
    weights = weight_layout(arch)
    inputs = (
        TensorSpec("weights", "tensor_list", (len(weights),), InputRole.WEIGHTS),
        *_state_inputs(arch, page_tokens),
        *_step_inputs(arch, capacity, operation),
    )
    return ProgramSpec(operation, capacity, page_tokens, inputs, _outputs(arch, capacity, operation), weights)


def _state_inputs(arch: Architecture, page_tokens: int) -> tuple[TensorSpec, ...]:
    cache_shape = (arch.num_layers, "pages", page_tokens, arch.num_kv_heads, arch.head_dim)
    cache, state, step, vocab = InputRole.CACHE_STORAGE, InputRole.PERSISTENT_STATE, InputRole.STEP_INPUT, arch.vocab_size
    return (
        TensorSpec("k_cache", arch.dtype, cache_shape, cache, Access.READ_WRITE),
        TensorSpec("v_cache", arch.dtype, cache_shape, cache, Access.READ_WRITE),
        TensorSpec("output_counts", "int32", ("slots", vocab), state, Access.READ_WRITE),
        # Host-written per request row: at admission (histogram) and as pages are assigned.
        TensorSpec("prompt_counts", "int32", ("request_rows", vocab), step),
        TensorSpec("page_table", "int32", ("request_rows", "max_pages"), step),
    )


def _step_inputs(arch: Architecture, capacity: Capacity, operation: Operation) -> tuple[TensorSpec, ...]:
    rows, tokens = capacity.batch_capacity, capacity.packed_token_capacity
    specs = (
        TensorSpec("token_ids", "int64", (tokens,)),
        TensorSpec("positions", "int64", (tokens,)),
        TensorSpec("query_lens", "int32", (rows,)),
        TensorSpec("request_slots", "int64", (rows,)),
        TensorSpec("generations", "int64", (rows,)),
        TensorSpec("sample_rows", "bool", (rows,)),
        TensorSpec("seeds", "int64", (rows,)),
        TensorSpec("counters", "int64", (rows,)),
        TensorSpec("sampling_params", "float32", (rows, NUM_SAMPLING_PARAMETERS)),
        TensorSpec("grammar_mask", "int32", (rows, -(-arch.vocab_size // 32))),
        TensorSpec("submission", "int64", (1,)),
    )
    if operation is Operation.MIXED:
        specs += (TensorSpec("pending_ids", "int64", (rows,)),)
    if operation is Operation.SCORED_PREFILL:
        specs += (TensorSpec("target_ids", "int64", (tokens,)),)
    return specs


def _outputs(arch: Architecture, capacity: Capacity, operation: Operation) -> tuple[OutputSpec, ...]:
    rows = capacity.batch_capacity
    outputs = (
        OutputSpec("completion", "int64", (rows, COMPLETION_FIELDS)),
        OutputSpec("logits", "float32", (rows, arch.vocab_size)),
    )
    if operation is Operation.SCORED_PREFILL:
        outputs += (OutputSpec("target_logprobs", "float32", (capacity.packed_token_capacity,)),)
    return outputs
