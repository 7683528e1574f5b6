"""What this runtime serves of a valid contract: one table of decisions, read by validation and by the loader.

Every `GraphOperation` and every `ValueSource` of the schema has an entry here (a test enumerates
the generated descriptors, so a new enum value without a decision fails it). A served value source
lists the indexings shared packing (`helios.runtime.execution.packer`) supplies; the packer resolves every
binding through `source_decision` at startup, and validation (`helios.contract.validate`, last
stage) refuses the same bindings with their field path, so a contract that validates loads.

* graph operations: every one is executed. PREFILL, SCORED_PREFILL, DECODE, MIXED, SPECULATIVE,
  TUNING, VISION (image encoders, run before the prompt step that needs their features) and
  INITIALIZATION (run over the rows a step admits, before the step's program; without one,
  admission zeroes a slot's written state). SNAPSHOT and RESTORATION graphs copy a slot's state
  rows into a snapshot row and back (`helios.runtime.execution.state_programs`: they replace the
  runtime's own copy of the state part of a snapshot; partial pages and host offload stay runtime
  copies of the declared storage); a core declares both or neither, each binding its row source
  (SNAPSHOT_DESTINATION, RESTORE_SOURCE). RESUME graphs run a prompt step holding a lane that
  continues from a restored or readmitted endpoint (`helios.runtime.scheduling.steps`).
* value sources: see `SOURCES`; image tensors go whole (SCALAR) to VISION graphs and per packed
  token to prompt graphs; SNAPSHOT and RESTORATION graphs, which copy state and hold no request
  lane, get only `STATE_COPY_SOURCES`.
* the completion record: the runtime reads the ABI columns (`helios.abi.completion`) and the
  SAMPLED_TOKENS field where the layout puts it; a layout declaring another column for an ABI
  field, or a non-int64 field, is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.rules import GRAPHS, MANIFEST, enum_label, op_label, source_label
from helios.errors import ContractError, LoadError

S, M = spb, mpb
_ROW = frozenset({S.INDEXING_SUBMISSION_ROW, S.INDEXING_ACTIVE_ROW})
_PHYSICAL = frozenset({S.INDEXING_PHYSICAL_REQUEST_ROW})
_PACKED = frozenset({S.INDEXING_PACKED_TOKEN})
_SCALAR = frozenset({S.INDEXING_SCALAR})


@dataclass(frozen=True)
class Served:
    """Shared packing supplies the source with these indexings (`vision`: to VISION graphs, which
    take whole tensors, instead of `indexings`)."""

    indexings: frozenset[int]
    vision: frozenset[int] = frozenset()

    def indexings_for(self, operation: int) -> frozenset[int]:
        return self.vision if operation == S.GRAPH_OPERATION_VISION else self.indexings


@dataclass(frozen=True)
class Refused:
    """Not served: why."""

    reason: str


# GraphOperation -> decision.
OPERATIONS = MappingProxyType({
    S.GRAPH_OPERATION_PREFILL: Served(frozenset()),
    S.GRAPH_OPERATION_SCORED_PREFILL: Served(frozenset()),
    S.GRAPH_OPERATION_DECODE: Served(frozenset()),
    S.GRAPH_OPERATION_MIXED: Served(frozenset()),
    S.GRAPH_OPERATION_SPECULATIVE: Served(frozenset()),
    S.GRAPH_OPERATION_TUNING: Served(frozenset()),
    S.GRAPH_OPERATION_VISION: Served(frozenset()),
    S.GRAPH_OPERATION_INITIALIZATION: Served(frozenset()),  # helios.runtime.execution.executor (Executor._initialize)
    S.GRAPH_OPERATION_RESUME: Served(frozenset()),  # helios.runtime.scheduling.steps (StepBuilder._finalize)
    S.GRAPH_OPERATION_SNAPSHOT: Served(frozenset()),  # helios.runtime.execution.state_programs
    S.GRAPH_OPERATION_RESTORATION: Served(frozenset()),  # helios.runtime.execution.state_programs
})
STATE_COPY_OPERATIONS = frozenset({S.GRAPH_OPERATION_SNAPSHOT, S.GRAPH_OPERATION_RESTORATION})
# The row source each state-copy graph must bind (the snapshot row it writes or reads).
STATE_COPY_ROW_SOURCE = MappingProxyType({
    S.GRAPH_OPERATION_SNAPSHOT: S.VALUE_SOURCE_SNAPSHOT_DESTINATION,
    S.GRAPH_OPERATION_RESTORATION: S.VALUE_SOURCE_RESTORE_SOURCE,
})
# What a state copy has: the slot whose rows are copied, its generation, its first state row, the
# snapshot row, how many copies the submission holds, constants.
STATE_COPY_SOURCES = frozenset({
    S.VALUE_SOURCE_SLOT, S.VALUE_SOURCE_GENERATION, S.VALUE_SOURCE_LIVE_ROW_COUNT, S.VALUE_SOURCE_LIVE_STATE_ROWS,
    S.VALUE_SOURCE_SNAPSHOT_DESTINATION, S.VALUE_SOURCE_RESTORE_SOURCE, S.VALUE_SOURCE_CONSTANT,
    S.VALUE_SOURCE_INACTIVE_PADDING,
})

_ROWS_AT_ADMISSION = Served(frozenset({S.INDEXING_SUBMISSION_ROW}) | _PHYSICAL)
# ValueSource -> decision (indexings beyond `binding_rules.ALLOWED_INDEXING` never validate anyway).
SOURCES = MappingProxyType({
    S.VALUE_SOURCE_SLOT: Served(_ROW),
    S.VALUE_SOURCE_GENERATION: Served(_ROW | _PHYSICAL),
    S.VALUE_SOURCE_LIVE_ROW_COUNT: Served(_SCALAR),
    S.VALUE_SOURCE_QUERY_LENGTH: Served(_ROW),
    S.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: Served(_ROW),
    S.VALUE_SOURCE_SAMPLING_DECISION: Served(_ROW | _PACKED),
    S.VALUE_SOURCE_MIXED_PREFILL_ROW: Served(_SCALAR),
    S.VALUE_SOURCE_PROMPT_TOKENS: Served(_PACKED),
    S.VALUE_SOURCE_SCORED_TARGET_TOKENS: Served(_PACKED),
    S.VALUE_SOURCE_PENDING_TOKEN: Served(_ROW),
    S.VALUE_SOURCE_PROMPT_POSITIONS: Served(_PACKED),
    S.VALUE_SOURCE_IMAGE_FEATURE_INDICES: Served(_PACKED),
    S.VALUE_SOURCE_IMAGE_CONTEXT_INDICES: Served(_PACKED),
    S.VALUE_SOURCE_IMAGE_FEATURE_SLOT: Served(_ROW),
    # Page tables live per physical request row and receive only new entries (the specification's
    # incremental upload); a per-submission copy of whole tables is not supplied.
    S.VALUE_SOURCE_PAGE_TABLE: Served(_PHYSICAL),
    S.VALUE_SOURCE_LIVE_STATE_ROWS: Served(_ROW),
    # The snapshot row's first state row (execution rows come first, then snapshot rows).
    S.VALUE_SOURCE_RESTORE_SOURCE: Served(_ROW),
    S.VALUE_SOURCE_SNAPSHOT_DESTINATION: Served(_ROW),
    S.VALUE_SOURCE_CONSUMED_TOKEN_START: Served(_ROW),
    S.VALUE_SOURCE_CONSUMED_TOKEN_END: Served(_ROW),
    S.VALUE_SOURCE_SEED_BITS: _ROWS_AT_ADMISSION,
    S.VALUE_SOURCE_SAMPLING_PARAMETERS: _ROWS_AT_ADMISSION,
    S.VALUE_SOURCE_OUTPUT_LIMIT: _ROWS_AT_ADMISSION,
    S.VALUE_SOURCE_EOS_IDS: _ROWS_AT_ADMISSION,
    # The histogram is initialised once per slot at admission (the specification), never per step.
    S.VALUE_SOURCE_PROMPT_HISTOGRAM: Served(_PHYSICAL),
    S.VALUE_SOURCE_GRAMMAR_MASK: Served(_ROW),
    S.VALUE_SOURCE_COPIED_CANDIDATE_IDS: Served(_ROW),
    S.VALUE_SOURCE_COPIED_CANDIDATE_COUNT: Served(_ROW),
    S.VALUE_SOURCE_COPIED_GENERATION: Served(_ROW),
    S.VALUE_SOURCE_COPIED_CONSUMED_ENDPOINT: Served(_ROW),
    S.VALUE_SOURCE_COPIED_GRAMMAR_MASKS: Served(_ROW),
    # VISION and TUNING graphs get their constants once, at load (`helios.runtime.loading.constants.write_constants`).
    S.VALUE_SOURCE_CONSTANT: Served(_SCALAR | {S.INDEXING_SUBMISSION_ROW}, vision=_SCALAR),
    S.VALUE_SOURCE_INACTIVE_PADDING: Served(frozenset({S.INDEXING_SUBMISSION_ROW}) | _PACKED),
    S.VALUE_SOURCE_IMAGE_TENSOR: Served(_PACKED, vision=_SCALAR),
    S.VALUE_SOURCE_LOGIT_BIAS_IDS: Served(_PHYSICAL),
    S.VALUE_SOURCE_LOGIT_BIAS_VALUES: Served(_PHYSICAL),
    S.VALUE_SOURCE_HOST_TABLE_ROWS: Served(_PACKED),  # helios.runtime.execution.host_staging
})
SERVED_OPERATIONS = frozenset(op for op, decision in OPERATIONS.items() if isinstance(decision, Served))
SERVED_SOURCES = frozenset(source for source, decision in SOURCES.items() if isinstance(decision, Served))

# int64 column the runtime reads for each single-column ABI field (helios.abi.completion.LAYOUT).
ABI_COLUMNS = {
    M.COMPLETION_FIELD_KIND_SLOT: 0, M.COMPLETION_FIELD_KIND_GENERATION: 1,
    M.COMPLETION_FIELD_KIND_OFFERED_TOKENS: 4, M.COMPLETION_FIELD_KIND_ACCEPTED_DRAFTS: 5,
    M.COMPLETION_FIELD_KIND_EMITTED_TOKENS: 6, M.COMPLETION_FIELD_KIND_DRAFT_CURSOR: 8,
    M.COMPLETION_FIELD_KIND_RESERVED_MODEL: 9,
}
ABI_TOKEN_COLUMN, ABI_RECORD_COLUMNS = 3, 10


class NotServableError(ContractError, LoadError):
    """A contract this runtime cannot serve; `path` names the field."""

    exit_code = 8


def source_decision(source: int, indexing: int, operation: int) -> str | None:
    """None when shared packing supplies `source` with `indexing` to a graph of `operation`, else
    why not (`indexing` then names the problem when the source itself is served)."""
    decision = SOURCES.get(source)
    if decision is None:
        return "this runtime has no decision for the source"
    if isinstance(decision, Refused):
        return decision.reason
    if operation in STATE_COPY_OPERATIONS and source not in STATE_COPY_SOURCES:
        return f"a {op_label(operation)} graph copies state rows and holds no request lane"
    if indexing not in decision.indexings_for(operation):
        labels = ", ".join(sorted(enum_label(S.Indexing, i) for i in decision.indexings_for(operation))) or "none"
        return f"supplied to {op_label(operation)} graphs with indexing {labels}"
    return None


def refused_field(source: int, operation: int) -> str:
    """The binding field a refusal of `source` for a graph of `operation` names: "source" when the
    source itself is not supplied there, else "indexing"."""
    if source not in SERVED_SOURCES or (operation in STATE_COPY_OPERATIONS and source not in STATE_COPY_SOURCES):
        return "source"
    return "indexing"


def check_servable(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> None:
    """Raise `NotServableError` at the first graph, binding or completion field this runtime cannot serve."""
    _check_state_copies(contract)
    for i, graph in enumerate(contract.model.graphs):
        path = f"{GRAPHS}[{i}]"
        decision = OPERATIONS.get(graph.operation, Refused("this runtime executes no such graph"))
        if isinstance(decision, Refused):
            raise NotServableError(f"{path}.operation", f"{op_label(graph.operation)} graphs are not served: "
                                   f"{decision.reason}")
        for j, binding in enumerate(graph.bindings):
            reason = source_decision(binding.source, binding.indexing, graph.operation)
            if reason is None:
                continue
            field = refused_field(binding.source, graph.operation)
            raise NotServableError(f"{path}.bindings[{j}].{field}",
                                   f"{source_label(binding.source)} values are not supplied: {reason}")
    _check_completion(manifest.completion)


def _check_state_copies(contract: spb.ServingContract) -> None:
    """SNAPSHOT and RESTORATION graphs come together (a snapshot the runtime could not restore, or a
    restore of rows nothing writes, is useless), each binding its snapshot-row source."""
    graphs = contract.model.graphs
    for operation, row_source in STATE_COPY_ROW_SOURCE.items():
        other = next(op for op in STATE_COPY_OPERATIONS if op != operation)
        for i, graph in enumerate(graphs):
            if graph.operation != operation:
                continue
            if not any(g.operation == other for g in graphs):
                raise NotServableError(f"{GRAPHS}[{i}].operation", f"a core with {op_label(operation)} graphs also "
                                       f"declares a {op_label(other)} graph")
            if not any(b.source == row_source for b in graph.bindings):
                raise NotServableError(f"{GRAPHS}[{i}].bindings", f"a {op_label(operation)} graph binds "
                                       f"{source_label(row_source)} (the snapshot row it copies)")


def _check_completion(layout: mpb.CompletionLayout) -> None:
    path = f"{MANIFEST}.completion"
    if layout.record_bytes < ABI_RECORD_COLUMNS * 8:
        raise NotServableError(f"{path}.record_bytes", f"records hold the {ABI_RECORD_COLUMNS} int64 ABI columns")
    for i, field in enumerate(layout.fields):
        item = f"{path}.fields[{i}]"
        if field.dtype != M.DTYPE_INT64:
            raise NotServableError(f"{item}.dtype", "the runtime reads int64 record fields")
        column, rest = divmod(field.byte_offset, 8)
        expected = ABI_COLUMNS.get(field.kind)
        if field.kind == M.COMPLETION_FIELD_KIND_SAMPLED_TOKENS:
            fits = (column, field.count) == (ABI_TOKEN_COLUMN, 1) or column >= ABI_RECORD_COLUMNS
            if rest or not fits or (column + field.count) * 8 > layout.record_bytes:
                raise NotServableError(f"{item}.byte_offset", "SAMPLED_TOKENS is the ABI token column or extra "
                                       "columns after the ABI record, inside the record")
        elif expected is not None and (rest or column != expected or field.count != 1):
            raise NotServableError(f"{item}.byte_offset", f"{enum_label(M.CompletionFieldKind, field.kind)} is read "
                                   f"from int64 column {expected} (byte offset {expected * 8}), one value")
