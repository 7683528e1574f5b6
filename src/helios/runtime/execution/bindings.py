"""Bindings of shared packing (`helios.runtime.execution.packer`): each program's value bindings
resolved once at startup to the buffers behind their destinations. A binding that
`helios.contract.servable.SOURCES` does not serve fails startup (`UnsupportedBindingError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from helios.contract import PreparedContract
from helios.contract import serving_pb2 as spb
from helios.contract.rules import source_label
from helios.contract.servable import source_decision
from helios.errors import LoadError
from helios.runtime.cache.window_pages import window_view_names

S = spb


class UnsupportedBindingError(LoadError):
    """A selected program binds a value source this runtime cannot supply."""


@dataclass(frozen=True)
class Binding:
    """A value binding resolved to the buffer behind its destination."""

    destination: str
    buffer_name: str
    source: int
    indexing: int
    offset: int
    padding: int
    constant: int
    image_output: str = ""
    window: bool = False  # a page table of the window region's own ids (`PlanRow.new_window_ids`)
    host_table: str = ""


def resolve_bindings(prepared: PreparedContract, graph: str) -> tuple:
    """The graph's bindings with their destination buffers; a binding `servable.SOURCES` does not
    serve fails startup."""
    resolved = []
    operation = prepared.graphs[graph].operation
    window_views = window_view_names(prepared)
    for view in prepared.graphs[graph].bindings:
        reason = source_decision(view.source, view.indexing, operation)
        if reason is not None:
            raise UnsupportedBindingError(f"graph {graph!r} binds {source_label(view.source)}: {reason}")
        resolved.append(Binding(view.destination, view.buffer, view.source, view.indexing,
                                view.offset, view.padding, view.constant, view.image_output,
                                view.destination in window_views, view.host_table))
    return tuple(resolved)


def admission_elsewhere(bindings: Mapping[str, tuple], graph: str) -> tuple[Binding, ...]:
    """PHYSICAL_REQUEST_ROW bindings (page tables aside) of the other graphs into buffers `graph`
    does not bind: a slot admitted by `graph` must have them too (a DECODE-only EOS binding, say)."""
    own = {b.buffer_name for b in bindings[graph]}
    found: dict[str, Binding] = {}
    for name, items in bindings.items():
        for binding in items:
            if (name != graph and binding.indexing == S.INDEXING_PHYSICAL_REQUEST_ROW
                    and binding.source != S.VALUE_SOURCE_PAGE_TABLE and binding.buffer_name not in own):
                found.setdefault(binding.buffer_name, binding)
    return tuple(found.values())


def written_state(prepared: PreparedContract, graph: str) -> tuple[str, ...]:
    """Persistent-state buffers the graph writes (the packer's reset zeroes the written views' bytes
    of a (re)admitted slot, `Packer._reset_state`)."""
    writes = {S.ACCESS_MODE_WRITE, S.ACCESS_MODE_READ_WRITE}
    return tuple(sorted({a.buffer for a in prepared.graphs[graph].accesses if a.mode in writes}))
