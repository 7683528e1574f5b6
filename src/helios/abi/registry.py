"""The `helios` op namespace: argument checks shared by the ABI ops, and load-time op validation.

Every execution-ABI op is a `torch.library` op in the `helios` namespace (`helios.abi.op_library`),
registered with an explicit schema string (the ABI: a schema never changes once a core that uses it
exists). Programs are `torch.export` ExportedPrograms; before a runtime serves one it checks that
every `helios` op the program calls is declared by the core's manifest and registered in this
process with exactly the declared schema.

Op names are qualified as ``helios::NAME`` (``helios::NAME.OVERLOAD`` for a non-default overload),
and schema strings are ``str(FunctionSchema)``, for example
``helios::philox_uniform(Tensor seeds, Tensor counters, int offset) -> Tensor``.

Two entry points, used in this order by a loader:

- `validate_serialized_ops(graph, declared)` reads the op names from a stored program's JSON graph
  (`helios.abi.program_image`; nothing deserialized) so an unregistered op fails with a clear
  `LoadError` instead of torch's generic deserialization error;
- `validate_program_ops(program, declared)` walks the loaded ExportedProgram's graphs (subgraphs
  and ops passed to higher-order ops such as ``auto_functionalized`` included).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import torch

from helios.abi.program_graph import graph_targets
from helios.errors import ExecutionError, LoadError

NAMESPACE = "helios"

_SERIALIZED_TARGET = re.compile(r"^torch\.ops\.helios\.(\w+)\.(\w+)$")


class AbiArgumentError(ExecutionError, ValueError):
    """An ABI op was called with a tensor of the wrong dtype, rank or shape (a program bug)."""


class ProgramOpError(LoadError):
    """A program uses a `helios` op this runtime cannot serve. `op` is the qualified op name."""

    def __init__(self, op: str, message: str):
        self.op = op
        super().__init__(f"{op}: {message}")


class UndeclaredOpError(ProgramOpError):
    """The program calls a `helios` op that the manifest does not declare."""


class UnregisteredOpError(ProgramOpError):
    """The program calls a `helios` op that is not registered in this process."""


class SchemaMismatchError(ProgramOpError):
    """The op's registered (or recorded) schema differs from the declared schema string."""


class UnreadableProgramError(LoadError):
    """A stored program is not a program image this runtime reads, or torch cannot build it."""


def check_tensor(op: str, name: str, tensor: object, dtype: torch.dtype,
                 shape: Sequence[int | None]) -> None:
    """Raise `AbiArgumentError` unless `tensor` has `dtype` and `shape` (None matches any extent).

    Checks only metadata, so it is safe on fake tensors and never synchronises a device.
    """
    if not isinstance(tensor, torch.Tensor):
        raise AbiArgumentError(f"{op}: {name} must be a Tensor, got {type(tensor).__name__}")
    actual = tuple(tensor.shape)
    if tensor.dtype == dtype and actual == shape:  # the common case, decided without a loop
        return
    fits = len(actual) == len(shape) and all(e is None or e == a for e, a in zip(shape, actual))
    if tensor.dtype != dtype or not fits:
        wanted = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise AbiArgumentError(
            f"{op}: {name} must be {dtype} {wanted}, got {tensor.dtype} {list(actual)}")


def check_same_device(op: str, tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise `AbiArgumentError` unless all `tensors` live on one device."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name}={device}" for name, device in devices.items())
        raise AbiArgumentError(f"{op}: tensors must share one device, got {listing}")


_CPU_BODIES: dict[str, Callable] = {}


def register_cpu_body(op: str, body: Callable) -> None:
    """Records the Python function that `op` (``helios::NAME``) runs on the CPU, so a loader may call
    it without the dispatcher (`helios.runtime.loading.cpu_programs`); `helios.abi.op_library`
    records every op's body."""
    _CPU_BODIES[op] = body


def cpu_body(op: str) -> Callable | None:
    """The CPU body recorded for `op` by `register_cpu_body`, if any."""
    return _CPU_BODIES.get(op)


