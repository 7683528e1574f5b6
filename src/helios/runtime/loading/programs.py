"""One selected program of a verified core, from its stored image to a callable module.

`load_program` checks the image (`helios.abi.program_image`: graph JSON plus safetensors, nothing
unpickled; a core with pickled ``torch.export.save`` programs fails with `PickledProgramError`),
checks that its graph calls nothing but allowed ops and that every ABI op it names is declared in
the manifest and registered here with exactly the declared schema, builds it, checks again, and
returns the unlifted module on the serving device. Off the CPU a serving program's module is built
straight from its checked graph JSON (`helios.runtime.loading.graph_image`: the same nodes as
torch's path, about a tenth of its time, and no import of torch._dynamo, which torch's deserializer
pulls in: 4-6.6 s on the device's host); otherwise, and for what that builder leaves to torch, the
build skips work whose result the runtime never reads (`helios.runtime.loading.program_build`: one code generation per program instead of
about six, FakeTensor metadata built directly, torch's export verifier not run again, a device
move of what a call reads), and a process that keeps deserialized programs (`program_cache`, off
unless asked for) deserializes the same bytes once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from helios.abi.program_image import PickledProgramError, read_program_image
from helios.abi.registry import validate_program_ops, validate_serialized_ops
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract.views import TOKEN_LOGPROB_OUTPUTS
from helios.core.records import ResourceKind
from helios.errors import LoadError
from helios.runtime.loading.cpu_programs import cpu_program
from helios.runtime.loading.graph_image import NotDirect, build_module
from helios.runtime.loading.graph_passes import drop_no_op_nodes
from helios.runtime.loading.program_build import (
    code_on_first_use, deferred_recompile, finish_recompile, move_module, skip_export_verifier, static_tensor_metas,
)
from helios.runtime.loading.program_cache import deserialized_program
from helios.runtime.loading.speculation import SpeculativeShape, speculative_shape

__all__ = ["DeclaredOps", "LoadedProgram", "MissingVariantError", "PickledProgramError", "load_program"]


class MissingVariantError(LoadError):
    """The contract needs a graph or capacity variant that has no loadable program."""


@dataclass(frozen=True)
class LoadedProgram:
    """One selected program: graph name, operation, capacities, callable and its I/O buffers."""

    graph: str
    operation: int
    batch_capacity: int
    packed_token_capacity: int
    module: torch.nn.Module
    weights: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_shapes: tuple[tuple[int | None, ...], ...]  # static extents per input; None where symbolic
    speculative: SpeculativeShape | None = None  # W, D, lane limit, length source (SPECULATIVE only)
    token_logprobs: int = 0  # alternatives per row of a token-logprobs variant (0: a plain program)
    returns_token_logprobs: bool = False  # its outputs include TOKEN_LOGPROB_OUTPUTS (variants, scored prefill)


class DeclaredOps(NamedTuple):
    """The manifest's ABI ops (name -> schema) and this process's registered `helios` ops."""

    schemas: dict[str, str]
    registered: dict[str, str]


def load_program(core, prepared: PreparedContract, handle: mpb.GraphHandle, declared: DeclaredOps,
                 device: torch.device, lazy_code: bool = False) -> LoadedProgram:
    """The handle's program, checked and built on `device` (see the module docstring). `lazy_code`
    (off the CPU): the module's Python code is generated when it is first called or read
    (`program_build.code_on_first_use`), for a program that CUDA graphs capture from copies."""
    graph = prepared.graphs[handle.graph]
    if graph.token_logprobs and not set(TOKEN_LOGPROB_OUTPUTS) <= set(handle.program_outputs):
        raise MissingVariantError(f"graph {handle.graph!r} is a token-logprobs variant whose program does not "
                                  f"return {', '.join(TOKEN_LOGPROB_OUTPUTS)}")
    names = set(handle.abi_operations)
    ops = {name: schema for name, schema in declared.schemas.items() if name in names}
    data = _program_bytes(core, handle.resource_id)
    image = read_program_image(data)
    validate_serialized_ops(image, ops, declared.registered)  # the names the image's check found
    num_weights = len(graph.resource_dependencies)
    with deferred_recompile():
        built = _direct(image, ops, declared, num_weights) if device.type != "cpu" else None
        if built is None:
            built = _with_torch(image, data, ops, declared, num_weights)
        module, input_shapes = built
        drop_no_op_nodes(module)
        # Programs are captured on the CPU: parameters, constants and burnt-in devices move.
        module = move_module(module, device)
    # Shapes are fixed here once (input_shapes) and every call passes buffers narrowed to them, so
    # the per-call pytree/shape re-validation (several ms per step on the CPU) is redundant.
    module.validate_inputs = False
    if device.type == "cpu":  # direct ABI kernels and flat calls: the same values, less overhead per op
        module = cpu_program(module)  # generates its modules' code itself, once each
    if isinstance(module, torch.nn.Module):
        lazy = lazy_code and device.type != "cpu" and isinstance(module, torch.fx.GraphModule)
        module = code_on_first_use(module) if lazy else finish_recompile(module)
    return LoadedProgram(
        graph=handle.graph, operation=graph.operation, batch_capacity=handle.capacity.batch_capacity,
        packed_token_capacity=handle.capacity.packed_token_capacity, module=module,
        weights=tuple(graph.resource_dependencies), inputs=tuple(handle.program_inputs),
        outputs=tuple(handle.program_outputs), input_shapes=input_shapes,
        speculative=speculative_shape(prepared, handle), token_logprobs=graph.token_logprobs,
        returns_token_logprobs=set(TOKEN_LOGPROB_OUTPUTS) <= set(handle.program_outputs),
    )


def _direct(image, ops: dict, declared: DeclaredOps, num_weights: int):
    """(module, input extents) built straight from the graph JSON (`graph_image`), or None when the
    image holds what that builder leaves to torch. Used off the CPU only: the CPU rewrites read the
    FakeTensor shapes only torch's path records for symbolic dims."""
    try:
        direct = build_module(image.graph, image.state_dict, image.constants)
    except NotDirect:
        return None
    validate_program_ops(_AsProgram(direct.module), ops, declared.registered)
    return direct.module, direct.input_shapes[num_weights:]


