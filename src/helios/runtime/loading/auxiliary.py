"""Handles of the programs a step runs beside its own: image encoders (VISION), slot initializers
(INITIALIZATION) and state copies (SNAPSHOT, RESTORATION). Every variant of each is loaded (none
is reduced by the selected concurrency: the executor runs them in chunks of the largest)."""

from __future__ import annotations

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb

STATE_COPY_OPERATIONS = (spb.GRAPH_OPERATION_SNAPSHOT, spb.GRAPH_OPERATION_RESTORATION)


def handles_of(prepared: PreparedContract, operations, rank: int = 0) -> list[mpb.GraphHandle]:
    """The rank's handles of the graphs of `operations`, smallest batch capacity first."""
    graphs = {g.name for operation in operations for g in prepared.graphs_for(operation)}
    handles = [h for h in prepared.manifest.graph_handles if h.graph in graphs and h.rank == rank]
    return sorted(handles, key=lambda h: (h.capacity.batch_capacity, h.graph))


def initialization_handles(prepared: PreparedContract, rank: int = 0) -> list[mpb.GraphHandle]:
    """The rank's INITIALIZATION handles, smallest batch capacity first."""
    return handles_of(prepared, (spb.GRAPH_OPERATION_INITIALIZATION,), rank)


def state_copy_handles(prepared: PreparedContract, rank: int = 0) -> list[mpb.GraphHandle]:
    """The rank's SNAPSHOT and RESTORATION handles, smallest batch capacity first."""
    return handles_of(prepared, STATE_COPY_OPERATIONS, rank)


def vision_handles(prepared: PreparedContract, rank: int = 0) -> list[mpb.GraphHandle]:
    """The rank's VISION handles (every patch capacity), smallest first."""
    graphs = {g.name for g in prepared.graphs_for(spb.GRAPH_OPERATION_VISION)}
    handles = [h for h in prepared.manifest.graph_handles if h.graph in graphs and h.rank == rank]
    return sorted(handles, key=lambda h: h.capacity.patch_capacity)