def qualified_name(schema: torch._C.FunctionSchema) -> str:
    """``helios::NAME`` or ``helios::NAME.OVERLOAD`` for a schema."""
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def registered_schemas() -> dict[str, str]:
    """Every op currently registered in the `helios` namespace: qualified name -> schema string."""
    return {
        qualified_name(schema): str(schema)
        for schema in torch._C._jit_get_all_schemas()
        if schema.name.startswith(NAMESPACE + "::")
    }


def program_ops(program: torch.export.ExportedProgram) -> dict[str, str]:
    """The `helios` ops a program calls: qualified name -> schema recorded in the program's graph."""
    found: dict[str, str] = {}
    for graph_module in program.graph_module.modules():
        graph = getattr(graph_module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            for target in _operators(node):
                if target.namespace == NAMESPACE:
                    found[qualified_name(target._schema)] = str(target._schema)
    return found


def _operators(node: torch.fx.Node) -> Iterator[torch._ops.OpOverload]:
    """The node's target and any op passed as an argument (higher-order ops wrap custom ops)."""
    candidates: list[object] = [node.target]
    torch.fx.node.map_aggregate((node.args, node.kwargs), candidates.append)
    for candidate in candidates:
        if isinstance(candidate, torch._ops.OpOverload):
            yield candidate


def validate_program_ops(program: torch.export.ExportedProgram, declared: Mapping[str, str],
                         registered: Mapping[str, str] | None = None) -> None:
    """Check every `helios` op of `program` against `declared` (qualified name -> schema string).
    `registered`: `registered_schemas()` when the caller already listed them (a loader checking
    many programs lists them once; about 30 ms each time), else listed here.

    Raises `UndeclaredOpError`, `UnregisteredOpError` or `SchemaMismatchError` naming the first
    offending op in name order. Declared ops the program does not use are allowed.
    """
    registered = registered_schemas() if registered is None else registered
    for op, recorded in sorted(program_ops(program).items()):
        _check_op(op, declared, registered)
        if recorded != declared[op]:
            raise SchemaMismatchError(
                op, f"program was exported with schema {recorded!r}, declared {declared[op]!r}")


def _check_op(op: str, declared: Mapping[str, str], registered: Mapping[str, str]) -> None:
    if op not in declared:
        raise UndeclaredOpError(op, "the program uses this op but the manifest does not declare it")
    if op not in registered:
        raise UnregisteredOpError(op, "op is not registered in this runtime")
    if registered[op] != declared[op]:
        raise SchemaMismatchError(
            op, f"registered schema {registered[op]!r} differs from declared {declared[op]!r}")


def serialized_program_ops(program) -> frozenset[str]:
    """The `helios` ops named in a stored program (program image bytes, a read `ProgramImage`, or the
    parsed graph JSON of one), read from its JSON graph only: nothing is unpickled or built.

    Raises `UnreadableProgramError` (or a subclass) for bytes that are not a program image."""
    from helios.abi.program_image import ProgramImage, read_program_image  # program images use this module

    if isinstance(program, (bytes, bytearray, memoryview)):
        program = read_program_image(bytes(program))
    targets = program.targets if isinstance(program, ProgramImage) else graph_targets(program)
    return frozenset(_helios_ops(targets))


def _helios_ops(targets: Iterable[str]) -> Iterable[str]:
    for target in targets:
        match = _SERIALIZED_TARGET.match(target)
        if match:
            name, overload = match.groups()
            suffix = "" if overload == "default" else f".{overload}"
            yield f"{NAMESPACE}::{name}{suffix}"


def validate_serialized_ops(program, declared: Mapping[str, str],
                            registered: Mapping[str, str] | None = None) -> None:
    """Pre-load check of a stored program (as `serialized_program_ops` takes it): each `helios` op
    it names is declared and registered with the declared schema (`registered` as for
    `validate_program_ops`). Raises the same errors as `validate_program_ops`."""
    registered = registered_schemas() if registered is None else registered
    for op in sorted(serialized_program_ops(program)):
        _check_op(op, declared, registered)
