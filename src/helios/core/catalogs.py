"""The optional rebuild manifest and per-rank weight catalogs, as immutable records.

They describe preparation inputs and stored tensor views and select no serving behavior. A
catalog or manifest whose version this runtime does not know is ignored (counted, never an
error), so newer preparers can add catalog versions without changing what older runtimes serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from helios.contract import core_pb2

KNOWN_REBUILD_VERSION = 1
KNOWN_CATALOG_VERSION = 1


@dataclass(frozen=True)
class RebuildInput:
    path: str
    nbytes: int
    sha256: bytes


@dataclass(frozen=True)
class RebuildManifest:
    """What preparation consumed. `version` is always a known version."""

    recipe: str
    preparer: str
    inputs: tuple[RebuildInput, ...]
    version: int = KNOWN_REBUILD_VERSION

    def to_proto(self) -> core_pb2.RebuildManifest:
        return core_pb2.RebuildManifest(
            version=self.version,
            recipe=self.recipe,
            preparer=self.preparer,
            inputs=[core_pb2.RebuildInput(path=i.path, nbytes=i.nbytes, sha256=i.sha256)
                    for i in self.inputs],
        )


@dataclass(frozen=True)
class TensorView:
    """One tensor in a decoded weights resource; `dtype` is a `helios.contract.Dtype` number."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    byte_offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightCatalog:
    rank: int
    resource_id: str
    tensors: tuple[TensorView, ...]
    version: int = KNOWN_CATALOG_VERSION

    def to_proto(self) -> core_pb2.WeightCatalog:
        return core_pb2.WeightCatalog(
            version=self.version,
            rank=self.rank,
            resource_id=self.resource_id,
            tensors=[core_pb2.TensorView(name=t.name, dtype=t.dtype, shape=t.shape,
                                         byte_offset=t.byte_offset, nbytes=t.nbytes)
                     for t in self.tensors],
        )


def read_rebuild(message: core_pb2.RebuildManifest | None) -> RebuildManifest | None:
    """The rebuild manifest, or None when absent or of an unknown version."""
    if message is None or message.version != KNOWN_REBUILD_VERSION:
        return None
    inputs = tuple(RebuildInput(i.path, i.nbytes, bytes(i.sha256)) for i in message.inputs)
    return RebuildManifest(message.recipe, message.preparer, inputs)


def read_catalogs(
    messages: Iterable[core_pb2.WeightCatalog],
) -> tuple[tuple[WeightCatalog, ...], int]:
    """(catalogs of known versions, number of catalogs ignored for an unknown version)."""
    known, ignored = [], 0
    for message in messages:
        if message.version != KNOWN_CATALOG_VERSION:
            ignored += 1
            continue
        tensors = tuple(
            TensorView(t.name, t.dtype, tuple(t.shape), t.byte_offset, t.nbytes)
            for t in message.tensors
        )
        known.append(WeightCatalog(message.rank, message.resource_id, tensors))
    return tuple(known), ignored
