"""Rules that join the serving contract and the execution manifest: registered destinations,
page-table views, state views inside their buffers, history regions backed by cache storage,
catalog agreement, graph handles per variant and rank, weight dependencies and completion
capacities. Tuned bindings are checked in validate_tuning.py.
"""

from __future__ import annotations

import math

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.binding_rules import FLOAT_SOURCES, UNTYPED_SOURCES
from helios.contract.dtypes import element_bytes, is_integer
from helios.contract.index import ContractIndex
from helios.contract.rules import MANIFEST, enum_label, graph_path, op_label, require, role_label, source_label
from helios.contract.validate_manifest import COMPLETION, static_dims
from helios.contract.validate_model import PAGED_KINDS

EXTENT_OF_KIND = {
    spb.HISTORY_KIND_PAGED_KEY_VALUE: mpb.LOAD_EXTENT_PHYSICAL_PAGES,
    spb.HISTORY_KIND_PAGED_LATENT: mpb.LOAD_EXTENT_PHYSICAL_PAGES,
    spb.HISTORY_KIND_RECURRENT: mpb.LOAD_EXTENT_STATE_ROWS,
    spb.HISTORY_KIND_CONTINUATION: mpb.LOAD_EXTENT_STATE_ROWS,
}


def check_cross(contract: spb.ServingContract, manifest: mpb.ExecutionManifest, index: ContractIndex) -> None:
    model = contract.model
    _check_page_table_views(contract, index)
    for i, graph in enumerate(model.graphs):
        _check_graph_bindings(graph, graph_path(i), index)
        for j, name in enumerate(graph.resource_dependencies):
            target = index.buffers.get(name)
            path = f"{graph_path(i)}.resource_dependencies[{j}]"
            require(target is not None, path, f"unknown buffer {name!r}")
            require(target.message.role == mpb.BUFFER_ROLE_WEIGHT, path, f"{name!r} is not a WEIGHT buffer")
    for name, view in index.state_views.items():
        _check_state_view(view.message, view.path, index)
    _check_regions(model, index)
    _check_catalogs(model, index)
    _check_handles(model, manifest, index)
    _check_completion_capacity(model, manifest, index)


def _check_graph_bindings(graph: spb.GraphContract, path: str, index: ContractIndex) -> None:
    for j, binding in enumerate(graph.bindings):
        item = f"{path}.bindings[{j}]"
        destination = index.destinations.get(binding.destination)
        require(
            destination is not None,
            f"{item}.destination",
            f"{binding.destination!r} is not a registered transport destination",
        )
        is_page_table = binding.source == spb.VALUE_SOURCE_PAGE_TABLE
        has_view = binding.destination in index.page_table_views
        require(
            is_page_table == has_view,
            f"{item}.source",
            "PAGE_TABLE values go exactly to page-table view destinations"
            if is_page_table
            else f"{binding.destination!r} is a page-table view; only PAGE_TABLE values go there",
        )
        dtype = index.buffers[destination.message.buffer].message.dtype
        label = source_label(binding.source)
        if binding.source in FLOAT_SOURCES:
            require(dtype == mpb.DTYPE_FLOAT32, f"{item}.destination", f"{label} values need an FP32 destination")
        elif binding.source not in UNTYPED_SOURCES:
            require(
                is_integer(dtype),
                f"{item}.destination",
                f"{label} values need an integer destination, not {enum_label(mpb.Dtype, dtype)}",
            )


def _check_page_table_views(contract: spb.ServingContract, index: ContractIndex) -> None:
    page_tokens = contract.model.cache.page_tokens
    pages = math.ceil(contract.context_tokens / page_tokens)
    for name, entry in index.page_table_views.items():
        view = entry.message
        destination = index.destinations.get(name)
        require(destination is not None, f"{entry.path}.destination", f"{name!r} is not a registered transport destination")
        region = index.regions.get(view.region)
        require(region is not None, f"{entry.path}.region", f"unknown history region {view.region!r}")
        require(region.message.kind in PAGED_KINDS, f"{entry.path}.region", f"region {view.region!r} is not paged")
        buffer = index.buffers[destination.message.buffer].message
        dims = static_dims(buffer)
        width = dims[-1] if dims else 0
        require(
            width >= pages + view.page_offset,
            f"{entry.path}.destination",
            f"page table rows hold {width} entries; a full context needs {pages} + page_offset {view.page_offset}",
        )


