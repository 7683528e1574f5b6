"""What one scheduling step asks the executor to do, and what the executor reports back.

All records are immutable. A `StepPlan` is self-contained: the packer needs no scheduler state
to fill value bindings from it, apart from what it remembers per (slot, generation) - rows send
only the page-table entries new since the last row of that slot generation, and a new slot
generation (`PlanRow.admits`) invalidates everything remembered for the slot.

Execution order inside a plan: every `CopyOp` in order, then the program over `rows`.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from helios.runtime.records.capacities import Operation, ProgramVariant
from helios.runtime.records.events import TokenLogprobs


class StorageKind(enum.IntEnum):
    """Where a copy reads or writes."""

    UNSPECIFIED = 0
    PAGE = 1  # a device page id (every paged region of the layout)
    CONTINUATION = 2  # a device continuation row (partial page payload and carried state)
    HOST = 3  # a host-memory slot holding one page or one continuation payload
    STATE = 4  # the state rows of a request slot (layouts with recurrent or continuation regions)


class Location(NamedTuple):
    kind: StorageKind
    index: int


class CopyOp(NamedTuple):
    """Copy the first `num_tokens` tokens of history from `src` to `dst`.

    A STATE location carries a slot's state rows (num_tokens is 0); a continuation row or host
    slot that receives both a partial page and state holds them side by side.
    """

    src: Location
    dst: Location
    num_tokens: int


class PlanRow(NamedTuple):
    """One request lane of a step.

    `token_ids` are the host-fed input tokens at positions start_pos, start_pos + 1, ...; they are
    empty when `pending_on_device` (the lane's pending token exists only in device state, fed by a
    second frame). For SPECULATIVE rows `token_ids` is the pending token and `query_len` the lane
    ceiling (target rows reserved, including the pending token). `page_table_start` is the index of
    the first entry of `new_page_ids` in the slot's page table. A sampling row samples the token
    after its last position; `sample_index` is that token's output index (the counter-based RNG
    position). `admits` marks the first row of a slot generation; `constrained` asks for a grammar
    mask.
    """

    request_id: str
    slot: int
    generation: int
    token_ids: tuple[int, ...]
    pending_on_device: bool
    start_pos: int
    query_len: int
    page_table_start: int
    new_page_ids: tuple[int, ...]
    samples: bool
    sample_index: int
    token_ceiling: int  # most tokens the row may emit: 0 without sampling, 1 outside speculation
    admits: bool
    constrained: bool
    # Entries of the window region's table (its own page ids) from page_table_start, when the layout
    # has one (`helios.runtime.cache.window_pages`); released ones are RELEASED_PAGE.
    new_window_ids: tuple[int, ...] = ()


class StepPlan(NamedTuple):
    """One submission: `sequence` orders completions; `frame` (0/1) selects completion storage."""

    sequence: int
    frame: int
    operation: Operation
    variant: ProgramVariant | None  # None for a copy-only plan
    rows: tuple[PlanRow, ...]
    copies: tuple[CopyOp, ...]
    num_tokens: int


class RowResult(NamedTuple):
    """The executor's completion record for one row, in row order.

    `consumed_endpoint` is the committed history length after the row; `token_ids` the emitted
    tokens (empty for a non-sampling row). Speculative rows also report `offered_tokens` (target
    rows used, including the pending token), `accepted_drafts` and `draft_cursor` (-1 when the
    program has no draft cursor). `logprobs` holds one `TokenLogprobs` per emitted token when the
    row's request asks for log-probabilities and the step ran a token-logprobs program.
    """

    slot: int
    generation: int
    consumed_endpoint: int
    token_ids: tuple[int, ...]
    offered_tokens: int = 1
    accepted_drafts: int = 0
    draft_cursor: int = -1
    logprobs: tuple[TokenLogprobs, ...] | None = None
