"""Contract declarations of complete speculative generation (used by `preparation.contract`).

What a core with a draft model and SPECULATIVE programs declares, all derived from the programs'
own `ProgramSpec`s (no model flag, no model name):

* the draft's paged key/value region ``draft`` (planes ``draft_k_cache``/``draft_v_cache``; a latent
  draft's paged latent region, planes ``draft_latent_cache``/``draft_rope_cache``), its
  page-table view ``draft_page_table`` with page offset 0 (the draft attends at the target's
  positions and writes only inside each lane's reserved ceiling, so it references no extra page)
  and the completion cursor ``draft`` with lag 0 (every program leaves the draft's keys/values
  covering all consumed tokens), reported by the SPECULATIVE graph;
* per SPECULATIVE variant B, W (token_capacity), P, D, confidence_width = D when D > 0, and
  lane_limit = min(D + 1, W); the serving contract's ``speculative_widths`` list every W;
* one length source per SPECULATIVE graph through its ``lane_tokens`` input: QUERY_LENGTH, or
  SPECULATIVE_PREFIX_LIMIT for programs that allocate prefixes on the device; copied-token inputs
  (candidate ids, count, consumed endpoint) for history drafting;
* the completion record: with lanes that emit more than one token, SAMPLED_TOKENS moves to
  ``record_tokens`` int64 columns after the ABI record (every program of the core writes them);
* ``proposal_confidence``: framed FP32 OUTPUT storage [2, request_slots, draft_capacity].
"""

from __future__ import annotations

from typing import Sequence

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.ignition.program_spec import (
    CONFIDENCE_OUTPUT, DRAFT_INPUTS, DRAFT_PREFIX, LATENT_PLANES, Operation, ProgramSpec,
)

S, M = spb, mpb
DRAFT_REGION = "draft"
DRAFT_CURSOR = "draft"
DRAFT_PLANE_PREFIX = "draft_"  # the draft's cache planes: the target's plane names with this prefix
ABI_RECORD_FIELDS = 10  # int64 columns written by helios::completion_record

# Step-input bindings only speculative cores use: (source, indexing, padding).
SPECULATIVE_BINDINGS = {
    "lane_tokens": (S.VALUE_SOURCE_QUERY_LENGTH, S.INDEXING_SUBMISSION_ROW, 0),
    "copied_ids": (S.VALUE_SOURCE_COPIED_CANDIDATE_IDS, S.INDEXING_SUBMISSION_ROW, -1),
    "copied_counts": (S.VALUE_SOURCE_COPIED_CANDIDATE_COUNT, S.INDEXING_SUBMISSION_ROW, 0),
    "copied_endpoints": (S.VALUE_SOURCE_COPIED_CONSUMED_ENDPOINT, S.INDEXING_SUBMISSION_ROW, -1),
    DRAFT_INPUTS[2]: (S.VALUE_SOURCE_PAGE_TABLE, S.INDEXING_PHYSICAL_REQUEST_ROW, 0),
}
# SPECULATIVE lanes feed their pending token at its position, like DECODE rows.
SPECULATIVE_OVERRIDES = {
    "token_ids": (S.VALUE_SOURCE_PENDING_TOKEN, S.INDEXING_SUBMISSION_ROW, 0),
    "positions": (S.VALUE_SOURCE_CONSUMED_TOKEN_START, S.INDEXING_SUBMISSION_ROW, 0),
}
_ALLOCATING_OVERRIDES = {
    **SPECULATIVE_OVERRIDES,
    "lane_tokens": (S.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT, S.INDEXING_SUBMISSION_ROW, 0),
}


def has_draft(programs: Sequence) -> bool:
    return any(p.spec.options.draft is not None for p in programs)


def record_tokens(programs: Sequence) -> int:
    """Emitted-token columns of every record (the programs agree; 0: tokens in the ABI column)."""
    counts = {p.spec.options.record_tokens for p in programs}
    if len(counts) != 1:
        raise ValueError(f"programs of one core disagree on completion record tokens {sorted(counts)}")
    return counts.pop()