def _check_state_view(view: spb.StateView, path: str, index: ContractIndex) -> None:
    target = index.buffers.get(view.buffer)
    require(target is not None, f"{path}.buffer", f"unknown buffer {view.buffer!r}")
    buffer = target.message
    role = buffer.role
    require(
        role == mpb.BUFFER_ROLE_PERSISTENT_STATE,
        f"{path}.buffer",
        f"state views lie in persistent state, not {role_label(role)}",
    )
    size = element_bytes(buffer.dtype)
    end = view.byte_offset + view.byte_extent
    if view.row_stride == 0:
        dims = static_dims(buffer)
        require(dims is not None, f"{path}.row_stride", "a whole-buffer view needs a fixed shape; declare the row stride")
        total = math.prod(dims) * size
        require(end <= total, f"{path}.byte_extent", f"bytes [{view.byte_offset}, {end}) lie outside {view.buffer!r} ({total} bytes)")
        return
    rest = [dim.size for dim in buffer.shape[1:] if dim.WhichOneof("extent") == "size"]
    require(len(rest) == len(buffer.shape) - 1, f"{path}.row_stride", "rows of the buffer have a load-time extent")
    row = math.prod(rest) * size
    require(view.row_stride == row, f"{path}.row_stride", f"row stride {view.row_stride} differs from the buffer's {row}-byte rows")
    require(
        end <= row,
        f"{path}.byte_extent",
        f"bytes [{view.byte_offset}, {end}) lie outside a {row}-byte row of {view.buffer!r}",
    )


def _check_regions(model: spb.ModelContract, index: ContractIndex) -> None:
    owner: dict[str, str] = {}
    for name, entry in index.regions.items():
        region = entry.message
        for j, plane in enumerate(region.planes):
            path = f"{entry.path}.planes[{j}]"
            target = index.buffers.get(plane)
            require(target is not None, path, f"unknown buffer {plane!r}")
            buffer = target.message
            require(buffer.role == mpb.BUFFER_ROLE_CACHE_STORAGE, path, f"{plane!r} is not CACHE_STORAGE")
            require(plane not in owner, path, f"{plane!r} already belongs to region {owner.get(plane)!r}")
            owner[plane] = name
            extents = {dim.load_extent for dim in buffer.shape if dim.WhichOneof("extent") == "load_extent"}
            extent = EXTENT_OF_KIND.get(region.kind)
            if extent is not None:
                require(
                    extent in extents,
                    path,
                    f"{enum_label(spb.HistoryKind, region.kind)} planes are sized by {enum_label(mpb.LoadExtent, extent)}",
                )
            _check_window_extent(region, extents, path, index)
    for name, entry in index.buffers.items():
        if entry.message.role == mpb.BUFFER_ROLE_CACHE_STORAGE:
            require(name in owner, f"{entry.path}.role", f"cache storage {name!r} belongs to no history region")
    for name, entry in index.cursors.items():
        region = entry.message.region
        require(region in index.regions, f"{entry.path}.region", f"unknown history region {region!r}")


def _check_window_extent(region: spb.HistoryRegion, extents: set[int], path: str, index: ContractIndex) -> None:
    """A sliding-window region owns its page ids (planes sized by WINDOW_PAGES) only with a page-table
    view of its own; otherwise its planes share the PHYSICAL_PAGES ids of the other paged regions."""
    if region.kind == spb.HISTORY_KIND_SLIDING_WINDOW:
        require(bool(extents & _WINDOW_EXTENTS), path, "SLIDING_WINDOW planes are sized by PHYSICAL_PAGES or WINDOW_PAGES")
    if mpb.LOAD_EXTENT_WINDOW_PAGES not in extents:
        return
    require(region.kind == spb.HISTORY_KIND_SLIDING_WINDOW, path, "only SLIDING_WINDOW planes are sized by WINDOW_PAGES")
    require(mpb.LOAD_EXTENT_PHYSICAL_PAGES not in extents, path, "a plane is sized by one page extent")
    require(any(view.message.region == region.name for view in index.page_table_views.values()), path,
            f"region {region.name!r} owns its page ids (WINDOW_PAGES) but no page-table view names it")


