"""Typed read-only views of a validated contract: graphs, capacity variants, bindings, state
accesses and buffers as frozen dataclasses. Views are built once from validated messages and
share nothing mutable with them; enum-valued attributes hold the protobuf enum numbers
(compare with `serving_pb2.GRAPH_OPERATION_DECODE` and friends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.binding_rules import LENGTH_SOURCES
from helios.contract.dtypes import element_bytes
from helios.contract.rules import enum_label


@dataclass(frozen=True)
class CapacityView:
    """One captured variant: B, W, P, D and the speculative/image extras (zero when unused)."""

    batch_capacity: int
    token_capacity: int
    packed_token_capacity: int
    draft_tokens: int
    confidence_width: int
    lane_limit: int
    patch_capacity: int


@dataclass(frozen=True)
class BindingView:
    """A value binding resolved to the buffer behind its transport destination."""

    destination: str
    buffer: str
    source: int
    indexing: int
    offset: int
    padding: int
    constant: int
    image_output: str
    host_table: str = ""


@dataclass(frozen=True)
class AccessView:
    """A state access resolved to its view's buffer and byte geometry."""

    view: str
    buffer: str
    mode: int
    byte_offset: int
    row_stride: int
    byte_extent: int


# The outputs a token-logprobs graph (GraphContract.token_logprobs) returns after its plain ones, in
# return order: each row's sampled-token log-probability [R] (float32), its most probable ids [R, K]
# (int64) and their log-probabilities [R, K] (float32); a SPECULATIVE graph's, of each token a lane
# emits: [R, W], [R, W, K], [R, W, K].
TOKEN_LOGPROB_OUTPUTS = ("token_logprob", "top_token_ids", "top_token_logprobs")
# The outputs of a SCORED_PREFILL graph after its completion record and logits: each packed token's
# log-probability of its target token [T] (float32), and (cores prepared since prompt scores are
# served) its most probable next ids [T, K] (int64) with their log-probabilities [T, K] (float32).
TARGET_LOGPROB_OUTPUTS = ("target_logprobs", "target_top_ids", "target_top_logprobs")


@dataclass(frozen=True)
class GraphView:
    """One captured program as the runtime consumes it."""

    name: str
    operation: int
    variants: tuple[CapacityView, ...]
    bindings: tuple[BindingView, ...]
    accesses: tuple[AccessView, ...]
    resource_dependencies: tuple[str, ...]
    tuned_buffers: Mapping[str, str]
    state_rows_per_request: int
    pending_token_view: str | None
    draft_cursor: str | None
    token_logprobs: int = 0  # nonzero: the logprob variant of its operation, with this many alternatives

    @property
    def operation_name(self) -> str:
        return enum_label(spb.GraphOperation, self.operation)

    @property
    def length_source(self) -> int | None:
        """The speculative length source (QUERY_LENGTH or SPECULATIVE_PREFIX_LIMIT), if bound."""
        return next((b.source for b in self.bindings if b.source in LENGTH_SOURCES), None)

    @property
    def has_copied_inputs(self) -> bool:
        """Whether the graph binds concrete copied-token candidate ids (history drafting)."""
        return any(b.source == spb.VALUE_SOURCE_COPIED_CANDIDATE_IDS for b in self.bindings)

    @property
    def input_buffers(self) -> frozenset[str]:
        """Buffers this graph's host values land in: its own completion dependencies."""
        return frozenset(b.buffer for b in self.bindings)


@dataclass(frozen=True)
class BufferView:
    """A physical buffer; shape entries are sizes or load-time extent names (``PHYSICAL_PAGES``)."""

    name: str
    dtype: int
    shape: tuple[int | str, ...]
    placement: int
    role: int
    resource_id: str

    @property
    def element_bytes(self) -> int:
        return element_bytes(self.dtype)

    def nbytes(self, extents: Mapping[str, int] | None = None) -> int:
        """Total bytes once load-time extents are chosen; KeyError names a missing extent."""
        extents = extents or {}
        return self.element_bytes * math.prod(d if isinstance(d, int) else extents[d] for d in self.shape)


def buffer_view(buffer: mpb.Buffer) -> BufferView:
    shape = tuple(
        d.size if d.WhichOneof("extent") == "size" else enum_label(mpb.LoadExtent, d.load_extent) for d in buffer.shape
    )
    return BufferView(buffer.name, buffer.dtype, shape, buffer.placement, buffer.role, buffer.resource_id)


def graph_view(graph: spb.GraphContract, destinations: Mapping[str, str], views: Mapping[str, spb.StateView]) -> GraphView:
    variants = tuple(
        CapacityView(
            v.batch_capacity, v.token_capacity, v.packed_token_capacity, v.draft_tokens,
            v.confidence_width, v.lane_limit, v.patch_capacity,
        )
        for v in graph.variants
    )
    bindings = tuple(
        BindingView(
            b.destination, destinations[b.destination], b.source, b.indexing,
            b.offset, b.padding, b.constant, b.image_output, b.host_table,
        )
        for b in graph.bindings
    )
    accesses = tuple(
        AccessView(
            a.view, views[a.view].buffer, a.mode,
            views[a.view].byte_offset, views[a.view].row_stride, views[a.view].byte_extent,
        )
        for a in graph.state_accesses
    )
    return GraphView(
        name=graph.name,
        operation=graph.operation,
        variants=variants,
        bindings=bindings,
        accesses=accesses,
        resource_dependencies=tuple(graph.resource_dependencies),
        tuned_buffers=MappingProxyType({t.buffer: t.producer for t in graph.tuned_bindings}),
        state_rows_per_request=graph.state_rows_per_request,
        pending_token_view=graph.pending_token_view or None,
        draft_cursor=graph.draft_cursor or None,
        token_logprobs=graph.token_logprobs,
    )
