"""What this runtime serves of a valid contract: graph operations, value sources, completion layout.

`PreparedContract` validation checks that a contract is well formed; `check_servable` checks that
this runtime can serve it, so that a core which validates either loads or is refused here with the
offending field's path (never a late failure or a silently skipped graph):

* graph operations: PREFILL, SCORED_PREFILL, DECODE, MIXED, SPECULATIVE, TUNING and VISION (image
  encoders, run before the prompt step that needs their features) are executed.
  INITIALIZATION and RESUME graphs are not (admission zeroes a slot's written state, and a resumed
  prompt runs through PREFILL or MIXED); SNAPSHOT and RESTORATION graphs are not either: snapshots
  and restores are runtime copies of the declared storage (pages, state rows, continuation rows,
  host slots; `helios.runtime.execution.history_storage`).
* value sources: the ones shared packing supplies (`SERVED_SOURCES`, `helios.runtime.execution.packer`); image
  tensors whole (SCALAR) to VISION graphs and per packed token to prompt graphs.
* the completion record: the runtime reads the ABI columns (`helios.abi.completion`) and the
  SAMPLED_TOKENS field where the layout puts it; a layout declaring another column for an ABI
  field, or a non-int64 field, is refused.
"""

from __future__ import annotations

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.rules import GRAPHS, MANIFEST, enum_label, op_label, source_label
from helios.errors import ContractError, LoadError

S, M = spb, mpb

SERVED_OPERATIONS = frozenset({
    S.GRAPH_OPERATION_PREFILL, S.GRAPH_OPERATION_SCORED_PREFILL, S.GRAPH_OPERATION_DECODE,
    S.GRAPH_OPERATION_MIXED, S.GRAPH_OPERATION_SPECULATIVE, S.GRAPH_OPERATION_TUNING, S.GRAPH_OPERATION_VISION,
})
_OPERATION_REASONS = {
    S.GRAPH_OPERATION_INITIALIZATION: "admission zeroes a slot's written state; no initialization graph runs",
    S.GRAPH_OPERATION_RESUME: "resumed prompts run through PREFILL or MIXED graphs",
    S.GRAPH_OPERATION_SNAPSHOT: "snapshots are runtime copies of the declared storage into continuation rows",
    S.GRAPH_OPERATION_RESTORATION: "restores are runtime copies of continuation rows into a slot's pages and rows",
}
SERVED_SOURCES = frozenset({
    S.VALUE_SOURCE_SLOT, S.VALUE_SOURCE_GENERATION, S.VALUE_SOURCE_LIVE_ROW_COUNT, S.VALUE_SOURCE_QUERY_LENGTH,
    S.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT, S.VALUE_SOURCE_SAMPLING_DECISION, S.VALUE_SOURCE_PROMPT_TOKENS,
    S.VALUE_SOURCE_SCORED_TARGET_TOKENS, S.VALUE_SOURCE_PENDING_TOKEN, S.VALUE_SOURCE_PROMPT_POSITIONS,
    S.VALUE_SOURCE_PAGE_TABLE, S.VALUE_SOURCE_CONSUMED_TOKEN_START, S.VALUE_SOURCE_CONSUMED_TOKEN_END,
    S.VALUE_SOURCE_SEED_BITS, S.VALUE_SOURCE_SAMPLING_PARAMETERS, S.VALUE_SOURCE_OUTPUT_LIMIT,
    S.VALUE_SOURCE_PROMPT_HISTOGRAM, S.VALUE_SOURCE_GRAMMAR_MASK, S.VALUE_SOURCE_COPIED_CANDIDATE_IDS,
    S.VALUE_SOURCE_COPIED_CANDIDATE_COUNT, S.VALUE_SOURCE_COPIED_CONSUMED_ENDPOINT, S.VALUE_SOURCE_CONSTANT,
    S.VALUE_SOURCE_LOGIT_BIAS_IDS, S.VALUE_SOURCE_LOGIT_BIAS_VALUES,
    S.VALUE_SOURCE_IMAGE_TENSOR, S.VALUE_SOURCE_IMAGE_FEATURE_INDICES,
})
# IMAGE_TENSOR indexing the runtime supplies: [prompt graphs, VISION graphs] (helios.runtime.execution.image_packing).
_IMAGE_TENSOR_INDEXING = (S.INDEXING_PACKED_TOKEN, S.INDEXING_SCALAR)
# int64 column the runtime reads for each single-column ABI field (helios.abi.completion.LAYOUT).
ABI_COLUMNS = {
    M.COMPLETION_FIELD_KIND_SLOT: 0, M.COMPLETION_FIELD_KIND_GENERATION: 1,
    M.COMPLETION_FIELD_KIND_OFFERED_TOKENS: 4, M.COMPLETION_FIELD_KIND_ACCEPTED_DRAFTS: 5,
    M.COMPLETION_FIELD_KIND_EMITTED_TOKENS: 6, M.COMPLETION_FIELD_KIND_DRAFT_CURSOR: 8,
    M.COMPLETION_FIELD_KIND_RESERVED_MODEL: 9,
}
ABI_TOKEN_COLUMN, ABI_RECORD_COLUMNS = 3, 10


class NotServableError(ContractError, LoadError):
    """A valid contract this runtime cannot serve; `path` names the field."""

    exit_code = 8


def check_servable(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> None:
    """Raise `NotServableError` at the first graph, binding or completion field this runtime cannot serve."""
    for i, graph in enumerate(contract.model.graphs):
        path = f"{GRAPHS}[{i}]"
        if graph.operation not in SERVED_OPERATIONS:
            reason = _OPERATION_REASONS.get(graph.operation, "this runtime executes no such graph")
            raise NotServableError(f"{path}.operation", f"{op_label(graph.operation)} graphs are not served: {reason}")
        for j, binding in enumerate(graph.bindings):
            if binding.source not in SERVED_SOURCES:
                raise NotServableError(f"{path}.bindings[{j}].source",
                                       f"{source_label(binding.source)} values are not supplied by this runtime")
            if binding.source == S.VALUE_SOURCE_IMAGE_TENSOR and binding.indexing != _IMAGE_TENSOR_INDEXING[
                    graph.operation == S.GRAPH_OPERATION_VISION]:
                raise NotServableError(f"{path}.bindings[{j}].indexing", "image tensors are supplied whole to VISION "
                                       "graphs (SCALAR) and per packed token to prompt graphs")
    _check_completion(manifest.completion)


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
