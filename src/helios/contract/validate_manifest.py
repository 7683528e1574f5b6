"""ExecutionManifest rules that need only the manifest: version, ranks, buffer shapes and
roles, transport destinations, graph handles, catalogs and the completion record layout.
"""

from __future__ import annotations

from helios.contract import manifest_pb2 as mpb
from helios.contract.dtypes import element_bytes, is_integer
from helios.contract.index import ContractIndex
from helios.contract.rules import MANIFEST, enum_label, fail, require, role_label

SUPPORTED_MANIFEST_VERSIONS = (1,)
EXTENT_ROLES = frozenset({mpb.BUFFER_ROLE_CACHE_STORAGE, mpb.BUFFER_ROLE_PERSISTENT_STATE})
REQUIRED_FIELDS = (
    mpb.COMPLETION_FIELD_KIND_SLOT,
    mpb.COMPLETION_FIELD_KIND_GENERATION,
    mpb.COMPLETION_FIELD_KIND_OFFERED_TOKENS,
    mpb.COMPLETION_FIELD_KIND_ACCEPTED_DRAFTS,
    mpb.COMPLETION_FIELD_KIND_EMITTED_TOKENS,
    mpb.COMPLETION_FIELD_KIND_SAMPLED_TOKENS,
    mpb.COMPLETION_FIELD_KIND_DRAFT_CURSOR,
    mpb.COMPLETION_FIELD_KIND_RESERVED_MODEL,
)
COMPLETION = f"{MANIFEST}.completion"


def static_dims(buffer: mpb.Buffer) -> list[int] | None:
    """The buffer's sizes when every dimension is fixed, else None."""
    if all(dim.WhichOneof("extent") == "size" for dim in buffer.shape):
        return [dim.size for dim in buffer.shape]
    return None


def check_manifest(manifest: mpb.ExecutionManifest, index: ContractIndex) -> None:
    require(
        manifest.version in SUPPORTED_MANIFEST_VERSIONS,
        f"{MANIFEST}.version",
        f"unsupported manifest version {manifest.version} (supported: 1)",
    )
    require(manifest.ranks > 0, f"{MANIFEST}.ranks", "at least one rank is required")
    for i, buffer in enumerate(manifest.buffers):
        _check_buffer(buffer, f"{MANIFEST}.buffers[{i}]")
    for i, destination in enumerate(manifest.destinations):
        path = f"{MANIFEST}.destinations[{i}].buffer"
        target = index.buffers.get(destination.buffer)
        require(target is not None, path, f"unknown buffer {destination.buffer!r}")
        role = target.message.role
        require(role == mpb.BUFFER_ROLE_INPUT, path, f"destinations feed INPUT buffers; {destination.buffer!r} is {role_label(role)}")
    _check_handles(manifest)
    _check_abi_operations(manifest)
    for name, entry in index.tuning_catalog.items():
        require(
            name not in index.execution_catalog,
            f"{entry.path}.graph",
            f"{name!r} is in both the execution and the tuning catalog",
        )
        _check_outputs(entry.message, entry.path, index)
    require(manifest.HasField("completion"), COMPLETION, "completion record layout is required")
    _check_completion(manifest.completion, index)
    _check_program_io(manifest, index)


def _check_buffer(buffer: mpb.Buffer, path: str) -> None:
    require(len(buffer.shape) > 0, f"{path}.shape", "shape is empty")
    for j, dim in enumerate(buffer.shape):
        kind = dim.WhichOneof("extent")
        require(kind is not None, f"{path}.shape[{j}]", "a dimension declares a size or a load-time extent")
        if kind == "size":
            require(dim.size > 0, f"{path}.shape[{j}].size", "dimension size is zero")
        else:
            require(
                buffer.role in EXTENT_ROLES,
                f"{path}.shape[{j}].load_extent",
                f"only cache storage and persistent state have load-time extents, not {role_label(buffer.role)}",
            )
    if buffer.role == mpb.BUFFER_ROLE_WEIGHT:
        require(buffer.resource_id != "", f"{path}.resource_id", "weight buffers name their core resource")
    else:
        require(buffer.resource_id == "", f"{path}.resource_id", "only weight buffers name a core resource")
    if buffer.role == mpb.BUFFER_ROLE_CACHE_STORAGE:
        require(buffer.placement == mpb.PLACEMENT_DEVICE, f"{path}.placement", "cache storage lives in device memory")


def _check_handles(manifest: mpb.ExecutionManifest) -> None:
    seen: dict[bytes, int] = {}
    for i, handle in enumerate(manifest.graph_handles):
        path = f"{MANIFEST}.graph_handles[{i}]"
        require(handle.graph != "", f"{path}.graph", "graph name is empty")
        require(handle.HasField("capacity"), f"{path}.capacity", "capacity variant is required")
        require(handle.resource_id != "", f"{path}.resource_id", "program resource id is empty")
        require(handle.rank < manifest.ranks, f"{path}.rank", f"rank {handle.rank} >= ranks ({manifest.ranks})")
        key = mpb.GraphHandle(graph=handle.graph, capacity=handle.capacity, rank=handle.rank).SerializeToString(
            deterministic=True
        )
        if key in seen:
            fail(path, f"duplicate handle for this graph, variant and rank (graph_handles[{seen[key]}])")
        seen[key] = i


def _check_outputs(producer: mpb.TuningProducer, path: str, index: ContractIndex) -> None:
    require(len(producer.outputs) > 0, f"{path}.outputs", "a tuning producer populates at least one buffer")
    seen: set[str] = set()
    for j, name in enumerate(producer.outputs):
        item = f"{path}.outputs[{j}]"
        require(name in index.buffers, item, f"unknown buffer {name!r}")
        require(name not in seen, item, f"duplicate output {name!r}")
        seen.add(name)


