"""Load-time speculative facts: which SPECULATIVE variants serve, and what each one declares.

Everything is read from the contract: a variant's B, W, P, D and lane limit from its capacity, the
length source from the graph's binding (QUERY_LENGTH: exact host lengths; SPECULATIVE_PREFIX_LIMIT:
immutable ceilings and device allocation), the draft cursor lag from the completion cursor the graph
reports. Nothing is keyed by model identity.

Selection: the resolved settings list the widths startup allows (load-time selection may reduce
the prepared width, or leave only width one when learned speculation is off); the runtime serves
the widest of them - one width, so the scheduler's smallest-fitting choice is always a program of
that width - at the batch capacities the selected concurrency needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb


@dataclass(frozen=True)
class SpeculativeShape:
    """What a loaded SPECULATIVE program declares beyond B and P."""

    verify_tokens: int  # W
    draft_tokens: int  # D
    lane_limit: int  # <= min(D + 1, W)
    length_source: int  # VALUE_SOURCE_QUERY_LENGTH or VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT
    draft_lag: int | None  # lag of the draft cursor the graph reports; None: it reports -1
    confidence_width: int = 0


def serving_width(widths: Sequence[int]) -> int | None:
    """The width served: the widest selected one, or None when speculation serves no width."""
    return max(widths) if widths else None


def speculative_handles(handles: list[mpb.GraphHandle], widths: Sequence[int]) -> list[mpb.GraphHandle]:
    """The SPECULATIVE handles of the served width."""
    width = serving_width(widths)
    return [h for h in handles if h.capacity.token_capacity == width]


def speculative_shape(prepared: PreparedContract, handle: mpb.GraphHandle) -> SpeculativeShape | None:
    graph = prepared.graphs[handle.graph]
    if graph.operation != spb.GRAPH_OPERATION_SPECULATIVE:
        return None
    lag = None
    if graph.draft_cursor is not None:
        cursors = {c.name: c for c in prepared.contract.model.cache.cursors}
        lag = cursors[graph.draft_cursor].lag_tokens
    capacity = handle.capacity
    return SpeculativeShape(capacity.token_capacity, capacity.draft_tokens, capacity.lane_limit,
                            graph.length_source, lag, capacity.confidence_width)
