"""Host staging tables (Engram): each declared table, and every HOST_TABLE_ROWS binding against it.

A table is a PLACEMENT_HOST WEIGHT buffer of fixed shape [rows, width]; its hash declares 1 to 8
n-gram tokens, at least one head and heads * ngram_tokens nonzero multipliers. A binding's
destination buffer is an INPUT of shape [packed tokens, heads, width] in the table's type, and a
graph taking host-table rows reads no device-owned pending token (the host must know every token
it hashes).
"""

from __future__ import annotations

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.index import ContractIndex, unique_names
from helios.contract.rules import MODEL, graph_path, require
from helios.contract.validate_manifest import static_dims

MAX_NGRAM_TOKENS = 8


def check_host_tables(model: spb.ModelContract, index: ContractIndex) -> None:
    tables = unique_names(model.host_tables, "name", f"{MODEL}.host_tables", "host staging table")
    widths = {}
    for name, entry in tables.items():
        widths[name] = _check_table(entry.message, entry.path, index)
    for i, graph in enumerate(model.graphs):
        for j, binding in enumerate(graph.bindings):
            if binding.source != spb.VALUE_SOURCE_HOST_TABLE_ROWS:
                continue
            path = f"{graph_path(i)}.bindings[{j}]"
            require(graph.pending_token_view == "", f"{graph_path(i)}.pending_token_view",
                    "a graph taking host-table rows hashes host-known tokens; it reads no device-owned pending token")
            table = tables[binding.host_table].message
            _check_destination(binding, path, index, table, widths[binding.host_table])


def _check_table(table: spb.HostStagingTable, path: str, index: ContractIndex) -> tuple[int, int]:
    """Checks one declaration; returns its (dtype, width)."""
    buffer = index.buffers.get(table.table)
    require(buffer is not None, f"{path}.table", f"unknown buffer {table.table!r}")
    message = buffer.message
    require(message.role == mpb.BUFFER_ROLE_WEIGHT, f"{path}.table", f"{table.table!r} is not a WEIGHT buffer")
    require(message.placement == mpb.PLACEMENT_HOST, f"{path}.table", f"{table.table!r} does not live in host memory")
    dims = static_dims(message)
    require(dims is not None and len(dims) == 2, f"{path}.table", "a host table has the fixed shape [rows, width]")
    require(1 <= table.ngram_tokens <= MAX_NGRAM_TOKENS, f"{path}.ngram_tokens",
            f"an n-gram holds 1 to {MAX_NGRAM_TOKENS} tokens")
    require(table.heads >= 1, f"{path}.heads", "at least one hash head")
    expected = table.heads * table.ngram_tokens
    require(len(table.multipliers) == expected, f"{path}.multipliers",
            f"{len(table.multipliers)} multipliers; heads * ngram_tokens is {expected}")
    for k, multiplier in enumerate(table.multipliers):
        require(multiplier != 0, f"{path}.multipliers[{k}]", "a multiplier is nonzero")
    return message.dtype, dims[1]


def _check_destination(binding: spb.ValueBinding, path: str, index: ContractIndex, table: spb.HostStagingTable,
                       dtype_width: tuple[int, int]) -> None:
    destination = index.destinations.get(binding.destination)
    if destination is None:
        return  # unregistered destinations are reported by the cross-document rules
    buffer = index.buffers.get(destination.message.buffer)
    if buffer is None:
        return
    dtype, width = dtype_width
    dims = static_dims(buffer.message)
    require(buffer.message.role == mpb.BUFFER_ROLE_INPUT, f"{path}.destination", "host-table rows go to an INPUT buffer")
    require(buffer.message.dtype == dtype, f"{path}.destination", "host-table rows keep the table's element type")
    require(dims is not None and len(dims) == 3 and dims[1:] == [table.heads, width], f"{path}.destination",
            f"host-table rows need a buffer of shape [packed tokens, heads={table.heads}, width={width}]")
