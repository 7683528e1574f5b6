"""Program images: a torch.export ExportedProgram stored as data, loaded without unpickling.

A core's program resource (`RESOURCE_KIND_PROGRAM_IMAGE`) is an encoded `ProgramImage` message
(`proto/helios/contract/core.proto`): the program graph's JSON serialization
(``torch._export.serde``) plus its state dict and tensor constants as safetensors files. Loading
one parses protobuf, JSON and safetensors only, checks the graph (`helios.abi.program_graph`:
targets, symbolic expressions, no guard code or custom objects) and then has torch build the
ExportedProgram from the checked JSON and the already-decoded tensors, so torch's deserializer
never reaches ``torch.load``. A signed core is data, never code, whoever signed it.

``torch.export.save`` archives (the older `RESOURCE_KIND_PROGRAM`) unpickle on load; the runtime
refuses them with `PickledProgramError` and the core has to be prepared again.

`encode_program` writes an image (preparation); `read_program_image` parses and checks one without
building anything; `deserialize_program` builds the ExportedProgram; `decode_program` does both.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import threading
import types
import typing
from dataclasses import dataclass
from typing import Mapping

import safetensors
import safetensors.torch
import torch
from google.protobuf.message import DecodeError

from helios.abi.program_graph import ForbiddenProgramError, check_program_graph
from helios.abi.registry import UnreadableProgramError
from helios.contract import core_pb2
from helios.errors import LoadError

PROGRAM_IMAGE_VERSION = 1

__all__ = [
    "ForbiddenProgramError", "PickledProgramError", "ProgramEncodingError", "ProgramImage", "UnreadableProgramError",
    "decode_program", "deserialize_program", "encode_program", "read_program_image",
]


class PickledProgramError(LoadError):
    """The core stores a program as a ``torch.export.save`` archive, whose loading unpickles (runs
    code chosen by whoever wrote the core); the runtime loads program images only."""


class ProgramEncodingError(ValueError):
    """An ExportedProgram holds something a program image cannot store (a non-tensor constant)."""


@dataclass(frozen=True)
class ProgramImage:
    """A parsed and checked program image; nothing in it has been deserialized by torch yet."""

    graph: dict  # the checked JSON of the ExportedProgram
    state_dict: Mapping[str, torch.Tensor]
    constants: Mapping[str, torch.Tensor]
    targets: frozenset[str] = frozenset()  # the operator names the graph calls (found by the check)


def encode_program(program: torch.export.ExportedProgram) -> bytes:
    """The `ProgramImage` bytes of `program`, without example inputs, node metadata or guard code."""
    state = {name: _tensor(name, value) for name, value in program.state_dict.items()}
    constants = {name: _tensor(name, value) for name, value in program.constants.items()}
    graph = _serialized_graph(program)
    for _, node in _nodes(graph):
        node["metadata"] = {}  # stack traces and module paths of the preparing machine
    graph["guards_code"] = []  # Python source; the runtime fixes shapes itself (see helios.runtime.loading.model)
    image = core_pb2.ProgramImage(
        version=PROGRAM_IMAGE_VERSION,
        exported_program=json.dumps(graph, separators=(",", ":")).encode("utf-8"),
        state_dict=safetensors.torch.save(state) if state else b"",
        constants=safetensors.torch.save(constants) if constants else b"",
    )
    return image.SerializeToString(deterministic=True)


_SERIALIZING = threading.Lock()


def _serialized_graph(program: torch.export.ExportedProgram) -> dict:
    """torch's serialized ExportedProgram JSON of `program`, parsed. torch's serializer also builds the
    graph's canonical form (on a deep copy of the whole serialized graph: two thirds of its time) only to
    drop it, and pickles the tensors, which the image stores as safetensors: both are skipped here; the
    JSON is the same. The lock keeps the skip to this call (torch's own `canonicalize` stays for others)."""
    from torch._export.serde import serialize as serde

    # torch 2.13 can skip pickling the tensors; torch 2.11's serialize takes no such arguments
    skipped = {name: False for name in _SKIPPABLE if name in inspect.signature(serde.serialize).parameters}
    with _SERIALIZING:
        canonicalize = serde.canonicalize
        serde.canonicalize = _unchanged
        try:
            artifact = serde.serialize(program, **skipped)
        finally:
            serde.canonicalize = canonicalize
    return json.loads(artifact.exported_program)


_SKIPPABLE = ("serialize_state_dict", "serialize_constants", "serialize_example_inputs")


def _unchanged(program, constants=None):
    return program


def read_program_image(data: bytes) -> ProgramImage:
    """Parse and check an encoded image. Raises `UnreadableProgramError` for bytes that are not an
    image of a known version (`PickledProgramError` for a ``torch.export.save`` archive) and
    `ForbiddenProgramError` for a graph that holds what an image may not."""
    if data[:2] == b"PK":  # a zip archive: what torch.export.save writes
        raise PickledProgramError("the program is a torch.export.save archive, which loading would unpickle")
    try:
        message = core_pb2.ProgramImage.FromString(data)
    except (DecodeError, RecursionError) as error:
        raise UnreadableProgramError(f"the program is not a program image: {error}") from None
    if message.version != PROGRAM_IMAGE_VERSION:
        raise UnreadableProgramError(
            f"program image version {message.version}; this runtime reads version {PROGRAM_IMAGE_VERSION}")
    try:
        graph = json.loads(message.exported_program)
    except (ValueError, RecursionError) as error:
        raise UnreadableProgramError(f"the program graph is not JSON: {error}") from None
    targets = check_program_graph(graph)
    return ProgramImage(graph, _tensors(message.state_dict, "state dict"), _tensors(message.constants, "constants"),
                        targets)


_DESERIALIZING = threading.Lock()


def deserialize_program(image: ProgramImage) -> torch.export.ExportedProgram:
    """Build the ExportedProgram of a checked image (torch's deserializer, given the schema objects
    and the already decoded tensors, so it never reaches ``torch.load``). Raises
    `UnreadableProgramError` when torch cannot build it."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer

    parameters = _parameter_names(image.graph)
    state = {name: torch.nn.Parameter(t, requires_grad=False) if name in parameters else t
             for name, t in image.state_dict.items()}
    try:
        serialized = schema_object(schema.ExportedProgram, image.graph)
        with _DESERIALIZING:  # torch's deserializer keeps process-global state (ranks load in parallel)
            return ExportedProgramDeserializer().deserialize(serialized, state, dict(image.constants), b"")
    except Exception as error:  # torch's deserializer raises many types for malformed graphs
        raise UnreadableProgramError(f"torch cannot build the program: {type(error).__name__}: {error}") from None


def schema_object(cls, data):
    """The torch.export serde schema object of parsed JSON: what torch's ``_dict_to_dataclass``
    returns, through one converter per schema type built once (type hints resolved and the type's
    shape dispatched at build, not at every object: that was most of a program's load time)."""
    return _converter(cls)(data)


_CONVERTERS: dict = {}  # schema type (class, typing form, forward reference or name) -> converter


def _converter(cls):
    """The cached converter of `cls`. Built without recursing into field types (schema types refer
    to themselves), which are looked up on first use."""
    converter = _CONVERTERS.get(cls)
    if converter is None:
        converter = _CONVERTERS[cls] = _build_converter(cls)
    return converter


def _build_converter(cls):
    from torch._export.serde import schema
    from torch._export.serde.union import _Union

    if isinstance(cls, str):
        cls = getattr(schema, cls, cls)
    elif isinstance(cls, typing.ForwardRef):
        return _lazy(lambda: _converter(cls.__forward_arg__))
    if isinstance(cls, str):
        raise TypeError(f"unresolved schema type {cls!r}")
    origin = typing.get_origin(cls)
    if origin is typing.Annotated:
        return _lazy(lambda: _converter(cls.__origin__))
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        (inner,) = [arg for arg in typing.get_args(cls) if arg is not type(None)]
        return _optional(inner)
    if isinstance(cls, type) and issubclass(cls, _Union):
        return _union(cls)
    if dataclasses.is_dataclass(cls):
        return _record(cls)
    if cls is float:
        return _number
    return _container(cls)


def _lazy(resolve):
    """A converter that resolves its target converter on first use."""
    target = []

    def convert(data):
        if not target:
            target.append(resolve())
        return target[0](data)
    return convert


def _optional(inner):
    inner_converter = _lazy(lambda: _converter(inner))
    return lambda data: None if data is None else inner_converter(data)


def _union(cls):
    """What ``cls.create(tag=value)`` builds (every other field None, the tag recorded), without
    its per-object ``dataclasses.fields`` calls (a third of a program's schema conversion)."""
    try:
        from torch._export.serde.union import _UnionTag
    except ImportError:  # a torch without the tag type: its own constructor
        _UnionTag = None

    hints = _type_hints(cls)
    empty = dict.fromkeys(f.name for f in dataclasses.fields(cls))
    tags: dict = {}  # tag -> its value's converter, filled on first use

    def convert(data):
        if not isinstance(data, dict) or len(data) != 1:
            raise TypeError(f"a {cls.__name__} is an object with one field, got {data!r:.80}")
        ((tag, value),) = data.items()
        field = tags.get(tag)
        if field is None:
            if tag not in empty:
                raise TypeError(f"{tag!r} is not a field of {cls.__name__}")
            field = tags[tag] = _converter(hints[tag])
        if _UnionTag is None:
            return cls.create(**{tag: field(value)})
        union = object.__new__(cls)
        state = union.__dict__
        state.update(empty)
        state[tag] = field(value)
        state["_type"] = _UnionTag.create(tag, cls)
        return union
    return convert


def _record(cls):
    hints = _type_hints(cls)
    names = tuple(f.name for f in dataclasses.fields(cls))
    fields = []

    def convert(data):
        if not fields:  # filled whole in one step: a thread loading beside this one never reads part of it
            fields[:] = [(name, _converter(hints[name])) for name in names]
        return cls(**{name: field(data[name]) for name, field in fields if name in data})
    return convert


def _number(data):
    return float(data)


def _container(cls):
    """Lists and dicts convert their items by the type's argument; anything else passes as is."""
    arguments = typing.get_args(cls)
    items = []  # the item (list) or value (dict) converter, resolved on first use

    def convert(data):
        if isinstance(data, list):
            if not data:
                return data
            if not items:
                items.append(_converter(arguments[0]))
            item = items[0]
            return [item(value) for value in data]
        if isinstance(data, dict):
            if not items:
                items.append(_converter(arguments[1]))
            value_converter = items[0]
            return {key: value_converter(value) for key, value in data.items()}
        return data
    return convert


@functools.lru_cache(maxsize=None)
def _type_hints(cls) -> dict:
    from torch._export.serde import schema

    return typing.get_type_hints(cls, globalns=vars(schema))


def decode_program(data: bytes) -> torch.export.ExportedProgram:
    """`read_program_image` then `deserialize_program`."""
    return deserialize_program(read_program_image(data))


def _tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ProgramEncodingError(f"constant {name!r} is a {type(value).__name__}; a program image stores tensors only")
    return value.detach().contiguous().clone()


def _tensors(data: bytes, what: str) -> dict[str, torch.Tensor]:
    if not data:
        return {}
    try:
        return safetensors.torch.load(data)
    except (safetensors.SafetensorError, ValueError, TypeError) as error:
        raise UnreadableProgramError(f"the program's {what} is not a safetensors file: {error}") from None


def _nodes(graph: dict):
    """(graph, node) for the nodes of the top-level graph and of every nested subgraph."""
    stack = [graph["graph_module"]["graph"]]
    while stack:
        current = stack.pop()
        for node in current.get("nodes", ()):
            yield current, node
            for argument in node.get("inputs", ()):
                value = argument.get("arg", {})
                if isinstance(value, dict) and "as_graph" in value:
                    stack.append(value["as_graph"]["graph"])


def _parameter_names(graph: dict) -> set[str]:
    specs = graph.get("graph_module", {}).get("signature", {}).get("input_specs", ())
    return {spec["parameter"]["parameter_name"] for spec in specs
            if isinstance(spec, dict) and isinstance(spec.get("parameter"), dict)}
