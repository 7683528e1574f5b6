"""Tuned-binding rules (specification: GraphContract.tuned_bindings).

A tuned binding names a persistent buffer and its producer. The producer must be in the
manifest's separate tuning catalog with that buffer among its outputs (the physical execution
descriptor, matched exactly), and the buffer may not overlap request inputs, writable graph
state or cache storage.
"""

from __future__ import annotations

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.index import ContractIndex
from helios.contract.rules import fail, graph_path, require, role_label

WRITES = frozenset({spb.ACCESS_MODE_WRITE, spb.ACCESS_MODE_READ_WRITE})


def written_state_buffers(model: spb.ModelContract, index: ContractIndex) -> dict[str, str]:
    """Buffers some graph writes through a state view, mapped to one writing graph's name."""
    written: dict[str, str] = {}
    for graph in model.graphs:
        for access in graph.state_accesses:
            view = index.state_views.get(access.view)
            if view is not None and access.mode in WRITES:
                written.setdefault(view.message.buffer, graph.name)
    return written


def check_tuned_bindings(model: spb.ModelContract, manifest: mpb.ExecutionManifest, index: ContractIndex) -> None:
    inputs = {d.buffer: d.name for d in manifest.destinations}
    written = written_state_buffers(model, index)
    for i, graph in enumerate(model.graphs):
        for j, tuned in enumerate(graph.tuned_bindings):
            path = f"{graph_path(i)}.tuned_bindings[{j}]"
            producer = index.tuning_catalog.get(tuned.producer)
            require(
                producer is not None,
                f"{path}.producer",
                f"producer {tuned.producer!r} is missing from the tuning catalog",
            )
            require(
                tuned.buffer in producer.message.outputs,
                f"{path}.buffer",
                f"{tuned.buffer!r} is not an output of producer {tuned.producer!r} in the tuning catalog",
            )
            _check_overlap(tuned.buffer, f"{path}.buffer", index, inputs, written)
    for name, entry in index.tuning_catalog.items():
        for j, output in enumerate(entry.message.outputs):
            _check_overlap(output, f"{entry.path}.outputs[{j}]", index, inputs, written)


def _check_overlap(name: str, path: str, index: ContractIndex, inputs: dict, written: dict) -> None:
    buffer = index.buffers[name].message
    if buffer.role == mpb.BUFFER_ROLE_INPUT or name in inputs:
        fail(path, f"tuned buffer {name!r} overlaps request inputs")
    if buffer.role == mpb.BUFFER_ROLE_CACHE_STORAGE:
        fail(path, f"tuned buffer {name!r} overlaps cache storage")
    require(
        buffer.role == mpb.BUFFER_ROLE_PERSISTENT_STATE,
        path,
        f"tuned buffers are persistent state, not {role_label(buffer.role)}",
    )
    if name in written:
        fail(path, f"tuned buffer {name!r} overlaps writable graph state (graph {written[name]!r} writes it)")
