"""Contract-driven cores: a signed core for any contract of the example's shape, without a checkpoint.

`write_contract_core(prepared, target, key, namespace)` completes the manifest with each program's
inputs and outputs (`layout.complete`), draws tiny random weights for every WEIGHT buffer (the host
table too), exports one `ContractProgram` per graph handle, and writes a signed core with a
byte-level tokenizer and a chat template derived from the contract (`assets`). The programs compute
the small model of `model`, so a test can compare served tokens with `model.ReferenceModel`.
`helios contract example-core` runs it on a contract file.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from safetensors.torch import save as save_safetensors

from helios.abi.program_image import encode_program
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.core.keys import SigningKey
from helios.core.records import ResourceKind
from helios.core.writer import CoreWriter
from helios.ignition.contract_core.assets import chat_template, tokenizer_json
from helios.ignition.contract_core.layout import ContractCoreError, complete  # noqa: F401 (re-exported)
from helios.ignition.contract_core.model import DRAFT_CODES, EMBED, HEAD, ReferenceModel
from helios.ignition.contract_core.programs import ContractProgram, ProgramLayout

M = mpb
_DTYPES = {
    M.DTYPE_FLOAT32: torch.float32, M.DTYPE_FLOAT16: torch.float16, M.DTYPE_BFLOAT16: torch.bfloat16,
    M.DTYPE_INT64: torch.int64, M.DTYPE_INT32: torch.int32, M.DTYPE_INT16: torch.int16, M.DTYPE_INT8: torch.int8,
    M.DTYPE_UINT8: torch.uint8, M.DTYPE_BOOL: torch.bool, M.DTYPE_UINT16: torch.uint16, M.DTYPE_UINT32: torch.uint32,
    M.DTYPE_FLOAT8_E4M3: torch.float8_e4m3fn, M.DTYPE_FLOAT8_E5M2: torch.float8_e5m2,
}
EXAMPLE_ROWS = 16  # load-extent dims in the example inputs (symbolic in the programs)
MAX_WEIGHT_BYTES = 256 << 20  # random weights are materialised: a full-size contract is refused


def weight_bytes(manifest: mpb.ExecutionManifest) -> int:
    total = 0
    for buffer in manifest.buffers:
        if buffer.role == M.BUFFER_ROLE_WEIGHT:
            count = 1
            for dim in buffer.shape:
                count *= dim.size
            total += count * _DTYPES[buffer.dtype].itemsize
    return total


def random_weights(manifest: mpb.ExecutionManifest, seed: int) -> dict[str, torch.Tensor]:
    """Buffer name -> a small random tensor of its declared dtype and shape."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for buffer in manifest.buffers:
        if buffer.role != M.BUFFER_ROLE_WEIGHT:
            continue
        shape = tuple(d.size for d in buffer.shape)
        dtype = _DTYPES[buffer.dtype]
        if dtype.is_floating_point:
            out[buffer.name] = torch.randn(shape, generator=g).to(dtype)
        else:
            out[buffer.name] = torch.randint(-8, 8, shape, generator=g).to(dtype)
    return out


def reference_model(weights: dict[str, torch.Tensor]) -> ReferenceModel:
    return ReferenceModel(weights[EMBED].to(torch.float32), weights[HEAD].to(torch.float32))


def export_program(layout: ProgramLayout, manifest: mpb.ExecutionManifest, weights: dict[str, torch.Tensor]):
    buffers = {b.name: b for b in manifest.buffers}
    args, shapes = [[weights[name] for name in layout.weights]], [[None] * len(layout.weights)]
    rows = torch.export.Dim("state_rows", min=2)
    pages = torch.export.Dim("pages", min=2)
    for name in layout.inputs:
        buffer = buffers[name]
        dims, dynamic = [], {}
        for axis, dim in enumerate(buffer.shape):
            if dim.WhichOneof("extent") == "load_extent":
                dims.append(EXAMPLE_ROWS)
                dynamic[axis] = rows if dim.load_extent == M.LOAD_EXTENT_STATE_ROWS else pages
            else:
                dims.append(dim.size)
        args.append(torch.zeros(dims, dtype=_DTYPES[buffer.dtype]))
        shapes.append(dynamic or None)
    module = ContractProgram(layout)
    grouped = (shapes[0], tuple(shapes[1:]))  # torch.export wants the ``*inputs`` shapes as one entry
    exported = torch.export.export(module, tuple(args), dynamic_shapes=grouped, strict=False)
    if not layout.outputs:  # returns nothing: its in-place writes become the graph's mutation outputs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            exported = exported.run_decompositions({})
    exported.example_inputs = None
    return exported


def write_contract_core(prepared: PreparedContract, target: Path, key: SigningKey, namespace: str,
                        seed: int = 0) -> dict[str, torch.Tensor]:
    """Writes the core (module docstring); returns the weights it drew."""
    contract_bytes, manifest_bytes = prepared.encode()
    contract = spb.ServingContract.FromString(contract_bytes)
    manifest = mpb.ExecutionManifest.FromString(manifest_bytes)
    nbytes = weight_bytes(manifest)
    if nbytes > MAX_WEIGHT_BYTES:
        raise ContractCoreError("manifest.buffers", f"the declared weights take {nbytes / 2**30:.1f} GiB; generated "
                                f"cores hold at most {MAX_WEIGHT_BYTES >> 20} MiB of random weights (use a contract "
                                "of small sizes, such as examples/contract-tiny.json)")
    layouts = complete(contract, manifest)
    weights = random_weights(manifest, seed)
    if DRAFT_CODES in weights:
        weights[DRAFT_CODES] = torch.randint(-8, 8, weights[DRAFT_CODES].shape,
                                             generator=torch.Generator().manual_seed(seed + 1)).to(torch.int8)
    writer = CoreWriter()
    resources: dict[str, dict[str, torch.Tensor]] = {}
    for buffer in manifest.buffers:
        if buffer.role == M.BUFFER_ROLE_WEIGHT:
            resources.setdefault(buffer.resource_id, {})[buffer.name] = weights[buffer.name]
    for resource_id, tensors in resources.items():
        writer.add_resource(resource_id, ResourceKind.WEIGHTS, save_safetensors(tensors), rank=0)
    for index, handle in enumerate(manifest.graph_handles):
        exported = export_program(layouts[index], manifest, weights)
        del handle.abi_operations[:]
        used = sorted(op for op in _ops(exported) if op.startswith("helios::"))
        handle.abi_operations.extend(used)
        writer.add_resource(handle.resource_id, ResourceKind.PROGRAM_IMAGE, encode_program(exported), rank=handle.rank)
    writer.add_resource("tokenizer.json", ResourceKind.TOKENIZER, tokenizer_json(contract))
    writer.add_resource("chat_template.jinja", ResourceKind.CHAT_TEMPLATE, chat_template(contract).encode("utf-8"))
    writer.set_contract(PreparedContract.from_messages(contract, manifest))
    writer.set_publisher(namespace)
    writer.add_signing_key(key)
    writer.write(target)
    return weights


def _ops(exported) -> set[str]:
    names = set()
    for node in exported.graph.nodes:
        if node.op == "call_function" and hasattr(node.target, "name"):
            name = node.target.name()
            names.add(name.split(".")[0])
    return names