_WINDOW_EXTENTS = {mpb.LOAD_EXTENT_PHYSICAL_PAGES, mpb.LOAD_EXTENT_WINDOW_PAGES}


def _check_catalogs(model: spb.ModelContract, index: ContractIndex) -> None:
    for i, graph in enumerate(model.graphs):
        path = f"{graph_path(i)}.operation"
        if graph.operation == spb.GRAPH_OPERATION_TUNING:
            require(graph.name in index.tuning_catalog, path, f"TUNING graph {graph.name!r} is not in the tuning catalog")
            require(graph.name not in index.execution_catalog, path, "tuning producers stay out of the execution catalog")
            continue
        entry = index.execution_catalog.get(graph.name)
        require(entry is not None, path, f"graph {graph.name!r} is not in the execution catalog")
        cataloged = entry.message.operation
        require(
            cataloged == graph.operation,
            path,
            f"{op_label(graph.operation)} disagrees with the execution catalog ({op_label(cataloged)})",
        )
    for name, entry in index.execution_catalog.items():
        require(name in index.graphs, f"{entry.path}.graph", f"unknown graph {name!r}")
    for name, entry in index.tuning_catalog.items():
        # Every other graph is in the execution catalog, which the tuning catalog may not share.
        require(name in index.graphs, f"{entry.path}.graph", f"unknown graph {name!r}")


def _check_handles(model: spb.ModelContract, manifest: mpb.ExecutionManifest, index: ContractIndex) -> None:
    present: set[tuple[str, bytes, int]] = set()
    for i, handle in enumerate(manifest.graph_handles):
        path = f"{MANIFEST}.graph_handles[{i}]"
        graph = index.graphs.get(handle.graph)
        require(graph is not None, f"{path}.graph", f"unknown graph {handle.graph!r}")
        key = handle.capacity.SerializeToString(deterministic=True)
        variants = {v.SerializeToString(deterministic=True) for v in graph.message.variants}
        require(key in variants, f"{path}.capacity", f"not a declared capacity variant of {handle.graph!r}")
        present.add((handle.graph, key, handle.rank))
    for i, graph in enumerate(model.graphs):
        for j, variant in enumerate(graph.variants):
            key = variant.SerializeToString(deterministic=True)
            for rank in range(manifest.ranks):
                require(
                    (graph.name, key, rank) in present,
                    f"{graph_path(i)}.variants[{j}]",
                    f"missing graph variant: no program handle on rank {rank}",
                )


def _check_completion_capacity(model: spb.ModelContract, manifest: mpb.ExecutionManifest, index: ContractIndex) -> None:
    layout = manifest.completion
    rows = static_dims(index.buffers[layout.buffer].message)[1]
    serving = [v for g in model.graphs if g.operation != spb.GRAPH_OPERATION_TUNING for v in g.variants]
    widest_rows = max((v.batch_capacity for v in serving), default=0)
    require(rows >= widest_rows, f"{COMPLETION}.buffer", f"{rows} record rows; graphs submit up to {widest_rows}")
    tokens = next(f for f in layout.fields if f.kind == mpb.COMPLETION_FIELD_KIND_SAMPLED_TOKENS)
    widest = max([1] + [v.lane_limit for v in serving])
    require(tokens.count >= widest, f"{COMPLETION}.fields", f"SAMPLED_TOKENS holds {tokens.count}; a lane emits up to {widest}")
    confident = [v for v in serving if v.confidence_width > 0]
    if not confident:
        return
    require(layout.confidence_buffer != "", f"{COMPLETION}.confidence_buffer", "graphs produce confidence; declare its buffer")
    dims = static_dims(index.buffers[layout.confidence_buffer].message)
    slots = max(v.batch_capacity for v in confident)
    width = max(v.confidence_width for v in confident)
    require(dims[1] >= slots, f"{COMPLETION}.confidence_buffer", f"request_slots {dims[1]} < {slots} confident rows")
    require(dims[2] >= width, f"{COMPLETION}.confidence_buffer", f"draft_capacity {dims[2]} < confidence width {width}")
