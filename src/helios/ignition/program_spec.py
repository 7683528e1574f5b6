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
* ``logit_bias_ids`` / ``logit_bias_values`` [request_rows, `MAX_LOGIT_BIAS`] (per slot, written at
  admission, read through ``request_slots``): each listed token's bias is added to its logit before
  sampling (and before ``helios::token_logprobs``); ids -1 pad. The ``logits`` output stays unbiased.
* ``sampling_params`` [R, 7] packs (temperature, top_k, top_p, min_p, repetition, presence,
  frequency) as in `helios.abi.sampling`; ``grammar_mask`` is all ones for unconstrained rows.
  MIXED adds ``pending_ids`` [R]: where >= 0 it replaces the row's first packed token.
* Outputs: ``completion`` [R, fields], the `helios.abi.completion` record of each row (the sampled
  token in its ``token`` column, -1 where ``sample_rows[r]`` is false), and ``logits`` [R, V], the
  float32 logits of each row's last packed token (a tensor-parallel program returns its rank's
  vocabulary rows instead, ``shard_logits`` [R, vocab_rows], and samples from them). SCORED_PREFILL adds ``target_ids`` [T] (the token
  each packed token should predict) and ``target_logprobs`` [T], that target's log-probability
  after each packed token (0 for padding tokens), then ``target_top_ids`` / ``target_top_logprobs``
  [T, K] (K = `logprob_width`): the most probable next ids after each packed token, most probable
  first (ids ascending on ties); before them it returns `LOGPROB_OUTPUTS` like a token-logprobs
  variant (only requests that ask for scores run it). A token-logprobs variant
  (`ProgramOptions.token_logprobs`) adds `LOGPROB_OUTPUTS`: ``token_logprob`` [R] (the sampled
  token's log-probability, -inf for rows that sample nothing), ``top_token_ids`` [R, K] and
  ``top_token_logprobs`` [R, K] (K = `logprob_width`), see `helios.abi.token_logprobs`.

SPECULATIVE programs (`helios.ignition.speculative`) have four extents: B rows, W verify tokens per
lane (pending token included), P packed target tokens, D proposal draws. Their per-lane inputs are
those of DECODE (``token_ids``: the pending token, ``positions``: its position; the logit-bias
inputs, applied to the draft's and the target's logits at every position) plus ``lane_tokens``
(the lane's exact target length, or with `ProgramOptions.allocates_prefixes` its immutable ceiling)
and the copied history candidates ``copied_ids`` [B, max(D, 1)], ``copied_counts``,
``copied_endpoints``. They draw with counters derived from the positions, so they take no
``counters``. (Cores prepared before SPECULATIVE programs took the logit-bias inputs keep a lane
with a bias on plain steps.) Outputs: the completion record and, when D > 0,
``proposal_confidence`` [B, D].
A SPECULATIVE token-logprobs variant then adds `LOGPROB_OUTPUTS` of every verify position:
``token_logprob`` [B, W] (the emitted token's log-probability at each position, -inf past the
lane's emitted tokens), ``top_token_ids`` / ``top_token_logprobs`` [B, W, K]: for emitted token j,
exactly what a DECODE variant returns had the lane decoded tokens 0..j-1 one by one (penalty counts
include them; the lane's mask row and its bias apply at every position).

A core with a draft model (`ProgramOptions.draft`) appends the draft's weights (names prefixed
``draft.``) to the weight list and gives every program three more inputs, last:
``draft_k_cache``, ``draft_v_cache`` (the draft's paged planes, same page ids) and
``draft_page_table``; every program writes the draft's keys/values of the tokens it consumes, so the
draft context always covers the committed history. With `ProgramOptions.record_tokens` n > 0 every
program's completion record carries n more int64 columns: the emitted token ids, -1 padded.

Startup tuning (`ProgramOptions.attention_tuning`): the TUNING program ``tune_attention`` takes an
empty weight list and the persistent buffer ``attention_splits`` int32 [number of DECODE variants],
which it fills in place (`helios.ignition.tuning`); every DECODE program then also takes
``attention_splits`` (after ``submission``) and reads its own entry, the variant's index in
`AttentionTuning.decode_rows`, as the decode split count of ``helios::paged_attention_tuned``.

Device-owned pending tokens (`ProgramOptions.device_pending`): every DECODE program also takes
``pending_tokens`` int64 [slots] (persistent state, after the tuned inputs, before the draft's).
A row whose ``token_ids`` entry is -1 feeds ``pending_tokens[request_slots[r]]`` instead, and every
row that samples stores its token there. So a decode round may be submitted behind another one
before the host has read its tokens (the second execution frame); a host-fed token (>= 0) always
wins, so prompt chunks, recomputation and restored prefixes need nothing from the device state.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from helios.abi.completion import NUM_FIELDS as COMPLETION_FIELDS
from helios.abi.sampling import NUM_SAMPLING_PARAMETERS
from helios.abi.token_logprobs import MAX_TOP
from helios.contract.views import TARGET_LOGPROB_OUTPUTS, TOKEN_LOGPROB_OUTPUTS
from helios.ignition.architecture import Architecture, CheckpointError, WeightSlot, weight_layout

Dim = int | str
DRAFT_PREFIX = "draft."  # weight names of the draft model in the combined weight list
DRAFT_INPUTS = ("draft_k_cache", "draft_v_cache", "draft_page_table")
# The two cache planes every program takes (positional parameters ``k_cache``, ``v_cache``): the
# key/value planes, or for latent attention the latent and rotary-key planes of a paged latent region.
KV_PLANES = ("k_cache", "v_cache")
LATENT_PLANES = ("latent_cache", "rope_cache")
CONFIDENCE_OUTPUT = "proposal_confidence"
# Outputs of a token-logprobs program (`ProgramOptions.token_logprobs`), in return order after the logits.
LOGPROB_OUTPUTS = TOKEN_LOGPROB_OUTPUTS
LOGPROB_OPERATIONS = frozenset({"prefill", "decode", "mixed", "speculative"})  # Operation values with a logprob variant


class Operation(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"
    SCORED_PREFILL = "scored_prefill"
    SPECULATIVE = "speculative"
    TUNING = "tuning"  # a startup tuning producer (helios.ignition.tuning)
    VISION = "vision"  # the image encoder at a patch capacity (helios.ignition.multimodal_spec)


class InputRole(enum.Enum):
    WEIGHTS = "weights"  # the lifted weight list, shared by every program of a core
    CACHE_STORAGE = "cache_storage"  # paged key/value planes [layers, pages, page_tokens, Hkv, D]
    PERSISTENT_STATE = "persistent_state"  # per-request-slot device state that outlives a step
    STEP_INPUT = "step_input"  # values packed by the host for this step only
    TUNED = "tuned"  # persistent values a startup tuning producer writes once; serving programs read them


class Access(enum.Enum):
    READ = "read"
    READ_WRITE = "read_write"


# Limits of what preparation captures (capture allocates example inputs of these extents).
MAX_BATCH_CAPACITY = 4096
MAX_VERIFY_TOKENS = 64  # speculative verify width and draft tokens per round


@dataclass(frozen=True)
class Capacity:
    """A captured variant: R request rows over T packed tokens.

    SPECULATIVE variants also declare W (`verify_tokens`, per-lane target capacity including the
    pending token) and D (`draft_tokens`, proposal draws); D is not inferred from W, and a lane
    offers at most `lane_limit` = min(D + 1, W) target positions. T is P, at most B x W.
    """

    batch_capacity: int
    packed_token_capacity: int
    verify_tokens: int = 1
    draft_tokens: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.batch_capacity <= self.packed_token_capacity:
            raise CheckpointError(f"capacity needs 0 < batch_capacity <= packed_token_capacity, got {self}")
        if self.verify_tokens < 1 or self.draft_tokens < 0:
            raise CheckpointError(f"capacity needs verify_tokens >= 1 and draft_tokens >= 0, got {self}")
        if self.verify_tokens == 1 and self.draft_tokens:
            raise CheckpointError("width-one speculative programs draw no proposals")

    @property
    def lane_limit(self) -> int:
        return min(self.draft_tokens + 1, self.verify_tokens)


MAX_LOGIT_BIAS = 300  # logit-bias entries one request may give (the width of the logit_bias_* inputs)
TUNED_SPLITS = "attention_splits"  # the tuned decode split counts, one per DECODE variant
PENDING_TOKENS = "pending_tokens"  # each request slot's last sampled token (device-owned pending token)


@dataclass(frozen=True)
class AttentionTuning:
    """The decode attention split producer: DECODE row capacities in buffer order (ascending) and
    the context the producer sizes splits for."""

    decode_rows: tuple[int, ...]
    context_tokens: int

    def index(self, rows: int) -> int:
        """The `attention_splits` entry of the DECODE variant with `rows` rows."""
        if rows not in self.decode_rows:
            raise CheckpointError(f"no tuned split count for a DECODE variant of {rows} rows")
        return self.decode_rows.index(rows)


@dataclass(frozen=True)
class ProgramOptions:
    """What every program of one core shares beyond the target Architecture.

    `draft`: the draft model proposals come from (same vocabulary), or None. `record_tokens`: emitted
    token columns appended to each completion record (0: none; a core whose lanes can emit more
    than one token needs its widest lane limit). `allocates_prefixes`: SPECULATIVE programs take
    lane ceilings and allocate prefixes from proposal confidence (else exact lane lengths).
    `attention_tuning`: DECODE programs read tuned split counts (None: they call the untuned op).
    `device_pending`: DECODE programs keep each slot's last sampled token in ``pending_tokens`` and
    read it for rows whose token the host packs as -1 (a second execution frame).
    `token_logprobs`: a PREFILL, DECODE, MIXED or SPECULATIVE program also returns `LOGPROB_OUTPUTS`,
    the ``helios::token_logprobs`` values of each row's sampled token (of each emitted token of a
    speculative lane; the logprob variant of a program, which the runtime runs only for steps
    holding a request that asks for log-probabilities).
    """

    draft: Architecture | None = None
    record_tokens: int = 0
    allocates_prefixes: bool = False
    attention_tuning: AttentionTuning | None = None
    device_pending: bool = False
    token_logprobs: bool = False
    # A vision-language core's images (`helios.ignition.multimodal_spec.MultimodalOptions`), or None.
    multimodal: object = None
    # An Engram core's staged n-gram rows (`helios.ignition.engram.EngramOptions`), or None.
    engram: object = None


def logprob_width(arch: Architecture) -> int:
    """Alternatives a token-logprobs program returns per row: `MAX_TOP`, or the whole vocabulary
    when it is smaller."""
    return min(MAX_TOP, arch.vocab_size)


def model_weight_layout(arch: Architecture, draft: Architecture | None = None,
                        extra: tuple[WeightSlot, ...] = ()) -> tuple[WeightSlot, ...]:
    """The weight list of a core's programs: the target's, its `extra` weights (a multimodal
    recipe's tables and encoder), then the draft's under `DRAFT_PREFIX`."""
    slots = weight_layout(arch) + extra
    if draft is None:
        return slots
    return slots + tuple(WeightSlot(DRAFT_PREFIX + s.name, s.shape, s.dtype) for s in weight_layout(draft))


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
    options: ProgramOptions = ProgramOptions()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.outputs)


def program_spec(arch: Architecture, operation: Operation, capacity: Capacity, page_tokens: int,
                 options: ProgramOptions = ProgramOptions()) -> ProgramSpec:
    """The spec of the program for (`operation`, `capacity`); abi_ops is filled in by capture."""
    _check_capacity(operation, capacity, options)
    if operation is Operation.TUNING:
        return _tuning_spec(capacity, page_tokens, options)
    from helios.ignition import multimodal_spec  # a multimodal core's extra inputs and its VISION program
    from helios.ignition.window_split import window_input_specs  # the sliding layers' own region
    from helios.ignition.token_indexer import index_input_specs

    weights = model_weight_layout(arch, options.draft, multimodal_spec.extra_weight_slots(options)
                                  + engram_weight_slots(arch, options))
    if operation is Operation.VISION:
        return multimodal_spec.vision_spec(capacity, page_tokens, weights, options)
    inputs = (
        TensorSpec("weights", "tensor_list", (len(weights),), InputRole.WEIGHTS),
        *_state_inputs(arch, page_tokens, options),
        *_step_inputs(arch, capacity, operation),
        *_tuned_inputs(operation, options),
        *_pending_inputs(operation, options),
        *_draft_inputs(options.draft, page_tokens),
        *_recurrent_inputs(arch),
        *window_input_specs(arch, page_tokens, options),
        *multimodal_spec.step_inputs(arch, capacity, operation, options),
        *_engram_inputs(capacity, operation, options),
        *index_input_specs(arch, page_tokens, options, operation),  # last: the token indexer's key planes
    )
    outputs = _outputs(arch, capacity, operation, options.record_tokens)
    if options.token_logprobs:
        outputs += _logprob_outputs(arch, capacity, operation)
    return ProgramSpec(operation, capacity, page_tokens, inputs, outputs, weights, options=options)


ENGRAM_ROWS = "engram_rows"  # helios.ignition.engram.ROWS_INPUT
ENGRAM_PROJ = "engram.proj"


def engram_weight_slots(arch: Architecture, options: ProgramOptions) -> tuple[WeightSlot, ...]:
    """An Engram core's projection of staged rows into the hidden width (after the decoder's weights)."""
    engram = options.engram
    if engram is None:
        return ()
    return (WeightSlot(ENGRAM_PROJ, (arch.hidden_size, engram.heads * engram.width), engram.dtype),)


def _engram_inputs(capacity: Capacity, operation: Operation, options: ProgramOptions) -> tuple[TensorSpec, ...]:
    engram = options.engram
    if engram is None or operation not in (Operation.PREFILL, Operation.DECODE, Operation.MIXED,
                                           Operation.SCORED_PREFILL):
        return ()
    return (TensorSpec(ENGRAM_ROWS, engram.dtype, (capacity.packed_token_capacity, engram.heads, engram.width)),)


def _tuned_splits_spec(tuning: AttentionTuning) -> TensorSpec:
    return TensorSpec(TUNED_SPLITS, "int32", (len(tuning.decode_rows),), InputRole.TUNED, Access.READ)


def _tuned_inputs(operation: Operation, options: ProgramOptions) -> tuple[TensorSpec, ...]:
    if operation is not Operation.DECODE or options.attention_tuning is None:
        return ()
    return (_tuned_splits_spec(options.attention_tuning),)


def _pending_inputs(operation: Operation, options: ProgramOptions) -> tuple[TensorSpec, ...]:
    if operation is not Operation.DECODE or not options.device_pending:
        return ()
    return (TensorSpec(PENDING_TOKENS, "int64", ("slots",), InputRole.PERSISTENT_STATE, Access.READ_WRITE),)


def _tuning_spec(capacity: Capacity, page_tokens: int, options: ProgramOptions) -> ProgramSpec:
    """The producer's convention: an empty weight list, then the buffer it fills in place."""
    if options.attention_tuning is None:
        raise CheckpointError("a TUNING program needs ProgramOptions.attention_tuning")
    splits = dataclasses.replace(_tuned_splits_spec(options.attention_tuning), access=Access.READ_WRITE)
    inputs = (TensorSpec("weights", "tensor_list", (0,), InputRole.WEIGHTS), splits)
    return ProgramSpec(Operation.TUNING, capacity, page_tokens, inputs, (), (), options=options)


def _logprob_outputs(arch: Architecture, capacity: Capacity,
                     operation: Operation = Operation.DECODE) -> tuple[OutputSpec, ...]:
    """`LOGPROB_OUTPUTS`: one entry a row, or a SPECULATIVE program's one entry a verify position [B, W]."""
    rows, width = (capacity.batch_capacity,), logprob_width(arch)
    if operation is Operation.SPECULATIVE:
        rows += (capacity.verify_tokens,)
    shapes = (rows, (*rows, width), (*rows, width))
    return tuple(OutputSpec(name, dtype, shape)
                 for name, dtype, shape in zip(LOGPROB_OUTPUTS, ("float32", "int64", "float32"), shapes))


def _check_capacity(operation: Operation, capacity: Capacity, options: ProgramOptions) -> None:
    if options.engram is not None and (options.device_pending or options.draft is not None
                                       or options.multimodal is not None or operation is Operation.SPECULATIVE):
        raise CheckpointError("an Engram core hashes every token on the host: its programs take host-fed tokens "
                              "(no device-owned pending tokens, drafts, speculation or images)")
    if options.token_logprobs and operation.value not in LOGPROB_OPERATIONS:
        raise CheckpointError(f"{operation.value} programs have no token-logprobs variant")
    if operation is Operation.DECODE and capacity.packed_token_capacity != capacity.batch_capacity:
        raise CheckpointError(f"a DECODE variant needs T == R, got {capacity}")
    if operation is not Operation.SPECULATIVE:
        if capacity.verify_tokens != 1 or capacity.draft_tokens:
            raise CheckpointError(f"only SPECULATIVE variants declare W and D, got {operation.value} {capacity}")
        return
    if options.draft is None:
        raise CheckpointError("SPECULATIVE programs need a draft model")
    if capacity.packed_token_capacity > capacity.batch_capacity * capacity.verify_tokens:
        raise CheckpointError(f"a SPECULATIVE variant needs P <= B x W, got {capacity}")
    if capacity.lane_limit > max(1, options.record_tokens):
        raise CheckpointError(
            f"completion records hold {options.record_tokens} tokens; lanes emit {capacity.lane_limit}")


def cache_plane_names(arch: Architecture, prefix: str = "") -> tuple[str, str]:
    """The names of `arch`'s two cache planes (`prefix` + ``k_cache``/``v_cache`` or the latent pair)."""
    return tuple(prefix + name for name in (LATENT_PLANES if arch.latent is not None else KV_PLANES))


def cache_plane_specs(arch: Architecture, page_tokens: int, prefix: str = "",
                      split: bool = False) -> tuple[TensorSpec, TensorSpec]:
    """`arch`'s two cache-storage inputs: [layers, pages, page_tokens, Hkv, D] key and value planes,
    or [layers, pages, page_tokens, C] latent and [layers, pages, page_tokens, Dr] rotary-key planes.
    With `split` (`helios.ignition.window_split`) they hold the full-attention layers only."""
    from helios.ignition.window_split import full_layers

    names = cache_plane_names(arch, prefix)
    layers = len(full_layers(arch)) if split else len(arch.attention_layers)
    if arch.latent is None:
        shapes = [(layers, "pages", page_tokens, arch.num_kv_heads, arch.head_dim)] * 2
    else:
        shapes = [(layers, "pages", page_tokens, arch.latent.kv_lora_rank),
                  (layers, "pages", page_tokens, arch.latent.qk_rope_head_dim)]
    return tuple(TensorSpec(name, arch.dtype, shape, InputRole.CACHE_STORAGE, Access.READ_WRITE)
                 for name, shape in zip(names, shapes))


def canonical_input_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """Input names with latent plane names replaced by the programs' positional parameter names."""
    renames = dict(zip(LATENT_PLANES, KV_PLANES))
    renames.update(zip(("draft_" + n for n in LATENT_PLANES), DRAFT_INPUTS[:2]))
    return tuple(renames.get(name, name) for name in names)


def _draft_inputs(draft: Architecture | None, page_tokens: int) -> tuple[TensorSpec, ...]:
    if draft is None:
        return ()
    return (*cache_plane_specs(draft, page_tokens, "draft_"),
            TensorSpec(DRAFT_INPUTS[2], "int32", ("request_rows", "max_pages")))


def _recurrent_inputs(arch: Architecture) -> tuple[TensorSpec, ...]:
    """A hybrid decoder's mixer state rows (see `helios.ignition.hybrid_program`); ``ssm_state`` holds
    either kind's float32 recurrent state (`helios.ignition.recurrent_geometry`)."""
    g = arch.recurrent
    if g is None:
        return ()
    layers, cache = len(g.layers), InputRole.CACHE_STORAGE
    return (
        TensorSpec("conv_state", arch.dtype, (layers, "slots", g.conv_dim, g.conv_kernel - 1), cache,
                   Access.READ_WRITE),
        TensorSpec("ssm_state", "float32", (layers, "slots", *g.state_shape), cache,
                   Access.READ_WRITE),
    )


def _state_inputs(arch: Architecture, page_tokens: int, options: ProgramOptions) -> tuple[TensorSpec, ...]:
    from helios.ignition.window_split import window_tokens

    state, step, vocab = InputRole.PERSISTENT_STATE, InputRole.STEP_INPUT, arch.vocab_size
    return (
        *cache_plane_specs(arch, page_tokens, split=window_tokens(arch, options) > 0),
        TensorSpec("output_counts", "int32", ("slots", vocab), state, Access.READ_WRITE),
        # Host-written per request row: at admission (histogram) and as pages are assigned.
        TensorSpec("prompt_counts", "int32", ("request_rows", vocab), step),
        TensorSpec("page_table", "int32", ("request_rows", "max_pages"), step),
    )


def _step_inputs(arch: Architecture, capacity: Capacity, operation: Operation) -> tuple[TensorSpec, ...]:
    rows, tokens = capacity.batch_capacity, capacity.packed_token_capacity
    if operation is Operation.SPECULATIVE:
        return _speculative_inputs(arch, capacity)
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
        # Host-written per request row at admission: the request's logit bias (ids -1 padded).
        TensorSpec("logit_bias_ids", "int64", ("request_rows", MAX_LOGIT_BIAS)),
        TensorSpec("logit_bias_values", "float32", ("request_rows", MAX_LOGIT_BIAS)),
        TensorSpec("submission", "int64", (1,)),
    )
    if operation is Operation.MIXED:
        specs += (TensorSpec("pending_ids", "int64", (rows,)),)
    if operation is Operation.SCORED_PREFILL:
        specs += (TensorSpec("target_ids", "int64", (tokens,)),)
    return specs


def _speculative_inputs(arch: Architecture, capacity: Capacity) -> tuple[TensorSpec, ...]:
    rows, candidates = capacity.batch_capacity, max(capacity.draft_tokens, 1)
    return (
        TensorSpec("token_ids", "int64", (rows,)),
        TensorSpec("positions", "int64", (rows,)),
        TensorSpec("lane_tokens", "int32", (rows,)),
        TensorSpec("request_slots", "int64", (rows,)),
        TensorSpec("generations", "int64", (rows,)),
        TensorSpec("seeds", "int64", (rows,)),
        TensorSpec("sampling_params", "float32", (rows, NUM_SAMPLING_PARAMETERS)),
        TensorSpec("grammar_mask", "int32", (rows, -(-arch.vocab_size // 32))),
        # The lanes' logit bias, as plain programs take it (per request row, written at admission).
        TensorSpec("logit_bias_ids", "int64", ("request_rows", MAX_LOGIT_BIAS)),
        TensorSpec("logit_bias_values", "float32", ("request_rows", MAX_LOGIT_BIAS)),
        TensorSpec("submission", "int64", (1,)),
        TensorSpec("copied_ids", "int64", (rows, candidates)),
        TensorSpec("copied_counts", "int32", (rows,)),
        TensorSpec("copied_endpoints", "int64", (rows,)),
    )


def _logits_output(arch: Architecture, rows: int) -> OutputSpec:
    """``logits`` [R, V]; under tensor parallelism each rank's own vocabulary rows, ``shard_logits``
    [R, vocab_rows] (the programs sample from their shard and never assemble the vocabulary)."""
    if arch.tensor_parallel > 1:
        return OutputSpec("shard_logits", "float32", (rows, arch.vocab_rows))
    return OutputSpec("logits", "float32", (rows, arch.vocab_size))


def _outputs(arch: Architecture, capacity: Capacity, operation: Operation,
             record_tokens: int) -> tuple[OutputSpec, ...]:
    rows = capacity.batch_capacity
    record = OutputSpec("completion", "int64", (rows, COMPLETION_FIELDS + record_tokens))
    if operation is Operation.SPECULATIVE:
        drafts = capacity.draft_tokens
        return (record,) + ((OutputSpec(CONFIDENCE_OUTPUT, "float32", (rows, drafts)),) if drafts else ())
    outputs = (record, _logits_output(arch, rows))
    if operation is Operation.SCORED_PREFILL:  # the sampled token's scores, then the targets'
        tokens, width = capacity.packed_token_capacity, logprob_width(arch)
        outputs += _logprob_outputs(arch, capacity) + tuple(OutputSpec(name, dtype, shape) for name, dtype, shape in zip(
            TARGET_LOGPROB_OUTPUTS, ("float32", "int64", "float32"), ((tokens,), (tokens, width), (tokens, width))))
    return outputs
