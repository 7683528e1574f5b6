"""Reusable contract declarations: admission, sampling, state transfer and paged text.

A recipe's captured programs follow the calling convention of `ProgramSpec`; this module declares,
for every program input, where shared packing obtains its value (`ValueBinding`), which physical
buffer backs it (`Buffer`), and which state it reads or writes (`StateView`/`StateAccess`). The
result is a `ServingContract` plus `ExecutionManifest` that the generic runtime serves with no
knowledge of the model. Input names here are the programs' own calling convention (defined in
`helios.ignition.program_spec`), never model identities.

Declarations, per input of the paged-text programs:

* admission sampling: ``prompt_counts`` (PROMPT_HISTOGRAM, physical request row, written once at
  admission), ``seeds`` (SEED_BITS), ``sampling_params`` (SAMPLING_PARAMETERS, FP32 columns in
  `helios.abi.sampling` order), ``grammar_mask`` (GRAMMAR_MASK; padding -1 allows every token);
* request identity and lane geometry: ``request_slots`` (SLOT), ``generations`` (GENERATION),
  ``query_lens`` (QUERY_LENGTH), ``sample_rows`` (SAMPLING_DECISION);
* tokens and positions: ``token_ids``/``positions`` (PROMPT_TOKENS/PROMPT_POSITIONS packed; DECODE
  binds PENDING_TOKEN and CONSUMED_TOKEN_START per row instead), ``target_ids``
  (SCORED_TARGET_TOKENS), ``counters`` (CONSUMED_TOKEN_END: the draw counter of a row is the
  token endpoint it samples at, so draws depend on the request alone);
* cache bindings: ``page_table`` (PAGE_TABLE, physical request row: only new entries are uploaded);
* state transfer: ``output_counts`` (persistent state, read/write), the k/v planes (cache storage
  of one paged key/value region);
* device-owned pending tokens: DECODE programs with ``pending_tokens`` (persistent state,
  read/write, one int64 per slot) name it as their ``pending_token_view`` and still bind
  PENDING_TOKEN: the host's token where it packs one (>= 0), the view's for rows packed as -1.

Startup tuning: a TUNING program (`helios.ignition.tuning`) becomes a TUNING graph listed in the
manifest's tuning catalog (never the execution catalog) with the buffers it fills as outputs; its
inputs of role TUNED are persistent-state buffers that serving graphs read with no state view and
declare as ``tuned_bindings`` naming the producer.

Cores with a draft model and SPECULATIVE programs add the declarations of
`helios.ignition.preparation.speculative` (draft region, view and cursor, speculative extents and
length sources, copied-token inputs, record token columns, proposal confidence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.prepared import PreparedContract
from helios.ignition.multimodal_spec import FEATURE_INDICES, ROTARY_DELTAS, ROTARY_OFFSETS, VISION_INPUTS
from helios.ignition.engram import HOST_TABLE, ROWS_INPUT as ENGRAM_ROWS
from helios.ignition.preparation import speculative as spec_decl
from helios.ignition.program_spec import (
    CONFIDENCE_OUTPUT, LATENT_PLANES, LOGPROB_OUTPUTS, PENDING_TOKENS, InputRole, Operation, ProgramSpec, TensorSpec,
)
from helios.ignition.tuning import TUNING_GRAPH
from helios.ignition.window_split import WINDOW_INPUTS, WINDOW_REGION

S, M = spb, mpb
EXPORTED_CONTRACT_VERSION = 3
MANIFEST_VERSION = 1
COMPLETION_BUFFER = "completion"  # also the name of the programs' record output
SUBMISSION_INPUT = "submission"  # written by the transport, not by a value binding
COMPLETION_FIELDS = 10  # int64 columns of helios.abi.completion.CompletionLayout

_OPERATIONS = {
    Operation.PREFILL: S.GRAPH_OPERATION_PREFILL,
    Operation.DECODE: S.GRAPH_OPERATION_DECODE,
    Operation.MIXED: S.GRAPH_OPERATION_MIXED,
    Operation.SCORED_PREFILL: S.GRAPH_OPERATION_SCORED_PREFILL,
    Operation.SPECULATIVE: S.GRAPH_OPERATION_SPECULATIVE,
    Operation.VISION: S.GRAPH_OPERATION_VISION,
}
_DTYPES = {
    "float32": M.DTYPE_FLOAT32, "bfloat16": M.DTYPE_BFLOAT16, "float16": M.DTYPE_FLOAT16,
    "int64": M.DTYPE_INT64, "int32": M.DTYPE_INT32, "bool": M.DTYPE_BOOL, "uint8": M.DTYPE_UINT8,
}
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1, "uint8": 1}
_EXTENTS = {"pages": M.LOAD_EXTENT_PHYSICAL_PAGES, "slots": M.LOAD_EXTENT_STATE_ROWS,
            "window_pages": M.LOAD_EXTENT_WINDOW_PAGES}

# (source, indexing, padding) of every bound step input; DECODE overrides the packed-token rows.
_BINDINGS = {
    "token_ids": (S.VALUE_SOURCE_PROMPT_TOKENS, S.INDEXING_PACKED_TOKEN, 0),
    "positions": (S.VALUE_SOURCE_PROMPT_POSITIONS, S.INDEXING_PACKED_TOKEN, 0),
    "target_ids": (S.VALUE_SOURCE_SCORED_TARGET_TOKENS, S.INDEXING_PACKED_TOKEN, -1),
    "query_lens": (S.VALUE_SOURCE_QUERY_LENGTH, S.INDEXING_SUBMISSION_ROW, 0),
    "page_table": (S.VALUE_SOURCE_PAGE_TABLE, S.INDEXING_PHYSICAL_REQUEST_ROW, 0),
    WINDOW_INPUTS[2]: (S.VALUE_SOURCE_PAGE_TABLE, S.INDEXING_PHYSICAL_REQUEST_ROW, 0),
    "request_slots": (S.VALUE_SOURCE_SLOT, S.INDEXING_SUBMISSION_ROW, -1),
    "generations": (S.VALUE_SOURCE_GENERATION, S.INDEXING_SUBMISSION_ROW, -1),
    "sample_rows": (S.VALUE_SOURCE_SAMPLING_DECISION, S.INDEXING_SUBMISSION_ROW, 0),
    "seeds": (S.VALUE_SOURCE_SEED_BITS, S.INDEXING_SUBMISSION_ROW, 0),
    "counters": (S.VALUE_SOURCE_CONSUMED_TOKEN_END, S.INDEXING_SUBMISSION_ROW, 0),
    "sampling_params": (S.VALUE_SOURCE_SAMPLING_PARAMETERS, S.INDEXING_SUBMISSION_ROW, 0),
    "grammar_mask": (S.VALUE_SOURCE_GRAMMAR_MASK, S.INDEXING_SUBMISSION_ROW, -1),
    "pending_ids": (S.VALUE_SOURCE_PENDING_TOKEN, S.INDEXING_SUBMISSION_ROW, -1),
    "prompt_counts": (S.VALUE_SOURCE_PROMPT_HISTOGRAM, S.INDEXING_PHYSICAL_REQUEST_ROW, 0),
    "logit_bias_ids": (S.VALUE_SOURCE_LOGIT_BIAS_IDS, S.INDEXING_PHYSICAL_REQUEST_ROW, -1),
    "logit_bias_values": (S.VALUE_SOURCE_LOGIT_BIAS_VALUES, S.INDEXING_PHYSICAL_REQUEST_ROW, 0),
    FEATURE_INDICES: (S.VALUE_SOURCE_IMAGE_FEATURE_INDICES, S.INDEXING_PACKED_TOKEN, -1),
    ENGRAM_ROWS: (S.VALUE_SOURCE_HOST_TABLE_ROWS, S.INDEXING_PACKED_TOKEN, 0),
    ROTARY_OFFSETS: (S.VALUE_SOURCE_IMAGE_TENSOR, S.INDEXING_PACKED_TOKEN, 0),
    **{name: (S.VALUE_SOURCE_IMAGE_TENSOR, S.INDEXING_SCALAR, 0) for name in VISION_INPUTS},
    **spec_decl.SPECULATIVE_BINDINGS,
}
_DECODE_BINDINGS = {
    "token_ids": (S.VALUE_SOURCE_PENDING_TOKEN, S.INDEXING_SUBMISSION_ROW, 0),
    "positions": (S.VALUE_SOURCE_CONSUMED_TOKEN_START, S.INDEXING_SUBMISSION_ROW, 0),
}


@dataclass(frozen=True)
class FrontendDeclaration:
    """Parser selectors and syntax data; `tool_syntax`/`reasoning_syntax` are None when unused."""

    tool_parser: int = S.TOOL_PARSER_NONE
    reasoning_parser: int = S.REASONING_PARSER_NONE
    tool_syntax: spb.ToolSyntax | None = None
    reasoning_syntax: spb.ReasoningSyntax | None = None
    assistant_boundary: spb.AssistantBoundary | None = None
    prefix_boundaries: tuple[spb.PrefixBoundaryRule, ...] = ()
    family: str = "none"  # the declared family's name, for preparation logs (not contract data)
    channel_syntax: spb.ChannelSyntax | None = None  # the harmony channel parsers' markup
    tool_call_id_len: int = 0  # random alphanumeric tool-call ids the template requires (0: any id renders)
    clean_up_tokenization_spaces: bool = False  # decoded text gets transformers' tokenization-space cleanup


@dataclass(frozen=True)
class HostTableDeclaration:
    """A host staging table: its name, hash, and the PLACEMENT_HOST WEIGHT buffer that holds it."""

    name: str
    ngram_tokens: int
    heads: int
    multipliers: tuple[int, ...]
    shape: tuple[int, int]
    dtype: str
    resource_id: str

    @property
    def buffer(self) -> str:
        return f"w.{self.name}.table"


@dataclass(frozen=True)
class PagedTextDeclaration:
    """Everything a paged-text model declares beyond its captured programs."""

    served_id: str
    cache_identity: str
    vocab_size: int
    page_tokens: int
    context_tokens: int
    prefill_tokens: int
    max_concurrency: int
    page_capacity: int
    eos_token_ids: tuple[int, ...]
    sampling: spb.SamplingDefaults
    template_tokens: tuple[spb.TemplateToken, ...] = ()
    aliases: tuple[str, ...] = ()
    frontend: FrontendDeclaration = field(default_factory=FrontendDeclaration)
    ranks: int = 1
    # Sliding-window extent (tokens) when every layer attends only to that many latest positions: the
    # history region is then declared a sliding window, whose older pages the runtime releases. 0: full.
    history_window: int = 0
    # Window (tokens) of the sliding layers' own region when the layers mix sliding and full attention
    # (`helios.ignition.window_split`): a SLIDING_WINDOW region with its own page ids. 0: none.
    split_window: int = 0
    snapshot_capacity: int = 0  # continuation rows for snapshots at exact endpoints (default at load)
    # Declares a vision-language model's vision capacities, image sentinels and frontend image
    # selectors into the model contract (`preparation.vision_contract`); None: text only.
    images: Callable[[spb.ModelContract], None] | None = None
    # An Engram core's n-gram table, kept in host memory (`helios.ignition.engram`); None: none.
    host_table: HostTableDeclaration | None = None

    @property
    def max_pages_per_request(self) -> int:
        return -(-self.context_tokens // self.page_tokens)


@dataclass(frozen=True)
class ProgramResource:
    """A captured program of one rank and the core resource id that stores it."""

    spec: ProgramSpec
    resource_id: str
    rank: int = 0


def graph_name(operation: Operation, token_logprobs: bool = False) -> str:
    """A graph's name: its operation's, with ``_logprobs`` for the token-logprobs variant."""
    return operation.value + ("_logprobs" if token_logprobs else "")


def _graph_of(spec: ProgramSpec) -> str:
    return graph_name(spec.operation, spec.options.token_logprobs)


def declare_paged_text(
    declaration: PagedTextDeclaration, programs: Sequence[ProgramResource], weights_resource: Sequence[str],
    draft_weights_resource: str | None = None, weight_parts: Mapping[str, str] | None = None,
) -> PreparedContract:
    """The validated contract and manifest of `programs` (every operation's variants, every rank).

    `weights_resource[rank]` is the resource id of that rank's weight file; `draft_weights_resource`
    holds the draft model's weights when the programs have one. `weight_parts` (weight slot ->
    rank 0's resource) names the resource of each slot when rank 0's weights span several
    resources (`helios.ignition.sharding.WEIGHT_PART_NBYTES`); slots it lacks are in
    `weights_resource[0]`.
    """
    tuning = [p for p in programs if p.spec.operation is Operation.TUNING]
    programs = [p for p in programs if p.spec.operation is not Operation.TUNING]
    if not programs:
        raise ValueError("at least one captured program is required")
    first = programs[0].spec
    manifest = M.ExecutionManifest(version=MANIFEST_VERSION, ranks=declaration.ranks)
    manifest.buffers.extend(_buffers(declaration, programs, weights_resource, draft_weights_resource, weight_parts))
    producers = _producers(tuning)
    manifest.destinations.extend(
        M.TransportDestination(name=name, buffer=name) for name in sorted(_bound_inputs(programs))
    )
    manifest.completion.CopyFrom(_completion_layout(programs))
    graphs = []
    for name in _graph_names(programs):
        variants = [p for p in programs if _graph_of(p.spec) == name]
        operation = variants[0].spec.operation
        graphs.append(_graph(name, variants, first, producers))
        manifest.execution_catalog.add(graph=name, operation=_OPERATIONS[operation])
        _add_handles(manifest, name, variants)
    graphs += _tuning_graphs(manifest, tuning)
    manifest.abi_operations.extend(
        M.AbiOperation(name=name, schema=schema) for name, schema in sorted(_abi_ops([*programs, *tuning]).items())
    )
    contract = _serving(declaration, graphs, cache_planes(first))
    _declare_recurrent(contract.model, programs)
    if spec_decl.has_draft(programs):
        spec_decl.declare_draft_cache(contract.model, cache_planes(first, spec_decl.DRAFT_PLANE_PREFIX))
    contract.speculative_widths.extend(spec_decl.speculative_widths(programs))
    return PreparedContract.from_messages(contract, manifest)


def _declare_recurrent(model: spb.ModelContract, programs: Sequence[ProgramResource]) -> None:
    """Cache storage sized by state rows (a hybrid decoder's mixer state) is one RECURRENT region."""
    planes = [t.name for t in _widest_inputs(programs) if t.role is InputRole.CACHE_STORAGE and "slots" in t.shape]
    if planes:
        model.cache.regions.add(name="recurrent", kind=S.HISTORY_KIND_RECURRENT, planes=planes)


def _add_handles(manifest: mpb.ExecutionManifest, graph: str, variants: Sequence[ProgramResource]) -> None:
    for program in variants:
        manifest.graph_handles.add(
            graph=graph, capacity=_capacity(program.spec), resource_id=program.resource_id, rank=program.rank,
            abi_operations=[name for name, _ in program.spec.abi_ops],
            program_inputs=list(program.spec.input_names[1:]), program_outputs=list(program.spec.output_names),
        )


def _tuned_outputs(spec: ProgramSpec) -> list[str]:
    return [t.name for t in spec.inputs if t.role is InputRole.TUNED]


def _producers(tuning: Sequence[ProgramResource]) -> dict[str, str]:
    """Tuned buffer name -> the TUNING graph that fills it."""
    return {name: TUNING_GRAPH for program in tuning for name in _tuned_outputs(program.spec)}


def _tuning_graphs(manifest: mpb.ExecutionManifest, tuning: Sequence[ProgramResource]) -> list[spb.GraphContract]:
    """The TUNING graph (no bindings, state accesses or weights), its catalog entry and handles."""
    if not tuning:
        return []
    graph = spb.GraphContract(name=TUNING_GRAPH, operation=S.GRAPH_OPERATION_TUNING)
    graph.variants.append(_capacity(tuning[0].spec))
    manifest.tuning_catalog.add(graph=TUNING_GRAPH, outputs=_tuned_outputs(tuning[0].spec))
    _add_handles(manifest, TUNING_GRAPH, tuning)
    return [graph]


def _graph_names(programs: Iterable[ProgramResource]) -> list[str]:
    """One graph per operation (and per logprob variant of one), in capture order."""
    seen: list[str] = []
    for program in programs:
        if _graph_of(program.spec) not in seen:
            seen.append(_graph_of(program.spec))
    return seen


def _abi_ops(programs: Sequence[ProgramResource]) -> dict[str, str]:
    ops: dict[str, str] = {}
    for program in programs:
        for name, schema in program.spec.abi_ops:
            if ops.setdefault(name, schema) != schema:
                raise ValueError(f"programs were captured against two schemas of {name}")
    return ops


def _bound_inputs(programs: Sequence[ProgramResource]) -> set[str]:
    return {spec.name for p in programs for spec in p.spec.inputs if spec.name in _BINDINGS}


def _capacity(spec: ProgramSpec) -> spb.GraphCapacity:
    if spec.operation is Operation.SPECULATIVE:
        return spec_decl.speculative_capacity(spec)
    rows, tokens = spec.capacity.batch_capacity, spec.capacity.packed_token_capacity
    width = 1 if spec.operation is Operation.DECODE else tokens
    patches = tokens if spec.operation is Operation.VISION else 0
    return spb.GraphCapacity(batch_capacity=rows, token_capacity=width, packed_token_capacity=tokens,
                             patch_capacity=patches)


def _graph(name: str, variants: Sequence[ProgramResource], spec: ProgramSpec,
           producers: dict[str, str]) -> spb.GraphContract:
    operation = variants[0].spec.operation
    rows = 0 if operation is Operation.VISION else 1
    graph = spb.GraphContract(name=name, operation=_OPERATIONS[operation], state_rows_per_request=rows)
    if variants[0].spec.options.token_logprobs:
        graph.token_logprobs = _logprob_width(variants[0].spec)
    seen = set()
    for program in variants:
        if program.spec.capacity in seen:
            continue
        seen.add(program.spec.capacity)
        graph.variants.append(_capacity(program.spec))
    inputs = variants[0].spec.inputs
    table = {**_BINDINGS, **(_DECODE_BINDINGS if operation is Operation.DECODE else {})}
    if operation is Operation.SPECULATIVE:
        table.update(spec_decl.speculative_overrides(variants[0].spec))
        if spec.options.draft is not None:
            graph.draft_cursor = spec_decl.DRAFT_CURSOR
    for tensor in inputs:
        if tensor.name in table:
            source, indexing, padding = table[tensor.name]
            output = tensor.name if source == S.VALUE_SOURCE_IMAGE_TENSOR else ""
            host_table = HOST_TABLE if source == S.VALUE_SOURCE_HOST_TABLE_ROWS else ""
            graph.bindings.add(destination=tensor.name, source=source, indexing=indexing, padding=padding,
                               image_output=output, host_table=host_table)
        elif tensor.role is InputRole.PERSISTENT_STATE:
            mode = S.ACCESS_MODE_READ_WRITE if tensor.access.value == "read_write" else S.ACCESS_MODE_READ
            graph.state_accesses.add(view=tensor.name, mode=mode)
        elif tensor.role is InputRole.TUNED:
            if tensor.name not in producers:
                raise ValueError(f"{operation.value} programs read {tensor.name!r}; no tuning program fills it")
            graph.tuned_bindings.add(buffer=tensor.name, producer=producers[tensor.name])
        if tensor.name == PENDING_TOKENS:  # host-fed where packed >= 0, else this device state
            graph.pending_token_view = PENDING_TOKENS
    graph.resource_dependencies.extend(_weight_buffer(slot.name) for slot in spec.weights)
    return graph


def _logprob_width(spec: ProgramSpec) -> int:
    """The alternatives per row a token-logprobs program returns (its top-ids output's width)."""
    return next(int(o.shape[-1]) for o in spec.outputs if o.name == LOGPROB_OUTPUTS[1])


def _weight_buffer(name: str) -> str:
    return f"w.{name}"


def _dims(shape: Sequence[int | str], declaration: PagedTextDeclaration, fixed: bool = False) -> list[mpb.Dim]:
    """Manifest dims; `fixed` (INPUT buffers) sizes request-slot dims at the captured concurrency."""
    dims = []
    for dim in shape:
        if dim == "max_pages":
            dims.append(M.Dim(size=declaration.max_pages_per_request))
        elif dim == "request_rows" or (dim == "slots" and fixed):
            dims.append(M.Dim(size=declaration.max_concurrency))
        elif isinstance(dim, str):
            dims.append(M.Dim(load_extent=_EXTENTS[dim]))
        else:
            dims.append(M.Dim(size=dim))
    return dims


def _buffers(declaration, programs, weights_resource, draft_resource=None, parts=None) -> list[mpb.Buffer]:
    buffers: dict[str, mpb.Buffer] = {}
    spec = programs[0].spec
    parts = parts or {}
    for slot in spec.weights:
        target = parts.get(slot.name, weights_resource[0])
        buffers[_weight_buffer(slot.name)] = M.Buffer(
            name=_weight_buffer(slot.name), dtype=_DTYPES[slot.dtype], shape=_dims(slot.shape, declaration),
            placement=M.PLACEMENT_DEVICE, role=M.BUFFER_ROLE_WEIGHT,
            resource_id=spec_decl.weight_resource(slot.name, target, draft_resource),
        )
    for tensor in _widest_inputs(programs):
        role = _role(tensor)
        buffers[tensor.name] = M.Buffer(
            name=tensor.name, dtype=_DTYPES[tensor.dtype], placement=M.PLACEMENT_DEVICE, role=role,
            shape=_dims(tensor.shape, declaration, fixed=role == M.BUFFER_ROLE_INPUT),
        )
    for output in _widest_outputs(programs):
        buffers[output.name] = M.Buffer(
            name=output.name, dtype=_DTYPES[output.dtype], role=M.BUFFER_ROLE_OUTPUT,
            placement=M.PLACEMENT_DEVICE, shape=_dims(output.shape, declaration, fixed=True),
        )
    table = declaration.host_table
    if table is not None:
        buffers[table.buffer] = M.Buffer(
            name=table.buffer, dtype=_DTYPES[table.dtype], shape=[M.Dim(size=size) for size in table.shape],
            placement=M.PLACEMENT_HOST, role=M.BUFFER_ROLE_WEIGHT, resource_id=table.resource_id)
    rows = max(p.spec.capacity.batch_capacity for p in programs)
    buffers[COMPLETION_BUFFER] = M.Buffer(
        name=COMPLETION_BUFFER, dtype=M.DTYPE_UINT8, role=M.BUFFER_ROLE_OUTPUT, placement=M.PLACEMENT_HOST,
        shape=[M.Dim(size=2), M.Dim(size=rows), M.Dim(size=spec_decl.completion_columns(programs) * 8)],
    )
    confidence = spec_decl.confidence_buffer(programs)
    if confidence is not None:
        buffers[CONFIDENCE_OUTPUT] = confidence
    return list(buffers.values())


def _widest_inputs(programs: Sequence[ProgramResource]) -> list[TensorSpec]:
    """Each non-weight input once, at the largest static extent any variant uses."""
    widest: dict[str, TensorSpec] = {}
    for program in programs:
        for tensor in program.spec.inputs:
            if tensor.role is InputRole.WEIGHTS:
                continue
            known = widest.get(tensor.name)
            if known is None or _static_size(tensor) > _static_size(known):
                widest[tensor.name] = tensor
    return list(widest.values())


def _widest_outputs(programs: Sequence[ProgramResource]):
    """Each output but the completion record once, at its largest static extent."""
    widest = {}
    for program in programs:
        for output in program.spec.outputs:
            known = widest.get(output.name)
            framed = output.name in (COMPLETION_BUFFER, CONFIDENCE_OUTPUT)  # declared with their frames
            if not framed and (known is None or _static_size(output) > _static_size(known)):
                widest[output.name] = output
    return list(widest.values())


def _static_size(tensor) -> int:
    size = 1
    for dim in tensor.shape:
        size *= dim if isinstance(dim, int) else 1
    return size


def _role(tensor: TensorSpec) -> int:
    if tensor.name in _BINDINGS:
        return M.BUFFER_ROLE_INPUT  # host-written through a transport destination
    if tensor.role is InputRole.CACHE_STORAGE:
        return M.BUFFER_ROLE_CACHE_STORAGE
    if tensor.role in (InputRole.PERSISTENT_STATE, InputRole.TUNED):
        return M.BUFFER_ROLE_PERSISTENT_STATE
    return M.BUFFER_ROLE_INPUT


def _completion_layout(programs: Sequence[ProgramResource]) -> mpb.CompletionLayout:
    """Byte layout of helios.abi.completion records (int64 columns, see CompletionLayout), plus the
    emitted-token columns of cores whose lanes emit more than one token."""
    layout = M.CompletionLayout(
        buffer=COMPLETION_BUFFER, frames=2, record_bytes=spec_decl.completion_columns(programs) * 8,
        submission_input=SUBMISSION_INPUT,
    )
    for kind, column, count in spec_decl.completion_fields(programs):
        layout.fields.add(kind=kind, byte_offset=column * 8, dtype=M.DTYPE_INT64, count=count)
    if spec_decl.confidence_buffer(programs) is not None:
        layout.confidence_buffer = CONFIDENCE_OUTPUT
    return layout


def cache_planes(spec: ProgramSpec, prefix: str = "") -> list[str]:
    """The paged cache-storage planes of one model of `spec` (the target's, or the draft's by
    `prefix`); storage sized by state rows ("slots") belongs to the recurrent region instead."""
    planes = [t.name for t in spec.inputs if t.role is InputRole.CACHE_STORAGE and "slots" not in t.shape]
    return [name for name in planes if name.startswith(prefix) and (prefix or not name.startswith("draft_"))]


def history_kind(planes: Sequence[str]) -> int:
    """Paged latent storage for latent/rotary-key planes, paged key/value storage otherwise."""
    latent = [name.endswith(LATENT_PLANES[0]) for name in planes]
    return S.HISTORY_KIND_PAGED_LATENT if any(latent) else S.HISTORY_KIND_PAGED_KEY_VALUE


def _serving(declaration: PagedTextDeclaration, graphs: list[spb.GraphContract],
             planes: Sequence[str]) -> spb.ServingContract:
    vocab = declaration.vocab_size
    model = spb.ModelContract(version=EXPORTED_CONTRACT_VERSION)
    model.vocabulary.sampled.begin, model.vocabulary.sampled.end = 0, vocab
    model.vocabulary.histogram_bins = vocab
    model.vocabulary.mask_words = -(-vocab // 32)
    model.input_vocabulary.input.begin, model.input_vocabulary.input.end = 0, vocab
    model.cache.page_tokens = declaration.page_tokens
    window_planes = [name for name in planes if name in WINDOW_INPUTS]
    planes = [name for name in planes if name not in WINDOW_INPUTS]
    if declaration.history_window > 0:
        model.cache.regions.add(name="attention", kind=S.HISTORY_KIND_SLIDING_WINDOW, planes=list(planes),
                                tokens_per_record=1, window_tokens=declaration.history_window)
    else:
        model.cache.regions.add(name="attention", kind=history_kind(planes), planes=list(planes), tokens_per_record=1)
    model.cache.page_table_views.add(destination="page_table", region="attention")
    if window_planes:
        if declaration.split_window <= 0:
            raise ValueError("the programs keep a window region; the declaration states no split_window")
        model.cache.regions.add(name=WINDOW_REGION, kind=S.HISTORY_KIND_SLIDING_WINDOW, planes=window_planes,
                                tokens_per_record=1, window_tokens=declaration.split_window)
        model.cache.page_table_views.add(destination=WINDOW_INPUTS[2], region=WINDOW_REGION)
    model.graphs.extend(graphs)
    model.state_views.add(name="output_counts", buffer="output_counts", row_stride=vocab * 4, byte_extent=vocab * 4)
    if any(graph.pending_token_view == PENDING_TOKENS for graph in graphs):
        model.state_views.add(name=PENDING_TOKENS, buffer=PENDING_TOKENS, row_stride=8, byte_extent=8)
    if any(access.view == ROTARY_DELTAS for graph in graphs for access in graph.state_accesses):
        model.state_views.add(name=ROTARY_DELTAS, buffer=ROTARY_DELTAS, row_stride=8, byte_extent=8)
    table = declaration.host_table
    if table is not None:
        model.host_tables.add(name=table.name, table=table.buffer, ngram_tokens=table.ngram_tokens, heads=table.heads,
                              multipliers=list(table.multipliers))
    _frontend(model.frontend, declaration.frontend)
    if declaration.images is not None:
        declaration.images(model)
    contract = spb.ServingContract(
        served_id=declaration.served_id, aliases=list(declaration.aliases),
        cache_identity=declaration.cache_identity, context_tokens=declaration.context_tokens,
        prefill_tokens=declaration.prefill_tokens, page_capacity=declaration.page_capacity,
        max_concurrency=declaration.max_concurrency, model=model, snapshot_capacity=declaration.snapshot_capacity,
    )
    contract.defaults.sampling.CopyFrom(declaration.sampling)
    contract.defaults.eos_token_ids.extend(declaration.eos_token_ids)
    contract.defaults.template_tokens.extend(declaration.template_tokens)
    return contract


def _frontend(target: spb.FrontendContract, frontend: FrontendDeclaration) -> None:
    target.tool_parser = frontend.tool_parser
    target.reasoning_parser = frontend.reasoning_parser
    target.image_preparation = S.IMAGE_PREPARATION_NONE
    target.image_layout = S.IMAGE_LAYOUT_NONE
    if frontend.tool_syntax is not None:
        target.tool_syntax.CopyFrom(frontend.tool_syntax)
    if frontend.reasoning_syntax is not None:
        target.reasoning_syntax.CopyFrom(frontend.reasoning_syntax)
    if frontend.assistant_boundary is not None:
        target.assistant_boundary.CopyFrom(frontend.assistant_boundary)
    if frontend.channel_syntax is not None:
        target.channel_syntax.CopyFrom(frontend.channel_syntax)
    target.prefix_boundaries.extend(frontend.prefix_boundaries)
    target.tool_call_id_len = frontend.tool_call_id_len
    target.clean_up_tokenization_spaces = frontend.clean_up_tokenization_spaces
