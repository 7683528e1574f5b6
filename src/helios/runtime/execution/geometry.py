"""Scheduler capacities of a loaded model: variants, storage layout and limits from the contract.

Everything comes from the contract and from the physical capacities chosen at load; nothing is
keyed by model identity. The scheduler reads the result only.
"""

from __future__ import annotations

from helios.contract import PreparedContract
from helios.contract import serving_pb2 as spb
from helios.runtime.records.capacities import (
    Capacities,
    CacheGeometry,
    Operation,
    HistoryKind,
    HistoryRegion,
    LengthSource,
    PageTableView,
    ProgramVariant,
    StorageLayout,
)
from helios.runtime.execution.program_variants import OPERATIONS, logprob_twins, speculates_with_logprobs, variant_name
from helios.runtime.loading.model import LoadedModel, LoadedProgram, request_pages
from helios.runtime.cache.window_pages import window_region_name

_KINDS = {
    spb.HISTORY_KIND_PAGED_KEY_VALUE: HistoryKind.PAGED_KV,
    spb.HISTORY_KIND_PAGED_LATENT: HistoryKind.PAGED_LATENT,
    spb.HISTORY_KIND_SLIDING_WINDOW: HistoryKind.SLIDING_WINDOW,
    spb.HISTORY_KIND_RECURRENT: HistoryKind.RECURRENT,
    spb.HISTORY_KIND_CONTINUATION: HistoryKind.CONTINUATION,
}


def storage_layout(model: LoadedModel) -> StorageLayout:
    cache = model.prepared.contract.model.cache
    regions = tuple(
        HistoryRegion(r.name, _KINDS[r.kind], max(1, r.tokens_per_record), r.window_tokens) for r in cache.regions
    )
    views = tuple(PageTableView(v.destination, v.page_offset, v.region) for v in cache.page_table_views)
    return StorageLayout(cache.page_tokens, regions, views, window_region_name(model.prepared),
                         restores_through_programs=bool(model.state_copy_programs))


_LENGTH_SOURCES = {
    spb.VALUE_SOURCE_QUERY_LENGTH: LengthSource.QUERY_LENGTH,
    spb.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: LengthSource.PREFIX_LIMIT,
}


def program_variant(program: LoadedProgram, prepared: PreparedContract | None = None) -> ProgramVariant:
    """The scheduler's view of one loaded program (SPECULATIVE: D, W, length source, cursor lag).
    `device_pending` needs `prepared` (the graph's declarations); without it, False."""
    variant = ProgramVariant(
        name=variant_name(program), operation=OPERATIONS[program.operation], batch_capacity=program.batch_capacity,
        packed_token_capacity=program.packed_token_capacity,
        device_pending=prepared is not None and device_pending(prepared, program.graph),
        admits_slots=prepared is None or admits_slots(prepared, program.graph),
    )
    shape = program.speculative
    if shape is None:
        return variant
    return ProgramVariant(
        name=variant.name, operation=variant.operation, batch_capacity=variant.batch_capacity,
        packed_token_capacity=variant.packed_token_capacity, draft_tokens=shape.draft_tokens,
        verify_tokens=shape.verify_tokens,
        length_source=_LENGTH_SOURCES.get(shape.length_source, LengthSource.UNSPECIFIED),
        device_pending=False, draft_lag_tokens=shape.draft_lag,
    )


def device_pending(prepared: PreparedContract, graph_name: str) -> bool:
    """Whether `graph_name` reads its pending token from a device state view it also writes, so a
    round of it can follow another round of it before the host has seen that round's tokens."""
    graph = prepared.graphs[graph_name]
    view = graph.pending_token_view
    return view is not None and any(a.view == view and a.mode == spb.ACCESS_MODE_READ_WRITE for a in graph.accesses)


_PROMPT_OPERATIONS = (spb.GRAPH_OPERATION_PREFILL, spb.GRAPH_OPERATION_MIXED, spb.GRAPH_OPERATION_SCORED_PREFILL)
_WRITES = (spb.ACCESS_MODE_WRITE, spb.ACCESS_MODE_READ_WRITE)


