"""A core with both an INITIALIZATION graph and SNAPSHOT / RESTORATION graphs: a request restored from
a snapshot is admitted (its slot generation's first row) and initialized like any other, but its
INITIALIZATION runs before the restore, not after it, which would clear the state it restored.

The core is the state-graphs core (tests/support/state_graphs_core.py) plus an INITIALIZATION
program that clears every state row of the slots it initializes (the recurrent planes, output
counts, pending tokens and ``state_copy_marks``, the view RESTORATION writes too)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helios.abi.program_image import encode_program
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.core.keys import load_signing_key
from helios.core.reader import open_core
from helios.core.records import ResourceKind
from helios.core.writer import CoreWriter
from helios.runtime.offline import generate
from runtime.test_hybrid_runtime import NAMESPACE, PROMPTS, STEPS, expected, hybrid  # noqa: F401 (fixtures)
from runtime.test_state_graphs import launches, state_core, state_runtime  # noqa: F401 (fixture)
from support.state_graphs_core import MARKS, PLANES, RESTORE_MARK

CLEARED = (*PLANES, "output_counts", "pending_tokens", MARKS)
INPUTS = (*CLEARED, "init_state_rows", "init_live_rows")


class ClearSlots(torch.nn.Module):
    """Zeroes the state rows of the live submission rows in every buffer of `CLEARED`."""

    def forward(self, weights: list[torch.Tensor], conv_state, ssm_state, output_counts, pending_tokens, marks,
                state_rows, live_rows):
        cleared = (conv_state, ssm_state, output_counts, pending_tokens, marks)
        total = cleared[0].shape[1]
        live = torch.arange(state_rows.shape[0], device=state_rows.device) < live_rows[0]
        rows = torch.where(live, state_rows.to(torch.int64), total)
        hit = torch.zeros(total + 1, dtype=torch.int64, device=rows.device).index_add_(0, rows, torch.ones_like(rows))
        keep = hit[:total] == 0
        for index, buffer in enumerate(cleared):
            dim = 1 if index < len(PLANES) else 0  # the planes are [layers, rows, ...]
            shape = [1] * buffer.dim()
            shape[dim] = total
            buffer.mul_(keep.view(shape).to(buffer.dtype))
        return ()


def _export(source, batch: int) -> bytes:
    specs = {b.name: b for b in source.prepared.manifest.buffers}
    dtypes = {mpb.DTYPE_INT32: torch.int32, mpb.DTYPE_INT64: torch.int64}
    rows, dim = 6, torch.export.Dim("state_rows", min=2)  # the row dimension is dynamic
    example, dynamic = [], []
    for name in CLEARED:
        shape = [rows if d.WhichOneof("extent") == "load_extent" else d.size for d in specs[name].shape]
        example.append(torch.zeros(shape, dtype=dtypes.get(specs[name].dtype, torch.float32)))
        dynamic.append({1 if name in PLANES else 0: dim})
    example += [torch.zeros(batch, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)]
    exported = torch.export.export(ClearSlots(), ([], *example), dynamic_shapes=([], *dynamic, None, None),
                                   strict=False)
    return encode_program(exported.run_decompositions({}))


def rewritten_core(hybrid, state_core, directory: Path, rewrite) -> Path:
    """`state_core` with its contract and manifest changed by `rewrite(source, contract, manifest,
    writer)` (the writer holding the source's resources), signed as the hybrid fixtures sign, in
    `directory`."""
    root, _ = hybrid
    source = open_core(state_core, accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    contract_bytes, manifest_bytes = source.prepared.encode()
    contract = spb.ServingContract.FromString(contract_bytes)
    manifest = mpb.ExecutionManifest.FromString(manifest_bytes)
    writer = CoreWriter()
    for info in source.resources:
        writer.add_resource(info.id, info.kind, source.read_resource(info.id), rank=info.rank)
    rewrite(source, contract, manifest, writer)
    writer.set_contract(PreparedContract.from_messages(contract, manifest))
    writer.set_publisher(NAMESPACE)
    writer.add_signing_key(load_signing_key(root / "publisher.key"))
    target = directory / "rewritten.core"
    writer.write(target)
    return target


def add_initialization(source, contract, manifest, writer) -> None:
    batch = contract.max_concurrency
    for name, size in (("init_state_rows", batch), ("init_live_rows", 1)):
        buffer = manifest.buffers.add(name=name, dtype=mpb.DTYPE_INT32, placement=mpb.PLACEMENT_DEVICE,
                                      role=mpb.BUFFER_ROLE_INPUT)
        buffer.shape.add(size=size)
        manifest.destinations.add(name=name, buffer=name)
    graph = contract.model.graphs.add(name="initialize", operation=spb.GRAPH_OPERATION_INITIALIZATION,
                                      state_rows_per_request=1)
    graph.variants.add(batch_capacity=batch, token_capacity=1, packed_token_capacity=batch)
    graph.bindings.add(destination="init_state_rows", source=spb.VALUE_SOURCE_LIVE_STATE_ROWS,
                       indexing=spb.INDEXING_SUBMISSION_ROW, padding=-1)
    graph.bindings.add(destination="init_live_rows", source=spb.VALUE_SOURCE_LIVE_ROW_COUNT,
                       indexing=spb.INDEXING_SCALAR)
    for view in ("output_counts", "pending_tokens", MARKS):
        graph.state_accesses.add(view=view, mode=spb.ACCESS_MODE_WRITE)
    manifest.execution_catalog.add(graph="initialize", operation=spb.GRAPH_OPERATION_INITIALIZATION)
    handle = manifest.graph_handles.add(graph="initialize", resource_id="program.initialize", rank=0)
    handle.capacity.CopyFrom(graph.variants[0])
    handle.program_inputs.extend(INPUTS)
    writer.add_resource("program.initialize", ResourceKind.PROGRAM_IMAGE, _export(source, batch), rank=0)


@pytest.fixture(scope="module")
def initialized_core(hybrid, state_core, tmp_path_factory):  # noqa: F811
    return rewritten_core(hybrid, state_core, tmp_path_factory.mktemp("initialized"), add_initialization)


def test_a_restored_request_is_initialized_before_its_restore(hybrid, expected, initialized_core):  # noqa: F811
    runtime = state_runtime(hybrid, initialized_core)
    try:
        model = runtime.model
        assert len(model.initialization_programs) == 1 and len(model.state_copy_programs) > 0
        cold = generate(runtime.engine, [PROMPTS[0]], STEPS)[0]
        assert list(cold.token_ids) == expected[0]
        warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
        assert launches(runtime)["restoration"] == 1
        assert list(warm.token_ids) == expected[1]  # the tokens of a cold run: the restored state was kept
        marks = model.buffers[MARKS].tolist()[:model.num_slot_state_rows]
        assert any(mark >= RESTORE_MARK for mark in marks)  # the restored slot's row kept the restore's mark
    finally:
        runtime.close()