def speculative_overrides(spec: ProgramSpec) -> dict:
    return _ALLOCATING_OVERRIDES if spec.options.allocates_prefixes else SPECULATIVE_OVERRIDES


def speculative_capacity(spec: ProgramSpec) -> spb.GraphCapacity:
    capacity = spec.capacity
    return spb.GraphCapacity(
        batch_capacity=capacity.batch_capacity, token_capacity=capacity.verify_tokens,
        packed_token_capacity=capacity.packed_token_capacity, draft_tokens=capacity.draft_tokens,
        confidence_width=capacity.draft_tokens, lane_limit=capacity.lane_limit,
    )


def speculative_widths(programs: Sequence) -> list[int]:
    return sorted({p.spec.capacity.verify_tokens for p in programs if p.spec.operation is Operation.SPECULATIVE})


def declare_draft_cache(model: spb.ModelContract, planes: Sequence[str]) -> None:
    """The draft's region, page-table view and completion cursor (see the module docstring);
    `planes` are the draft's cache-storage inputs (latent and rotary-key planes: a paged latent region)."""
    latent = any(name.endswith(LATENT_PLANES[0]) for name in planes)
    kind = S.HISTORY_KIND_PAGED_LATENT if latent else S.HISTORY_KIND_PAGED_KEY_VALUE
    model.cache.regions.add(name=DRAFT_REGION, kind=kind, planes=list(planes), tokens_per_record=1)
    model.cache.page_table_views.add(destination=DRAFT_INPUTS[2], region=DRAFT_REGION, page_offset=0)
    model.cache.cursors.add(name=DRAFT_CURSOR, region=DRAFT_REGION, lag_tokens=0)


def weight_resource(name: str, target_resource: str, draft_resource: str | None) -> str:
    """The resource holding weight `name`: the draft's own weights resource for draft weights."""
    if name.startswith(DRAFT_PREFIX):
        if draft_resource is None:
            raise ValueError("draft weights are declared but no draft weights resource is named")
        return draft_resource
    return target_resource


def completion_columns(programs: Sequence) -> int:
    return ABI_RECORD_FIELDS + record_tokens(programs)


def completion_fields(programs: Sequence) -> list[tuple[int, int, int]]:
    """(kind, column, count) of every declared int64 record field."""
    extra = record_tokens(programs)
    tokens = (M.COMPLETION_FIELD_KIND_SAMPLED_TOKENS, ABI_RECORD_FIELDS, extra) if extra else (
        M.COMPLETION_FIELD_KIND_SAMPLED_TOKENS, 3, 1)
    return [
        (M.COMPLETION_FIELD_KIND_SLOT, 0, 1), (M.COMPLETION_FIELD_KIND_GENERATION, 1, 1), tokens,
        (M.COMPLETION_FIELD_KIND_OFFERED_TOKENS, 4, 1), (M.COMPLETION_FIELD_KIND_ACCEPTED_DRAFTS, 5, 1),
        (M.COMPLETION_FIELD_KIND_EMITTED_TOKENS, 6, 1), (M.COMPLETION_FIELD_KIND_DRAFT_CURSOR, 8, 1),
        (M.COMPLETION_FIELD_KIND_RESERVED_MODEL, 9, 1),
    ]


def confidence_buffer(programs: Sequence) -> mpb.Buffer | None:
    """Framed FP32 [2, request_slots, draft_capacity] proposal confidence, or None without proposals."""
    confident = [p.spec for p in programs if p.spec.operation is Operation.SPECULATIVE and p.spec.capacity.draft_tokens]
    if not confident:
        return None
    rows = max(spec.capacity.batch_capacity for spec in confident)
    width = max(spec.capacity.draft_tokens for spec in confident)
    return M.Buffer(name=CONFIDENCE_OUTPUT, dtype=M.DTYPE_FLOAT32, role=M.BUFFER_ROLE_OUTPUT,
                    placement=M.PLACEMENT_HOST, shape=[M.Dim(size=2), M.Dim(size=rows), M.Dim(size=width)])
