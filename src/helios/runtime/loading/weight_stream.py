"""Decoding a safetensors weights resource straight into the tensors that serve it.

`load_safetensors_stream` reads the verified, decoded stream of one weights resource (see
`helios.core.reader.Core.open_resource`) once, front to back: the safetensors header first, which
is checked completely (known dtypes, sizes that fit the shapes, tensors that tile the data exactly
and end where the resource ends) and against the manifest's declared dtype and shape *before* any
tensor byte is read; then each tensor's bytes in file order, decoded directly into the memory of
its destination:

- on the CPU, a fresh tensor per weight, filled in place (no bytes object, no second copy);
- on a CUDA device, through `StagedCopier`: a small ring of pinned host buffers, each copied to the
  device asynchronously while the next is decoded, so the H2D copy overlaps zstd decoding.

`load_weight_resources` decodes several weights resources (a model's weights are cut into parts of
about `helios.ignition.sharding.WEIGHT_PART_NBYTES`) side by side on a few threads, one frame per
thread, each with its own staging ring: one zstd frame decodes on one core, so a single resource
caps load at one core's decode rate.

Tensors the manifest does not name are decoded into a scratch buffer and dropped (every byte is
still verified). After the last tensor the stream is read to its end, so the frame's final checks
(decoded length, end of frame, checksum) run before any tensor is returned. Peak host memory is the
CPU weights themselves (one copy), or the staging ring for a device: never the whole resource twice.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Callable, Mapping, NamedTuple

import torch

from helios.core.streams import expect_end, read_exact_into
from helios.errors import LoadError

MAX_HEADER_NBYTES = 100 * 1024 * 1024  # safetensors' own limit
_SCRATCH_NBYTES = 4 * 1024 * 1024
# Each weight thread's pinned ring: 14 threads' 3 x 32 MB take 1.5 s of cudaHostAlloc on the H200 host and
# stall another thread's CUDA calls meanwhile (bench/pinned_alloc.py). Neither smaller rings (2 x 8 MB, 3 x 4 MB)
# nor registering ordinary memory (cudaHostRegister: 0.56 s, short stalls) made the load faster: the rings are
# made while the loading thread builds programs, before its dry run (bench/results/h200_session44_call3, _call4).
STAGING_SLOT_NBYTES = 32 * 1024 * 1024  # each pinned buffer of a `StagedCopier`'s ring
STAGING_SLOTS = 3  # buffers in the ring
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


class WeightMismatchError(LoadError):
    """A weight resource lacks a declared buffer, holds it with another dtype or shape, or is not
    a well-formed safetensors file."""


class StoredTensor(NamedTuple):
    """One tensor of a safetensors header: its bytes are data[begin:end] (after the header)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


class WantedTensor(NamedTuple):
    """What the manifest declares for a weight buffer filled from this resource."""

    dtype: torch.dtype
    shape: tuple[int, ...]


def _stored_tensor(name: str, entry) -> StoredTensor:
    try:
        dtype = _DTYPES[entry["dtype"]]
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        valid = all(type(d) is int and d >= 0 for d in (*shape, begin, end))
    except (KeyError, TypeError, ValueError):
        raise WeightMismatchError(f"safetensors entry {name!r} is malformed or has an unknown dtype") from None
    if not valid or end - begin != math.prod(shape) * dtype.itemsize:
        raise WeightMismatchError(f"safetensors entry {name!r}: its byte range does not fit its shape")
    return StoredTensor(name, dtype, shape, begin, end)


def parse_header(header: bytes, data_nbytes: int) -> tuple[StoredTensor, ...]:
    """The tensors of a safetensors header, in file order; they must tile `data_nbytes` exactly."""
    try:
        entries = json.loads(header)
    except (UnicodeDecodeError, ValueError):
        raise WeightMismatchError("the safetensors header is not JSON") from None
    if not isinstance(entries, dict):
        raise WeightMismatchError("the safetensors header is not a JSON object")
    tensors = sorted(
        (_stored_tensor(name, entry) for name, entry in entries.items() if name != "__metadata__"),
        key=lambda t: (t.begin, t.end),
    )
    position = 0
    for tensor in tensors:
        if tensor.begin != position:
            raise WeightMismatchError(f"safetensors tensor {tensor.name!r} leaves a gap or overlaps")
        position = tensor.end
    if position != data_nbytes:
        raise WeightMismatchError("the safetensors tensors do not end where the resource ends")
    return tuple(tensors)