def _with_torch(image, data: bytes, ops: dict, declared: DeclaredOps, num_weights: int):
    """(module, input extents) through torch's deserializer (or the graph it built for the same
    bytes before: `program_cache`) and ``ExportedProgram.module()``."""
    with static_tensor_metas(), skip_export_verifier():
        exported = deserialized_program(image, data)
    validate_program_ops(exported, ops, declared.registered)
    return exported.module(), _input_shapes(exported, num_weights)


class _AsProgram(NamedTuple):
    """What `validate_program_ops` reads of an ExportedProgram: its graph module."""

    graph_module: torch.nn.Module


def _program_bytes(core, resource_id: str) -> bytes:
    """A program resource's bytes; a program stored the pickled way is refused by its signed kind."""
    kind = core.resource(resource_id).kind
    if kind is not ResourceKind.PROGRAM_IMAGE:
        raise PickledProgramError(
            f"program {resource_id!r} is stored as a torch.export.save archive ({kind.name} resource), which "
            "loading would unpickle, running code from the core; prepare the core again with this version of "
            "helios (`helios prepare`), which stores programs as data")
    return core.read_resource(resource_id)


def _input_shapes(exported, num_weights: int) -> tuple[tuple[int | None, ...], ...]:
    """Static extents of the user inputs after the weight list (symbolic dims are None)."""
    shapes = []
    specs = [s for s in exported.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    placeholders = {node.name: node for node in exported.graph.nodes if node.op == "placeholder"}
    for spec in specs[num_weights:]:
        value = placeholders[spec.arg.name].meta.get("val")
        shapes.append(tuple(int(d) if isinstance(d, int) else None for d in value.shape))
    return tuple(shapes)
