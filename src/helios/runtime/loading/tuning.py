"""Startup tuning at load: which producers the selected serving graphs need, and running them.

A serving graph's ``tuned_bindings`` name persistent buffers and the TUNING graph (a producer in the
manifest's tuning catalog) that fills them. `load_model` loads each required producer like a serving
program (same op validation), runs it once, eagerly, after buffers are allocated and before any
CUDA graph is captured or the model is returned; the choice of values is the producer's program
logic, never the host's. A missing or failing producer fails startup.

Ownership: nothing here keeps state; producers write only their catalog outputs, in place.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.errors import LoadError


class TuningProducerError(LoadError):
    """A startup tuning producer a selected serving graph depends on is missing or failed."""


class MissingProducerError(TuningProducerError):
    """The manifest lacks a required producer (tuning catalog entry, output, or this rank's handle)."""


class ProducerFailedError(TuningProducerError):
    """A required producer raised while running at startup."""


def required_producers(prepared: PreparedContract, graphs: Iterable[str]) -> list[str]:
    """The producers the serving `graphs` depend on, in first-use order (each once)."""
    catalog = {entry.graph: entry for entry in prepared.manifest.tuning_catalog}
    needed: list[str] = []
    for name in graphs:
        for buffer, producer in prepared.graphs[name].tuned_buffers.items():
            entry = catalog.get(producer)
            if entry is None:
                raise MissingProducerError(
                    f"graph {name!r} needs producer {producer!r}, which is not in the tuning catalog")
            if buffer not in entry.outputs:
                raise MissingProducerError(f"graph {name!r} needs {buffer!r} from {producer!r}, which does not output it")
            if producer not in needed:
                needed.append(producer)
    return needed


def producer_handles(prepared: PreparedContract, graphs: Iterable[str], rank: int) -> list[mpb.GraphHandle]:
    """This rank's handle of every producer the serving `graphs` need (one variant each)."""
    handles = []
    for producer in required_producers(prepared, graphs):
        mine = [h for h in prepared.manifest.graph_handles if h.graph == producer and h.rank == rank]
        if not mine:
            raise MissingProducerError(f"producer {producer!r} has no program on rank {rank}")
        handles.append(mine[0])
    return handles


def run_producers(producers: Sequence, arguments: Callable[[object], list]) -> None:
    """Run each loaded producer once with `arguments(producer)`; a failure is a ProducerFailedError."""
    for producer in producers:
        try:
            producer.module(*arguments(producer))
        except Exception as error:  # any failure of a producer program fails startup, typed
            raise ProducerFailedError(f"startup tuning producer {producer.graph!r} failed: {error}") from error