def read_header(stream: BinaryIO, decoded_nbytes: int) -> tuple[StoredTensor, ...]:
    """Reads and checks the header at the front of `stream` (a resource of `decoded_nbytes`)."""
    if decoded_nbytes < 8:
        raise WeightMismatchError("the weights resource is too short for a safetensors header")
    prefix = bytearray(8)
    read_exact_into(stream, prefix)
    header_nbytes = int.from_bytes(prefix, "little")
    if header_nbytes > min(MAX_HEADER_NBYTES, decoded_nbytes - 8):
        raise WeightMismatchError(f"the safetensors header claims {header_nbytes} bytes")
    header = bytearray(header_nbytes)
    read_exact_into(stream, header)
    return parse_header(bytes(header), decoded_nbytes - 8 - header_nbytes)


def check_wanted(resource_id: str, stored: tuple[StoredTensor, ...], wanted: Mapping[str, WantedTensor]) -> None:
    """Every wanted tensor is stored, with the declared dtype and shape (before anything decodes)."""
    by_name = {tensor.name: tensor for tensor in stored}
    for name, want in wanted.items():
        tensor = by_name.get(name)
        if tensor is None:
            raise WeightMismatchError(f"weight resource {resource_id!r} lacks {name!r}")
        if tensor.dtype != want.dtype or tensor.shape != want.shape:
            raise WeightMismatchError(
                f"weight {name!r} is {tensor.shape} {tensor.dtype}; the manifest declares {want.shape} {want.dtype}"
            )


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a flat uint8 tensor sharing its memory."""
    return tensor.reshape(-1).view(torch.uint8)


class HostFiller:
    """Decodes each tensor directly into a fresh CPU tensor (which the caller then owns). Stateless."""

    def fill(self, stream: BinaryIO, tensor: StoredTensor) -> torch.Tensor:
        target = torch.empty(tensor.shape, dtype=tensor.dtype)
        if target.numel():
            read_exact_into(stream, byte_view(target).numpy())
        return target

    def finish(self) -> None:
        pass


class StagedCopier:
    """Decodes into a ring of host buffers and copies each to `device` while the next decodes.

    For CUDA the buffers are pinned and copies are `non_blocking` on the device's current stream;
    a buffer is reused only after the event recorded behind its copy completed. On the CPU (tests)
    the same code runs with ordinary buffers and synchronous copies. Owns its buffers; `finish`
    waits for every copy, after which the returned tensors are complete.
    """

    def __init__(self, device: torch.device, slot_nbytes: int | None = None, num_slots: int | None = None):
        self._device = device
        self._is_cuda = device.type == "cuda"
        slot_nbytes, num_slots = slot_nbytes or STAGING_SLOT_NBYTES, num_slots or STAGING_SLOTS
        self._slots = [torch.empty(slot_nbytes, dtype=torch.uint8, pin_memory=self._is_cuda) for _ in range(num_slots)]
        self._events: list = [None] * num_slots
        self._next = 0

    def _slot(self) -> tuple[int, torch.Tensor]:
        index = self._next
        self._next = (index + 1) % len(self._slots)
        if self._events[index] is not None:
            self._events[index].synchronize()  # its previous copy has left the buffer
            self._events[index] = None
        return index, self._slots[index]

    def fill(self, stream: BinaryIO, tensor: StoredTensor) -> torch.Tensor:
        target = torch.empty(tensor.shape, dtype=tensor.dtype, device=self._device)
        flat = byte_view(target)
        for start in range(0, flat.numel(), self._slots[0].numel()):
            index, slot = self._slot()
            count = min(slot.numel(), flat.numel() - start)
            read_exact_into(stream, slot[:count].numpy())
            flat[start:start + count].copy_(slot[:count], non_blocking=self._is_cuda)
            if self._is_cuda:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(self._device))
                self._events[index] = event
        return target

    def finish(self) -> None:
        for index, event in enumerate(self._events):
            if event is not None:
                event.synchronize()
                self._events[index] = None


def _skip(stream: BinaryIO, nbytes: int) -> None:
    scratch = bytearray(min(nbytes, _SCRATCH_NBYTES))
    while nbytes:
        count = min(nbytes, len(scratch))
        read_exact_into(stream, memoryview(scratch)[:count])
        nbytes -= count


def load_safetensors_stream(
    stream: BinaryIO,
    decoded_nbytes: int,
    resource_id: str,
    wanted: Mapping[str, WantedTensor],
    filler: HostFiller | StagedCopier,
) -> dict[str, torch.Tensor]:
    """The wanted tensors of the weights resource `stream` (see the module docstring).

    Reads `stream` to its end; does not close it. Raises `WeightMismatchError` for a header that is
    malformed or disagrees with `wanted`, and the core's typed errors for bad stored bytes.
    """
    stored = read_header(stream, decoded_nbytes)
    check_wanted(resource_id, stored, wanted)
    tensors = {}
    for tensor in stored:
        if tensor.name in wanted:
            tensors[tensor.name] = filler.fill(stream, tensor)
        else:
            _skip(stream, tensor.end - tensor.begin)
    expect_end(stream)
    filler.finish()
    return tensors


def load_workers(resources: int) -> int:
    """Threads that decode weights resources side by side: one per resource, all CPUs but two (the
    loading thread builds the programs meanwhile), at least 1, at most 16; each frame decodes on
    one core and zstd, SHA-256 and the copies release the GIL. (Half the CPUs, at most 8, while
    program deserialization took a core's worth of Python for as long as the weights: 8 threads
    took 12.6 s for the 8B core's 32 parts, about 160 MB/s each.)"""
    return max(1, min(resources, 16, (os.cpu_count() or 2) - 2))


class _Fillers:
    """One filler per worker thread, made on first use and reused (pinned staging is costly to
    allocate); `finish` is called by the task that used it. Thread-safe."""

    def __init__(self, device: torch.device):
        self._device, self._free = device, queue.SimpleQueue()

    @contextlib.contextmanager
    def borrow(self):
        try:
            filler = self._free.get_nowait()
        except queue.Empty:
            filler = StagedCopier(self._device) if self._device.type != "cpu" else HostFiller()
        try:
            yield filler
        finally:
            self._free.put(filler)


def load_weight_resources(
    open_resource: Callable[[str], BinaryIO],
    resources: Mapping[str, tuple[int, Mapping[str, WantedTensor]]],
    device: torch.device,
    workers: int | None = None,
) -> dict[str, torch.Tensor]:
    """The wanted tensors of every weights resource (resource id -> (decoded bytes, wanted)), the
    resources decoded side by side on `workers` threads (`load_workers`), each straight into its
    tensors (`load_safetensors_stream`). The tensors do not depend on the thread count; the first
    failing resource's error is raised after every task ended."""
    fillers = _Fillers(device)

    def one(resource_id: str) -> dict[str, torch.Tensor]:
        decoded_nbytes, wanted = resources[resource_id]
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            with fillers.borrow() as filler, open_resource(resource_id) as stream:
                return load_safetensors_stream(stream, decoded_nbytes, resource_id, wanted, filler)

    count = workers or load_workers(len(resources))
    if count <= 1 or len(resources) <= 1:
        return {name: tensor for resource_id in resources for name, tensor in one(resource_id).items()}
    with ThreadPoolExecutor(count, thread_name_prefix="helios-weights-part") as pool:
        futures = [pool.submit(one, resource_id) for resource_id in resources]
        errors = [future.exception() for future in futures]
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
    return {name: tensor for future in futures for name, tensor in future.result().items()}