def _check_completion(layout: mpb.CompletionLayout, index: ContractIndex) -> None:
    require(layout.frames == 2, f"{COMPLETION}.frames", "completion records use two execution frames")
    target = index.buffers.get(layout.buffer)
    require(target is not None, f"{COMPLETION}.buffer", f"unknown buffer {layout.buffer!r}")
    buffer = target.message
    require(buffer.role == mpb.BUFFER_ROLE_OUTPUT, f"{COMPLETION}.buffer", "completion records live in an OUTPUT buffer")
    require(buffer.dtype == mpb.DTYPE_UINT8, f"{COMPLETION}.buffer", "completion records are raw UINT8 bytes")
    dims = static_dims(buffer)
    require(
        dims is not None and len(dims) == 3 and dims[0] == layout.frames and dims[2] == layout.record_bytes,
        f"{COMPLETION}.buffer",
        f"buffer shape must be [frames={layout.frames}, rows, record_bytes={layout.record_bytes}]",
    )
    if layout.submission_input:
        source = index.buffers.get(layout.submission_input)
        require(source is not None, f"{COMPLETION}.submission_input", f"unknown buffer {layout.submission_input!r}")
        message = source.message
        require(
            message.role == mpb.BUFFER_ROLE_INPUT and message.dtype == mpb.DTYPE_INT64 and static_dims(message) in ([], [1]),
            f"{COMPLETION}.submission_input",
            "the submission sequence is a scalar INT64 INPUT buffer",
        )
    kinds: dict[int, int] = {}
    spans: list[tuple[int, int, int]] = []
    for j, field in enumerate(layout.fields):
        path = f"{COMPLETION}.fields[{j}]"
        label = enum_label(mpb.CompletionFieldKind, field.kind)
        require(field.kind not in kinds, f"{path}.kind", f"duplicate field {label} (fields[{kinds.get(field.kind)}])")
        kinds[field.kind] = j
        require(is_integer(field.dtype), f"{path}.dtype", "completion fields are integers")
        require(field.count > 0, f"{path}.count", "count is zero")
        size = element_bytes(field.dtype)
        require(field.byte_offset % size == 0, f"{path}.byte_offset", f"not aligned to {size} bytes")
        end = field.byte_offset + size * field.count
        require(end <= layout.record_bytes, f"{path}.count", f"field ends at byte {end}, past record_bytes")
        for begin, stop, other in spans:
            require(end <= begin or field.byte_offset >= stop, f"{path}.byte_offset", f"overlaps fields[{other}]")
        spans.append((field.byte_offset, end, j))
    for kind in REQUIRED_FIELDS:
        require(kind in kinds, f"{COMPLETION}.fields", f"missing field {enum_label(mpb.CompletionFieldKind, kind)}")
    if layout.confidence_buffer:
        _check_confidence(layout, index)


def _check_confidence(layout: mpb.CompletionLayout, index: ContractIndex) -> None:
    path = f"{COMPLETION}.confidence_buffer"
    target = index.buffers.get(layout.confidence_buffer)
    require(target is not None, path, f"unknown buffer {layout.confidence_buffer!r}")
    buffer = target.message
    require(buffer.role == mpb.BUFFER_ROLE_OUTPUT, path, "proposal confidence lives in an OUTPUT buffer")
    require(buffer.dtype == mpb.DTYPE_FLOAT32, path, "proposal confidence is contiguous FP32 storage")
    dims = static_dims(buffer)
    require(
        dims is not None and len(dims) == 3 and dims[0] == layout.frames,
        path,
        f"proposal confidence has shape [frames={layout.frames}, request_slots, draft_capacity]",
    )


def _check_abi_operations(manifest: mpb.ExecutionManifest) -> None:
    """Declared ABI ops are unique and non-empty; every op a handle names is declared."""
    declared: dict[str, int] = {}
    for i, operation in enumerate(manifest.abi_operations):
        path = f"{MANIFEST}.abi_operations[{i}]"
        require("::" in operation.name, f"{path}.name", f"{operation.name!r} is not a qualified op name (ns::name)")
        require(operation.name not in declared, f"{path}.name", f"duplicate op {operation.name!r}")
        require(bool(operation.schema), f"{path}.schema", "an op declares its schema")
        declared[operation.name] = i
    for i, handle in enumerate(manifest.graph_handles):
        for j, name in enumerate(handle.abi_operations):
            require(
                name in declared,
                f"{MANIFEST}.graph_handles[{i}].abi_operations[{j}]",
                f"op {name!r} is not declared in abi_operations",
            )


_NOT_PROGRAM_INPUTS = frozenset({mpb.BUFFER_ROLE_WEIGHT, mpb.BUFFER_ROLE_OUTPUT})


def _check_program_io(manifest: mpb.ExecutionManifest, index: ContractIndex) -> None:
    """Program inputs name non-weight, non-output buffers; outputs name OUTPUT buffers; no repeats."""
    for i, handle in enumerate(manifest.graph_handles):
        path = f"{MANIFEST}.graph_handles[{i}]"
        for field, names in (("program_inputs", handle.program_inputs), ("program_outputs", handle.program_outputs)):
            seen: set[str] = set()
            for j, name in enumerate(names):
                item = f"{path}.{field}[{j}]"
                require(name not in seen, item, f"{name!r} is listed twice")
                seen.add(name)
                target = index.buffers.get(name)
                require(target is not None, item, f"unknown buffer {name!r}")
                role = target.message.role
                if field == "program_inputs":
                    require(role not in _NOT_PROGRAM_INPUTS, item, f"{name!r} is {role_label(role)}, not a program input")
                else:
                    require(role == mpb.BUFFER_ROLE_OUTPUT, item, f"{name!r} is {role_label(role)}, not OUTPUT")
