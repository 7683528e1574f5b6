"""A hybrid core (its recurrent state in state rows) that declares SNAPSHOT, RESTORATION and RESUME
graphs, built from a prepared core of the hybrid family (tests/runtime/test_hybrid_runtime.py):

- SNAPSHOT (`snapshot`, variants of 1 and 2 rows): copies each live row's slot state rows
  (LIVE_STATE_ROWS) of every recurrent plane into its snapshot row (SNAPSHOT_DESTINATION), and
  marks the snapshot row in ``state_copy_marks`` with SNAPSHOT_MARK + the source row;
- RESTORATION (`restore`, the same variants): copies a snapshot row (RESTORE_SOURCE) into the
  slot's rows and marks them with RESTORE_MARK + the snapshot row; `broken=True` writes zeros
  instead (a control: the restore is then visibly the program's);
- RESUME (`resume`): the core's PREFILL programs declared again as RESUME graphs (the same captured
  program continues a lane from whatever endpoint its state holds);
- no MIXED graphs (prompt and decode steps alternate, so a readmitted request resumes in a prompt
  step of its own).

The state-copy programs take the state planes whole (their row dimension is dynamic: execution
rows, then the snapshot rows the runtime sizes at load).
"""

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

SNAPSHOT_MARK, RESTORE_MARK = 1000, 2000
PLANES = ("conv_state", "ssm_state")
MARKS = "state_copy_marks"
INPUTS = (*PLANES, MARKS, "copy_state_rows", "copy_snapshot_rows", "copy_live_rows")
BATCHES = (1, 2)


class CopyStateRows(torch.nn.Module):
    """Copies row src -> dst of every plane for each live submission row (no data-dependent shapes:
    a gather through a row map, so it captures into a CUDA graph)."""

    def __init__(self, restore: bool, broken: bool = False):
        super().__init__()
        self.restore, self.broken = restore, broken

    def forward(self, weights: list[torch.Tensor], conv_state, ssm_state, marks, state_rows, snapshot_rows,
                live_rows):
        total = conv_state.shape[1]
        live = torch.arange(state_rows.shape[0], device=state_rows.device) < live_rows[0]
        source, target = (snapshot_rows, state_rows) if self.restore else (state_rows, snapshot_rows)
        beyond = torch.full_like(source, total).to(torch.int64)
        source = torch.where(live, source.to(torch.int64), beyond)
        target = torch.where(live, target.to(torch.int64), beyond)
        identity = torch.arange(total + 1, device=conv_state.device)
        mapping = identity.scatter(0, target, source)[:total]
        copied = mapping != identity[:total]
        for plane in (conv_state, ssm_state):
            rows = plane.index_select(1, mapping)
            if self.broken:
                keep = (~copied).to(plane.dtype).view(1, total, *([1] * (plane.dim() - 2)))
                rows = rows * keep
            plane.copy_(rows)
        mark = RESTORE_MARK if self.restore else SNAPSHOT_MARK
        marks.copy_(torch.where(copied, mapping + mark, marks))
        return ()


def write_state_graphs_core(source, key_path: Path, namespace: str, target: Path, broken: bool = False) -> Path:
    """`source` (an opened hybrid core) with the graphs of the module docstring, signed with `key_path`."""
    contract_bytes, manifest_bytes = source.prepared.encode()
    contract = spb.ServingContract.FromString(contract_bytes)
    manifest = mpb.ExecutionManifest.FromString(manifest_bytes)
    _drop_operation(contract, manifest, spb.GRAPH_OPERATION_MIXED)
    _declare_resume(contract, manifest)
    writer = CoreWriter()
    for info in source.resources:
        writer.add_resource(info.id, info.kind, source.read_resource(info.id), rank=info.rank)
    _declare_buffers(contract, manifest)
    for name, operation, restore in (("snapshot", spb.GRAPH_OPERATION_SNAPSHOT, False),
                                     ("restore", spb.GRAPH_OPERATION_RESTORATION, True)):
        graph = _declare_copy_graph(contract, manifest, name, operation)
        ranks = manifest.ranks
        for batch in BATCHES:
            resource = f"program.{name}.b{batch}"  # one program for every rank (each copies its own shard)
            writer.add_resource(resource, ResourceKind.PROGRAM_IMAGE,
                                _export(CopyStateRows(restore, broken and restore), source, batch),
                                rank=0 if ranks == 1 else None)
            for rank in range(ranks):
                handle = manifest.graph_handles.add(graph=name, resource_id=resource, rank=rank)
                handle.capacity.CopyFrom(graph.variants[BATCHES.index(batch)])
                handle.program_inputs.extend(INPUTS)
    writer.set_contract(PreparedContract.from_messages(contract, manifest))
    writer.set_publisher(namespace)
    writer.add_signing_key(load_signing_key(key_path))
    writer.write(target)
    return target


_EXPORTED: dict[tuple, bytes] = {}  # one copy program per process for the same kind, planes and batch


