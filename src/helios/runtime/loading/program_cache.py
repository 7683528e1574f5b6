"""Deserialized programs kept for a later load of the same bytes in this process (off by default).

Torch's deserializer is most of a program's build on the CPU (`deserialize_program`: about 60% of
`load_program`, some 0.2 s per program of a tiny core). A process that loads the same programs
again (the test suite builds many runtimes of a few cores) may keep what it built:
`keep_deserialized_programs(limit)` keeps up to `limit` programs, the least recently used dropped
first; a serving process loads its core once and keeps nothing (the default, limit 0).

What is kept, keyed by the SHA-256 of the program image's bytes, is the ExportedProgram's graph
without any tensor: its nodes, their FakeTensor metadata, the signature and range constraints. A
load that finds it has already read and checked its image (`read_program_image`,
`validate_serialized_ops`) and still checks the program's ops (`validate_program_ops`), and gets
a copy bound to its own image's tensors: ``ExportedProgram.module()`` copies the graph into a new
module and registers this load's state dict and constants on it, so no module, graph or tensor a
runtime moves, rewrites or writes is shared. Programs whose graph reads attributes of its own
module (``get_attr`` nodes, submodules) or whose constants are not tensors are never kept.

Thread ownership: any loading thread (ranks load in parallel); the table is guarded by a lock.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections import OrderedDict

import torch

from helios.abi.program_image import ProgramImage, deserialize_program

__all__ = ["deserialized_program", "keep_deserialized_programs"]

_LOCK = threading.Lock()
_KEPT: OrderedDict[bytes, torch.export.ExportedProgram] = OrderedDict()
_LIMIT = 0


def keep_deserialized_programs(limit: int) -> int:
    """From now on keep up to `limit` deserialized programs in this process (0: none, and forget
    those kept); returns the limit it replaces."""
    global _LIMIT
    if limit < 0:
        raise ValueError(f"limit must not be negative, not {limit}")
    with _LOCK:
        previous, _LIMIT = _LIMIT, limit
        _trim()
    return previous


def deserialized_program(image: ProgramImage, data: bytes) -> torch.export.ExportedProgram:
    """The ExportedProgram of `image` (read and checked from `data`) bound to the image's own
    tensors: torch's deserializer, or a copy of the graph kept for the same bytes."""
    if _LIMIT == 0:
        return deserialize_program(image)
    key = hashlib.sha256(data).digest()
    with _LOCK:
        kept = _KEPT.get(key)
        if kept is not None:
            _KEPT.move_to_end(key)
    if kept is not None:
        return _bound(kept, image)
    exported = deserialize_program(image)
    if _shareable(exported):
        with _LOCK:
            _KEPT[key] = _bound(exported, None)
            _trim()
    return exported


def _trim() -> None:
    while len(_KEPT) > _LIMIT:
        _KEPT.popitem(last=False)


def _shareable(exported: torch.export.ExportedProgram) -> bool:
    """Whether a copy of `exported` rebound to other tensors shares nothing but read-only graph
    structure: its graph reads nothing from its module but placeholders, and its constants are tensors."""
    module = exported.graph_module
    return (not any(True for _ in module.children()) and all(node.op != "get_attr" for node in module.graph.nodes)
            and all(isinstance(value, torch.Tensor) for value in exported.constants.values()))


def _bound(exported: torch.export.ExportedProgram, image: ProgramImage | None) -> torch.export.ExportedProgram:
    """A shallow copy of `exported` holding `image`'s state dict and constants (none without an
    image): its parameters as parameters, as the deserializer takes them."""
    bound = copy.copy(exported)
    parameters = set(exported.graph_signature.parameters)
    state = {} if image is None else image.state_dict
    bound._state_dict = {name: torch.nn.Parameter(t, requires_grad=False) if name in parameters else t
                         for name, t in state.items()}
    bound._constants = {} if image is None else dict(image.constants)
    return bound
