"""The fixture core plus an INITIALIZATION graph: its program initializes the state of the slots a step
admits (zero output counts and device-owned pending tokens, as the runtime does for cores without
one) and marks each initialized state row with its generation + 1000 in ``init_marks``, so a test
sees that it ran, over which rows, and that the runtime left the initialization to it."""

from __future__ import annotations

from pathlib import Path

import torch

from helios.abi.program_image import encode_program
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.core.keys import load_signing_key
from helios.core.records import ResourceKind
from helios.core.writer import CoreWriter

MARK = 1000
INPUTS = ("output_counts", "pending_tokens", "init_marks", "request_slots", "generations", "live_rows", "state_rows")


class InitializeProgram(torch.nn.Module):
    """Writes only the state rows of the live submission rows."""

    def forward(self, weights: list[torch.Tensor], output_counts, pending_tokens, init_marks, request_slots,
                generations, live_rows, state_rows):
        live = torch.arange(state_rows.shape[0]) < live_rows[0]
        rows = state_rows.to(torch.int64).clamp(min=0)
        hit = torch.zeros(output_counts.shape[0], dtype=torch.int64).index_add_(0, rows, live.to(torch.int64))
        marks = torch.zeros_like(hit).index_add_(0, rows, torch.where(live, generations + MARK, 0))
        keep = hit == 0
        output_counts.mul_(keep[:, None].to(output_counts.dtype))
        pending_tokens.mul_(keep.to(pending_tokens.dtype))
        init_marks.copy_(torch.where(keep, init_marks, marks))
        return ()


def write_initialization_core(fixture, key_path: Path, namespace: str, target: Path) -> Path:
    contract_bytes, manifest_bytes = fixture.prepared.encode()
    contract = spb.ServingContract.FromString(contract_bytes)
    manifest = mpb.ExecutionManifest.FromString(manifest_bytes)
    rows = contract.max_concurrency
    writer = CoreWriter()
    for info in fixture.resources:
        writer.add_resource(info.id, info.kind, fixture.read_resource(info.id), rank=info.rank)
    _declare(contract, manifest, rows)
    example = [torch.zeros(rows, 320, dtype=torch.int32), torch.zeros(rows, dtype=torch.int64),
               torch.zeros(rows, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64),
               torch.zeros(rows, dtype=torch.int64), torch.zeros(1, dtype=torch.int32),
               torch.zeros(rows, dtype=torch.int32)]
    exported = torch.export.export(InitializeProgram(), ([], *example), strict=False)
    # A program returning nothing: functionalizing records its in-place writes as input-mutation
    # outputs, which saving needs and loading applies back to the buffers (as startup tuning does).
    exported = exported.run_decompositions({})
    writer.add_resource("program.initialize", ResourceKind.PROGRAM_IMAGE, encode_program(exported), rank=0)
    writer.set_contract(PreparedContract.from_messages(contract, manifest))
    writer.set_publisher(namespace)
    writer.add_signing_key(load_signing_key(key_path))
    writer.write(target)
    return target


def _declare(contract: spb.ServingContract, manifest: mpb.ExecutionManifest, rows: int) -> None:
    marks = manifest.buffers.add(name="init_marks", dtype=mpb.DTYPE_INT64, placement=mpb.PLACEMENT_DEVICE,
                                 role=mpb.BUFFER_ROLE_PERSISTENT_STATE)
    marks.shape.add(load_extent=mpb.LOAD_EXTENT_STATE_ROWS)
    contract.model.state_views.add(name="init_marks", buffer="init_marks", row_stride=8, byte_extent=8)
    for name, dtype, size in (("live_rows", mpb.DTYPE_INT32, 1), ("state_rows", mpb.DTYPE_INT32, rows)):
        buffer = manifest.buffers.add(name=name, dtype=dtype, placement=mpb.PLACEMENT_DEVICE,
                                      role=mpb.BUFFER_ROLE_INPUT)
        buffer.shape.add(size=size)
        manifest.destinations.add(name=name, buffer=name)
    graph = contract.model.graphs.add(name="initialize", operation=spb.GRAPH_OPERATION_INITIALIZATION,
                                      state_rows_per_request=1)
    graph.variants.add(batch_capacity=rows, token_capacity=1, packed_token_capacity=rows)
    graph.bindings.add(destination="request_slots", source=spb.VALUE_SOURCE_SLOT,
                       indexing=spb.INDEXING_SUBMISSION_ROW, padding=-1)
    graph.bindings.add(destination="generations", source=spb.VALUE_SOURCE_GENERATION,
                       indexing=spb.INDEXING_SUBMISSION_ROW)
    graph.bindings.add(destination="live_rows", source=spb.VALUE_SOURCE_LIVE_ROW_COUNT, indexing=spb.INDEXING_SCALAR)
    graph.bindings.add(destination="state_rows", source=spb.VALUE_SOURCE_LIVE_STATE_ROWS,
                       indexing=spb.INDEXING_SUBMISSION_ROW, padding=-1)
    for view in ("output_counts", "pending_tokens", "init_marks"):
        graph.state_accesses.add(view=view, mode=spb.ACCESS_MODE_WRITE)
    manifest.execution_catalog.add(graph="initialize", operation=spb.GRAPH_OPERATION_INITIALIZATION)
    handle = manifest.graph_handles.add(graph="initialize", resource_id="program.initialize", rank=0)
    handle.capacity.CopyFrom(graph.variants[0])
    handle.program_inputs.extend(INPUTS)
