"""What one scheduling step asks the executor to do, and what the executor reports back.

All records are immutable. A `StepPlan` is self-contained: whoever applies the stream of plans in
order (rank zero's packer, every tensor-parallel peer's packer) rebuilds the same per-request
state from the plans alone, and needs nothing from the scheduler:

- `admitted`: the `RequestSpec` of every request whose first row is in this plan, sent once per
  request (a preempted request that comes back is not sent again);
- rows: only what changed - the input tokens appended since the lane's last row, the page-table
  entries new since the last row of that slot generation, and the lane's slot; a new slot
  generation (`PlanRow.admits`) invalidates everything remembered for the slot;
- `finished`: ids of requests released since the previous plan (no later plan names them; an id
  may be admitted again by a later plan, never by the same one);
- `masks`: the grammar mask rows of its constrained sampling rows (host feedback the engine adds
  after scheduling, `with_masks`).

Application order inside a plan: `finished` ids are dropped, `admitted` specs recorded, every
`CopyOp` runs in order, then the program over `rows`.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Mapping, NamedTuple

import torch

from helios.runtime.records.capacities import Operation, ProgramVariant
from helios.runtime.records.events import TokenLogprobs
from helios.runtime.records.request import RequestSpec


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


NO_MASKS: Mapping[str, torch.Tensor] = MappingProxyType({})


class StepPlan(NamedTuple):
    """One submission: `sequence` orders completions; `frame` (0/1) selects completion storage.
    See the module docstring for what `admitted`, `finished` and `masks` carry."""

    sequence: int
    frame: int
    operation: Operation
    variant: ProgramVariant | None  # None for a copy-only plan
    rows: tuple[PlanRow, ...]
    copies: tuple[CopyOp, ...]
    num_tokens: int
    admitted: tuple[RequestSpec, ...] = ()
    finished: tuple[str, ...] = ()
    masks: Mapping[str, torch.Tensor] = NO_MASKS  # request id -> int32 mask words (constrained rows)

    def with_masks(self, masks: Mapping[str, torch.Tensor]) -> StepPlan:
        """This plan with the grammar masks of its constrained rows (read-only from then on)."""
        return self._replace(masks=MappingProxyType(dict(masks))) if masks else self


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