_HOST_TOKEN_SOURCES = (spb.VALUE_SOURCE_PENDING_TOKEN, spb.VALUE_SOURCE_PROMPT_TOKENS)


def admits_slots(prepared: PreparedContract, graph_name: str) -> bool:
    """Whether a row of `graph_name` may start a slot generation: it reads no state view that
    prompt programs write and it only reads (state a prompt program initializes per slot), and it
    can take a host-known token (a graph that reads its pending token only from device state,
    binding neither PENDING_TOKEN nor PROMPT_TOKENS, never sees an admitted lane's last prompt token)."""
    graph = prepared.graphs[graph_name]
    read_only = {a.view for a in graph.accesses if a.mode == spb.ACCESS_MODE_READ}
    initialized = {a.view for operation in _PROMPT_OPERATIONS for g in prepared.graphs_for(operation)
                   for a in g.accesses if a.mode in _WRITES}
    device_only = bool(graph.pending_token_view) and not any(
        b.source in _HOST_TOKEN_SOURCES for b in graph.bindings)
    return not read_only & initialized and not device_only


def capacities_for(model: LoadedModel, queue_capacity: int, host_pages: int = 0) -> Capacities:
    """The scheduler's view of `model`: selected concurrency, extents, variants and cache geometry."""
    settings = model.settings
    layout = storage_layout(model)
    # A token-logprobs variant is not planned for: the executor runs it in place of its plain twin.
    variants = tuple(program_variant(p, model.prepared) for p in model.programs if not p.token_logprobs)
    vocab_begin, vocab_end = model.prepared.sampled_range
    geometry = CacheGeometry(
        layout=layout, num_pages=model.num_pages,
        max_pages_per_request=request_pages(model.prepared, settings.context_tokens),
        identity=model.prepared.contract.cache_identity.encode("utf-8"), num_host_slots=host_pages,
        num_continuation_rows=settings.snapshot_capacity, num_window_pages=model.num_window_pages,
    )
    return Capacities(
        max_active=settings.max_concurrency, context_tokens=settings.context_tokens,
        prefill_tokens=settings.prefill_tokens, vocab_size=vocab_end, variants=variants, cache=geometry,
        input_vocab_size=model.prepared.input_range[1], queue_capacity=queue_capacity,
        token_logprobs=logprob_width(model.programs),
        speculative_logprobs=speculates_with_logprobs(model.programs, logprob_width(model.programs)),
        speculative_logit_bias=speculates_with_logit_bias(model.prepared, model.programs),
        logit_bias_width=model.prepared.logit_bias_width,
        eos_width=model.prepared.eos_width,
    )


def speculates_with_logit_bias(prepared: PreparedContract, programs) -> bool:
    """Whether every loaded SPECULATIVE program (token-logprobs twins too) binds the logit-bias ids
    and values, and some is loaded: a lane with a bias may then speculate. A core prepared before
    SPECULATIVE programs took them keeps such lanes on plain steps."""
    speculative = [p for p in programs if p.speculative is not None]
    return bool(speculative) and all(
        set(_LOGIT_BIAS_SOURCES) <= {b.source for b in prepared.graphs[p.graph].bindings} for p in speculative)


_LOGIT_BIAS_SOURCES = (spb.VALUE_SOURCE_LOGIT_BIAS_IDS, spb.VALUE_SOURCE_LOGIT_BIAS_VALUES)


def logprob_width(programs) -> int:
    """Alternatives per row every plain PREFILL/DECODE/MIXED program's token-logprobs twin returns
    (`helios.runtime.execution.program_variants.logprob_twins`); 0 when some program has no twin (a core prepared
    without them), so the whole capability is either there or refused."""
    twins = logprob_twins(programs)
    plain = [p for p in programs if not p.token_logprobs and p.speculative is None
             and OPERATIONS.get(p.operation) in (Operation.PREFILL, Operation.DECODE, Operation.MIXED)]
    if not plain or any(variant_name(p) not in twins for p in plain):
        return 0
    return min(twins[variant_name(p)].token_logprobs for p in plain)