def _export(module: CopyStateRows, source, batch: int) -> bytes:
    buffers = {b.name: b for b in source.prepared.manifest.buffers}
    rows = 6  # any count: the row dimension is dynamic
    planes = [torch.zeros([rows if d.WhichOneof("extent") == "load_extent" else d.size for d in buffers[name].shape])
              for name in PLANES]
    key = (module.restore, module.broken, batch, tuple(tuple(plane.shape) for plane in planes))
    if key not in _EXPORTED:
        _EXPORTED[key] = _exported(module, planes, batch)
    return _EXPORTED[key]


def _exported(module: CopyStateRows, planes: list[torch.Tensor], batch: int) -> bytes:
    rows = planes[0].shape[1]
    example = (*planes, torch.zeros(rows, dtype=torch.int64), torch.zeros(batch, dtype=torch.int32),
               torch.zeros(batch, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    dim = torch.export.Dim("state_rows", min=2)
    dynamic = ([], {1: dim}, {1: dim}, {0: dim}, None, None, None)
    exported = torch.export.export(module, ([], *example), dynamic_shapes=dynamic, strict=False)
    # Functionalized: the in-place writes become input mutations, which saving keeps and loading
    # applies back to the buffers (as the INITIALIZATION test core does).
    return encode_program(exported.run_decompositions({}))


def _declare_buffers(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> None:
    marks = manifest.buffers.add(name=MARKS, dtype=mpb.DTYPE_INT64, placement=mpb.PLACEMENT_DEVICE,
                                 role=mpb.BUFFER_ROLE_PERSISTENT_STATE)
    marks.shape.add(load_extent=mpb.LOAD_EXTENT_STATE_ROWS)
    contract.model.state_views.add(name=MARKS, buffer=MARKS, row_stride=8, byte_extent=8)
    for name, size in (("copy_state_rows", max(BATCHES)), ("copy_snapshot_rows", max(BATCHES)),
                       ("copy_live_rows", 1)):
        buffer = manifest.buffers.add(name=name, dtype=mpb.DTYPE_INT32, placement=mpb.PLACEMENT_DEVICE,
                                      role=mpb.BUFFER_ROLE_INPUT)
        buffer.shape.add(size=size)
        manifest.destinations.add(name=name, buffer=name)


def _declare_copy_graph(contract, manifest, name: str, operation: int) -> spb.GraphContract:
    row_source = (spb.VALUE_SOURCE_RESTORE_SOURCE if operation == spb.GRAPH_OPERATION_RESTORATION
                  else spb.VALUE_SOURCE_SNAPSHOT_DESTINATION)
    graph = contract.model.graphs.add(name=name, operation=operation, state_rows_per_request=1)
    for batch in BATCHES:
        graph.variants.add(batch_capacity=batch, token_capacity=1, packed_token_capacity=batch)
    graph.bindings.add(destination="copy_state_rows", source=spb.VALUE_SOURCE_LIVE_STATE_ROWS,
                       indexing=spb.INDEXING_SUBMISSION_ROW, padding=-1)
    graph.bindings.add(destination="copy_snapshot_rows", source=row_source, indexing=spb.INDEXING_SUBMISSION_ROW,
                       padding=-1)
    graph.bindings.add(destination="copy_live_rows", source=spb.VALUE_SOURCE_LIVE_ROW_COUNT,
                       indexing=spb.INDEXING_SCALAR)
    graph.state_accesses.add(view=MARKS, mode=spb.ACCESS_MODE_READ_WRITE)
    manifest.execution_catalog.add(graph=name, operation=operation)
    return graph


def _declare_resume(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> None:
    """A RESUME graph for each plain PREFILL graph, running the same programs."""
    for prefill in [g for g in contract.model.graphs if g.operation == spb.GRAPH_OPERATION_PREFILL
                    and not g.token_logprobs]:
        resume = contract.model.graphs.add()
        resume.CopyFrom(prefill)
        resume.name, resume.operation = f"resume_{prefill.name}", spb.GRAPH_OPERATION_RESUME
        manifest.execution_catalog.add(graph=resume.name, operation=spb.GRAPH_OPERATION_RESUME)
        for handle in [h for h in manifest.graph_handles if h.graph == prefill.name]:
            copy = manifest.graph_handles.add()
            copy.CopyFrom(handle)
            copy.graph = resume.name


def _drop_operation(contract: spb.ServingContract, manifest: mpb.ExecutionManifest, operation: int) -> None:
    names = {g.name for g in contract.model.graphs if g.operation == operation}
    kept = [g for g in contract.model.graphs if g.name not in names]
    del contract.model.graphs[:]
    contract.model.graphs.extend(kept)
    for field in (manifest.graph_handles, manifest.execution_catalog):
        kept_entries = [entry for entry in field if entry.graph not in names]
        del field[:]
        field.extend(kept_entries)
